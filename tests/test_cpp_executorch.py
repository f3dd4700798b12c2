"""The C++ reader feeding ExecuTorch's runtime (issue 15 item 2): a C++ program linked
against the executorch wheel's libexecutorch.so trains ExecuTorch's XOR training program
(exported here, at test time) from a container Python wrote, tensors wrapped in place on the
file mapping (cpp/include/evalue_store/executorch.h), and a static-batch program (the 32x32
MLP) from batches of records gathered with the reader. The programs come from
tests/et_programs.py, shared with the Python training tests."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from tests import native
from tests.et_programs import export_model, export_xor, mlp_examples, xor_examples


@pytest.fixture(scope="session")
def xor_program(tmp_path_factory) -> Path:
    return export_xor(tmp_path_factory.mktemp("xor") / "xor.pte")  # tests/et_programs.py


@pytest.fixture(scope="session")
def train_xor() -> Path:
    return native.build_executorch() / "train_xor"


@pytest.fixture(scope="session")
def train_batches() -> Path:
    return native.build_executorch() / "train_batches"


def xor_container(path: Path, n: int = 1000) -> None:
    """XOR examples as an Android app builds them: [x float32 [1, 2], y int64 [1]]."""
    with evs.Writer(path) as w:
        w.extend(xor_examples(n, leading_one=True))


def run(train_xor: Path, program: Path, data: Path, *extra: str) -> tuple[list[float], float]:
    done = subprocess.run(
        [str(train_xor), str(program), str(data), "4000", "0.5", *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert lines[-2].startswith("steps_per_s ")
    return [float(x) for x in lines[:-2]], float(lines[-2].split()[1])


def test_cpp_trains_the_xor_program_from_a_container(tmp_path, xor_program, train_xor):
    data = tmp_path / "xor.evs"
    xor_container(data)
    losses, _ = run(train_xor, xor_program, data)
    assert len(losses) == 4000
    first, last = np.mean(losses[:200]), np.mean(losses[-200:])
    assert first > 0.5 and last < 0.1, (first, last)
    # Fed from process memory in the same order, the run is bit for bit the same.
    memory, _ = run(train_xor, xor_program, data, "memory")
    assert memory == losses
    # And so is ExecuTorch's own Python training loop (TrainingModule + its SGD) over the
    # same records: the C++ loop (its SGD included) computes what ExecuTorch does.
    assert np.array_equal(np.float32(losses), python_losses(xor_program, data, 4000, 0.5))


def python_losses(program: Path, data: Path, steps: int, lr: float) -> np.ndarray:
    import torch
    from executorch.extension.training import (
        _load_for_executorch_for_training,
        get_sgd_optimizer,
    )

    module = _load_for_executorch_for_training(str(program))
    optimizer = None
    losses = []
    with evs.open(data) as ds:
        for step in range(steps):
            x, y = ds[step % len(ds)]
            out = module.forward_backward("forward", [torch.tensor(x), torch.tensor(y)])
            losses.append(out[0].item())
            if optimizer is None:  # parameters exist once forward_backward has run
                optimizer = get_sgd_optimizer(module.named_parameters(), lr, 0, 0, 0, False)
            optimizer.step(module.named_gradients())
    return np.float32(losses)


def test_training_refuses_a_damaged_container_with_its_error(tmp_path, xor_program, train_xor):
    data = tmp_path / "xor.evs"
    xor_container(data, 10)
    blob = bytearray(data.read_bytes())
    with evs.open(data) as ds:
        at = int(ds.entries()["offset"][3]) + 40  # inside record 3's payload
    blob[at] ^= 1
    data.write_bytes(blob)
    done = subprocess.run(
        [str(train_xor), str(xor_program), str(data), "8", "0.5"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "record checksum mismatch (record 3" in done.stderr


def run_batches(train_batches: Path, program: Path, data: Path, steps: int, *extra: str):
    """cpp/examples/train_batches.cc's losses, and its process (for stderr and the code)."""
    done = subprocess.run(
        [str(train_batches), str(program), str(data), str(steps), "0.1", *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.split("\n")
    if done.returncode == 0:
        tail = [line.split()[0] for line in lines[-4:-1]]
        assert tail == ["steps_per_s", "cpu_steps_per_s", "feed_ns_per_record"], tail
        return [float(x) for x in lines[:-4]], done
    return None, done


def test_cpp_trains_the_mlp_on_batches_read_from_a_container(tmp_path, train_batches):
    program = export_model(tmp_path / "mlp.pte", "mlp", batch=32)  # float32 [32, 32, 32]
    data = tmp_path / "mlp.evs"
    with evs.Writer(data) as w:
        w.extend(mlp_examples(200))  # 6 batches an epoch: 24 steps reshuffle 4 times
    losses, done = run_batches(train_batches, program, data, 24)
    assert losses is not None, done.stderr[-3000:]
    assert len(losses) == 24
    first, last = losses[0], np.mean(losses[-4:])  # ln(10) = 2.30 at a fresh start
    assert first > 2.0 and last < 0.5, (first, last)
    # The same batches gathered from in-memory arrays: the same run, bit for bit.
    memory, done = run_batches(train_batches, program, data, 24, "memory")
    assert memory == losses, done.stderr[-3000:]


def test_batches_that_do_not_fit_the_program_name_the_record(tmp_path, xor_program, train_batches):
    wrong_dtype = xor_examples(12, leading_one=True)
    wrong_dtype[5][0] = wrong_dtype[5][0].astype(np.float64)
    wrong_label = xor_examples(12, leading_one=True)
    wrong_label[9][1] = "one"
    expected = [
        (wrong_dtype, "record 5, field 0: want a row-major float32 tensor of one example's shape"),
        (wrong_label, "record 9, field 1: want an Int or an int64 tensor of one element"),
    ]
    for records, message in expected:
        data = tmp_path / "bad.evs"
        with evs.Writer(data, mode="w") as w:
            w.extend(records)
        for mode in ((), ("memory",)):  # met in the epoch's order / read up front
            _, done = run_batches(train_batches, xor_program, data, 12, *mode)  # batch 1
            assert (done.returncode, done.stderr[-len(message) - 1 :]) == (1, message + "\n")


def test_bad_steps_or_rate_are_refused_with_one_line(tmp_path, xor_program, train_batches):
    """STEPS of -1 or 10^18 aborted the example with std::length_error (it reserved that
    many losses; attacker's remark, session 12, eleventh run); now one line, exit 1."""
    data = tmp_path / "x.evs"
    with evs.Writer(data) as w:
        w.extend(xor_examples(4, leading_one=True))
    for steps, rate, message in (
        ("-1", "0.1", "STEPS must be a whole number from 1 to 10^9, not '-1'"),
        ("1000000000000000000", "0.1", "STEPS must be a whole number from 1 to 10^9"),
        ("2x", "0.1", "STEPS must be a whole number from 1 to 10^9, not '2x'"),
        ("2", "nan", "LR must be a finite number, not 'nan'"),
    ):
        cmd = [str(train_batches), str(xor_program), str(data), steps, rate]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and message in done.stderr, done.stderr[-500:]
        assert done.stderr.count("\n") == 1


ROOT = Path(__file__).resolve().parents[1]


def test_readme_executorch_path_runs_as_written(tmp_path, monkeypatch):
    """README's "Training on device with ExecuTorch": its commands and code, in order, in a
    fresh directory (paths into the clone made absolute): export, pack, check and train in
    Python, then build the C++ trainer with the README's g++ line and train from the file."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Training on device with ExecuTorch")
    section = readme[start : readme.index("\n## ", start)]
    blocks = re.findall(r"```(console|python)\n(.*?)```", section, re.S)
    assert [kind for kind, _ in blocks] == ["console", "python", "console"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    monkeypatch.chdir(tmp_path)
    outputs = []
    for kind, body in blocks:
        if kind == "python":
            scope: dict = {}
            exec(compile(body, "README", "exec"), scope)
            assert np.mean(scope["losses"][-16:]) < 0.1
            continue
        script = re.sub(r"\\\n\s*", " ", body)  # continuation lines
        commands = [line[2:] for line in script.splitlines() if line.startswith("$ ")]
        script = "set -eo pipefail\n" + "\n".join(commands).replace("cpp/", f"{ROOT}/cpp/")
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout)
    last_loss, speed, cpu, feed = outputs[-1].splitlines()
    assert float(last_loss) < 0.1
    assert speed.startswith("steps_per_s ") and cpu.startswith("cpu_steps_per_s ")
    assert feed.startswith("feed_ns_per_record ")
