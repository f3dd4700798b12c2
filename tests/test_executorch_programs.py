"""Damaged and mismatched ExecuTorch programs against the real runtime: every one is a
ValueError (the CLI's exit 2 with one line), never a crash of the process. Calls that
killed the interpreter before their fix run in a subprocess."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

import evalue_store as evs
from evalue_store.executorch import read_method_inputs
from tests.et_programs import export_xor, xor_examples

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def xor4(tmp_path_factory) -> str:
    """The XOR program with a static batch of 4."""
    return str(export_xor(tmp_path_factory.mktemp("pte") / "xor4.pte", batch=4))


@pytest.fixture(scope="module")
def xor_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "xor.evs"
    with evs.Writer(path) as w:
        w.extend(xor_examples(16, seed=1))
    return str(path)


def damaged(good: str, path: Path, seed: int, flips: int = 20) -> str:
    """``good`` with ``flips`` bytes inverted at random places (past its identifier)."""
    data = bytearray(Path(good).read_bytes())
    rng = random.Random(seed)
    for _ in range(flips):
        data[rng.randrange(8, len(data))] ^= 0xFF
    path.write_bytes(bytes(data))
    return str(path)


def run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter using this checkout's package."""
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def test_a_program_without_its_identifier_is_refused_not_aborted(xor4, xor_file, tmp_path):
    """Bytes 4..8 not UTF-8: read_method_inputs, bind and `verify --pte` raise / exit 2
    with one line (ExecuTorch's log of the identifier raised inside the runtime and the
    process died of SIGABRT)."""
    data = bytearray(Path(xor4).read_bytes())
    data[4:8] = b"\xfa\xfb\xfc\xfd"
    bad = tmp_path / "noid.pte"
    bad.write_bytes(bytes(data))
    code = f"""
from evalue_store.executorch import bind, read_method_inputs
for call in (lambda: read_method_inputs({str(bad)!r}), lambda: bind({xor_file!r}, {str(bad)!r})):
    try:
        call()
    except ValueError as exc:
        print("ValueError:", exc)
from evalue_store.cli import main
raise SystemExit(main(["verify", {xor_file!r}, "--pte", {str(bad)!r}]))
"""
    proc = run(code)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    said = [line for line in proc.stdout.splitlines() if line.startswith("ValueError:")]
    assert len(said) == 2 and all("not an ExecuTorch program" in line for line in said)
    assert "b'\\xfa\\xfb\\xfc\\xfd'" in said[0]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("evalue-store:")]
    assert errors == [f"evalue-store: {bad}: {said[0].removeprefix('ValueError: ')}"]
    for short in (b"", data[:7], bytes(data[:4]) + b"ET12"):
        with pytest.raises(ValueError, match="not an ExecuTorch program"):
            read_method_inputs(bytes(short))


def test_a_damaged_program_is_a_value_error(xor4, xor_file, tmp_path, capsys):
    """Flipped bytes that ExecuTorch's verification catches: a ValueError naming its
    refusal, and exit 2 with one line from `verify --pte` (it was a bare RuntimeError)."""
    from evalue_store.cli import main

    bad = damaged(xor4, tmp_path / "d.pte", seed=1)
    with pytest.raises(ValueError, match="ExecuTorch refuses the program"):
        read_method_inputs(bad)
    assert main(["verify", xor_file, "--pte", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"evalue-store: {bad}: ExecuTorch refuses")


def test_trainer_refuses_a_damaged_program_instead_of_crashing(xor4, xor_file, tmp_path):
    """Trainer(damaged.pte, data): a ValueError, as bind gives (the training module was
    loaded without ExecuTorch's program verification, and training from these programs
    died of SIGSEGV); with a binding of the sound program too."""
    rng = random.Random(1)  # the attacker's damaged programs: 20 bytes flipped anywhere
    good = Path(xor4).read_bytes()
    paths = []
    for k in range(5):
        data = bytearray(good)
        for _ in range(20):
            data[rng.randrange(len(data))] ^= 0xFF
        paths.append(tmp_path / f"d{k}.pte")
        paths[-1].write_bytes(bytes(data))
    code = f"""
from evalue_store.executorch import Trainer, bind
data = bind({xor_file!r}, {xor4!r})
for path in {[str(p) for p in paths[3:]]!r}:
    for source in (data, {xor_file!r}):
        try:
            Trainer(path, source, lr=1.0).train(epochs=1)
            print("trained")
        except ValueError as exc:
            print("ValueError:", exc)
"""
    proc = run(code)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("ValueError:") for line in lines), lines
    assert "ExecuTorch refuses the program" in lines[1]  # bound from the damaged program


def test_trainer_refuses_a_binding_of_another_program(xor4, xor_file, tmp_path):
    """Trainer(pte_a, bind(data, pte_b)): a ValueError saying so (ExecuTorch failed with
    "error: 0x10" at the first step); another method or binding options too."""
    from evalue_store.executorch import Trainer, bind

    other = str(export_xor(tmp_path / "xor8.pte", batch=8))
    with pytest.raises(ValueError, match="made for another program than the trainer's"):
        Trainer(xor4, bind(xor_file, other))
    same = export_xor(tmp_path / "copy.pte", batch=4)  # the same bytes under another name
    losses = Trainer(str(same), bind(xor_file, xor4), seed=1).train(epochs=1)
    assert len(losses) == 4
    with pytest.raises(ValueError, match="the binding is of method 'forward'"):
        Trainer(xor4, bind(xor_file, xor4), method="train")
    with pytest.raises(TypeError, match="go to bind"):
        Trainer(xor4, bind(xor_file, xor4), batch_size=4)
