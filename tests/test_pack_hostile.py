"""Black-box attacks on `evalue-store pack` with hostile inputs."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zipfile

import pytest


def _npy(shape: tuple, descr: str = "<f8", body: bytes = b"\0" * 64) -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    header += " " * (118 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + body


def _pack_limited(src, out) -> subprocess.CompletedProcess:
    """Run pack with its address space capped 512 MiB above a fresh interpreter's."""
    script = (
        "import resource, sys\n"
        "from evalue_store.cli import main\n"
        "pages = int(open('/proc/self/statm').read().split()[0])\n"
        "cap = pages * 4096 + (512 << 20)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (cap, cap))\n"
        f"sys.exit(main(['pack', {str(src)!r}, '-o', {str(out)!r}]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("kind", ["npy", "npz"])
def test_pack_does_not_allocate_what_an_npy_header_claims(tmp_path, kind):
    """Project rule (and THREAT_MODEL's spirit): bad input "never crashes, hangs, or allocates
    what a header merely claims: it raises a clear error ... naming what is wrong and where";
    CLI.md: "An input pack cannot read is named with what is wrong with it ... and nothing is
    written".

    A 190-byte .npy (or an .npz holding it) whose header claims 2^30 float64 elements makes
    pack allocate the 8 GiB first: "evalue-store: internal error MemoryError: Unable to
    allocate 8.00 GiB ..." (no file named), or, without a memory limit, 8 GiB of address
    space for 64 bytes of data."""
    src = tmp_path / "in"
    src.mkdir()
    data = _npy((1 << 30,))
    if kind == "npy":
        (src / "a.npy").write_bytes(data)
    else:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("x.npy", data)
        (src / "a.npz").write_bytes(buf.getvalue())
    p = _pack_limited(src, tmp_path / "o.evs")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "internal error" not in p.stderr and "MemoryError" not in p.stderr, p.stderr
    assert f"a.{kind}" in p.stderr, p.stderr
    assert not (tmp_path / "o.evs").exists()


def test_pack_names_a_jsonl_line_nested_too_deep(tmp_path):
    """CLI.md: "Objects, lists mixing bools and numbers, or lists holding strings or null are
    errors naming the file, line and value"; "An input pack cannot read is named with what
    is wrong with it". A line of 100,000 nested brackets gives "evalue-store: internal error
    RecursionError: ..." instead, naming neither the file nor the line."""
    src = tmp_path / "deep.jsonl"
    src.write_text("[1]\n[" + "[" * 100_000 + "]" * 100_000 + "]\n")
    p = subprocess.run(
        [sys.executable, "-m", "evalue_store", "pack", str(src), "-o", str(tmp_path / "o.evs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "internal error" not in p.stderr and "RecursionError" not in p.stderr, p.stderr
    assert "deep.jsonl" in p.stderr and "line 2" in p.stderr, p.stderr


def _limit_memory() -> None:
    """preexec_fn: 2 GiB of address space, so that a read without end fails fast."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _pack(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "evalue_store", "pack", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
    )


@pytest.mark.parametrize("name", ["z.bin", "z.jsonl"])
def test_pack_refuses_a_device_input(tmp_path, name):
    """CLI.md: "An input pack cannot read is named with what is wrong with it"; info and
    copy refuse what is not a regular file. pack of z.bin (or z.jsonl), a link to /dev/zero,
    read without end instead: "internal error MemoryError" under a 2 GiB address limit, the
    OOM killer without one. It is refused on the opened descriptor, before any read."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    os.symlink("/dev/zero", tmp_path / name)
    p = _pack(tmp_path, name, "-o", "x.evs")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert f"{name}: cannot read: not a regular file (a device)" in p.stderr, p.stderr
    assert "internal error" not in p.stderr
    assert sorted(os.listdir(tmp_path)) == [name]


@pytest.mark.parametrize("name", ["a.jsonl", "a.npz", "a.npy", "a.bin"])
def test_pack_refuses_a_fifo_input_without_waiting(tmp_path, name):
    """info, copy and verify refuse a FIFO at once ("not a regular file (a FIFO)", exit 2);
    pack of a FIFO named a.jsonl (.npz, .npy, .bin) waited in open() forever for a writer."""
    os.mkfifo(tmp_path / name)
    p = _pack(tmp_path, name, "-o", "x.evs")  # a hang ends in TimeoutExpired
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert f"{name}: cannot read: not a regular file (a FIFO)" in p.stderr, p.stderr
    assert sorted(os.listdir(tmp_path)) == [name]


def test_pack_opens_an_input_without_waiting_and_checks_what_it_opened(tmp_path):
    """The refusal holds on the opened descriptor too (a file swapped for a FIFO after the
    folder walk): open_input opens with O_NONBLOCK, so a FIFO cannot block it."""
    os.mkfifo(tmp_path / "a.npz")
    script = (
        "import sys\n"
        "from evalue_store.cli.inputs import open_input\n"
        "from evalue_store.cli.render import CliError\n"
        "try:\n"
        "    with open_input(sys.argv[1]): pass\n"
        "except CliError as exc:\n"
        "    print(exc.where, exc.message)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "a.npz")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "a.npz cannot read: not a regular file (a FIFO)" in p.stdout, (p.stdout, p.stderr)


def test_pack_folder_walk_names_what_it_skips_truly(tmp_path):
    """The folder walk skipped a FIFO named a.npz with the note "skipped 1 file not
    .npz/.npy/...", which it is by name; it is skipped because it is not a regular file."""
    src = tmp_path / "in"
    src.mkdir()
    os.mkfifo(src / "a.npz")
    (src / "r.jsonl").write_text("[1]\n")
    (src / "notes.txt").write_text("")
    p = _pack(tmp_path, "in", "-o", "x.evs")
    assert p.returncode == 0, p.stderr
    assert "skipped 1 file not .npz/" in p.stderr, p.stderr  # notes.txt
    assert f"skipped 1 file not regular ({os.path.join('in', 'a.npz')}: a FIFO)" in p.stderr


@pytest.mark.parametrize("version", [b"\x02\x00", b"\x03\x00"], ids=["2.0", "3.0"])
@pytest.mark.parametrize("kind", ["npy", "npz"])
def test_pack_does_not_allocate_what_an_npy_header_length_claims(tmp_path, version, kind):
    """A 13-byte .npy of format 2.0 (or 3.0) whose header-length field says 0xffffffff made
    numpy allocate 4 GiB for the header before reading it: "internal error MemoryError"
    under a 2 GiB address limit, naming nothing. The same bytes in an .npz already got
    "cannot read: EOF: ..."; both now name the file and the claim."""
    data = b"\x93NUMPY" + version + struct.pack("<I", 0xFFFFFFFF) + b"{"
    if kind == "npy":
        (tmp_path / "hlen.npy").write_bytes(data)
    else:
        with zipfile.ZipFile(tmp_path / "hlen.npz", "w") as z:
            z.writestr("x.npy", data)
    p = _pack(tmp_path, f"hlen.{kind}", "-o", "x.evs")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "internal error" not in p.stderr, p.stderr
    assert f"hlen.{kind}: cannot read: " in p.stderr, p.stderr
    assert "header length field says 4,294,967,295 bytes; there are 1 after it" in p.stderr
    assert sorted(os.listdir(tmp_path)) == [f"hlen.{kind}"]
