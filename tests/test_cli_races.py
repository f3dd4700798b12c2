"""Black-box attacks on the `evalue-store` command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

import evalue_store as evs


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "evalue_store", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait_for_partial(folder, proc, timeout=60.0) -> None:
    """Until the command has started writing its OUT.<pid>-<random>.partial file."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(name.endswith(".partial") for name in os.listdir(folder)):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    raise AssertionError("no .partial file appeared")


def test_copy_over_its_own_input_does_not_drop_a_commit_made_during_the_copy(tmp_path):
    """CLI.md: "`copy` ... may write over their own input with `--force`: the input is read in
    full before the new file replaces it", "--force never replaces a file a running writer
    holds" (checked "before the work and again at the rename"), and the project rule
    "Committed data is never lost".

    A writer that opens the file while `copy F -o F --force` is running, commits and closes,
    is neither refused nor kept: the rename puts the older snapshot over its commit, which
    is gone without a word. (Holding F's lock for the whole run would refuse the writer.)
    """
    path = tmp_path / "F.evs"
    with evs.Writer(path, "w") as w:
        for i in range(20_000):
            w.append([i, np.arange(64)])
    proc = _cli("copy", str(path), "-o", str(path), "--force", "-q")
    _wait_for_partial(tmp_path, proc)
    refused = False
    try:
        with evs.Writer(path, "a") as w:
            w.append(["committed while the copy ran"])
    except evs.WriterLockedError:
        refused = True
    out, err = proc.communicate(timeout=120)
    ds = evs.open(path)
    if not refused:
        assert ds[len(ds) - 1] == ["committed while the copy ran"], (
            f"a commit that returned was lost; copy said: {out!r} {err!r}, {len(ds)} records"
        )


def test_copy_to_an_existing_out_does_not_drop_a_commit_made_during_the_copy(tmp_path):
    """Same with a separate OUT that exists: a writer that appends to OUT during the copy and
    closes before the rename loses its commit to the replacement, although `--force` is
    said to never replace a file a running writer holds (it ran during the copy)."""
    src = tmp_path / "src.evs"
    out_path = tmp_path / "out.evs"
    with evs.Writer(src, "w") as w:
        for i in range(20_000):
            w.append([i, np.arange(64)])
    with evs.Writer(out_path, "w") as w:
        w.append(["old"])
    proc = _cli("copy", str(src), "-o", str(out_path), "--force", "-q")
    _wait_for_partial(tmp_path, proc)
    refused = False
    try:
        with evs.Writer(out_path, "a") as w:
            w.append(["committed while the copy ran"])
    except evs.WriterLockedError:
        refused = True
    proc.communicate(timeout=120)
    assert refused or proc.returncode != 0, (
        "the copy replaced a file that a writer opened, appended to and committed during the copy"
    )


def _limit_file_size():
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_a_full_disk_is_reported_against_the_output_not_the_input(tmp_path):
    """CLI.md: "Errors are one line on stderr, `evalue-store: FILE: problem`".

    When OUT cannot be written (disk full, quota; here a 1 MiB RLIMIT_FSIZE, which gives the
    EFBIG that a quota gives), `copy` and `export` blame their *input*
    ("evalue-store: big.evs: File too large" / "No space left on device"), which sends the user
    off to check a file that is fine; `merge` names no file at all."""
    src = tmp_path / "big.evs"
    with evs.Writer(src, "w") as w:
        for i in range(40):
            w.append([i, np.full(20000, i)])
    out = tmp_path / "out.evs"
    cases = {
        "copy": ["copy", str(src), "-o", str(out)],
        "merge": ["merge", str(src), str(src), "-o", str(out)],
        "export": ["export", str(src), "--to", str(tmp_path / "exp"), "--format", "jsonl"],
    }
    wrong = {}
    for name, args in cases.items():
        p = subprocess.run(
            [sys.executable, "-m", "evalue_store", *args],
            capture_output=True,
            text=True,
            preexec_fn=_limit_file_size,
        )
        assert p.returncode == 2, (name, p.returncode, p.stderr)
        line = p.stderr.strip()
        named = str(tmp_path / "exp") if name == "export" else str(out)
        if named not in line:
            wrong[name] = line
    assert not wrong, f"the failing output is not named: {wrong}"


def test_a_killed_pack_append_leaves_the_old_file_so_a_retry_adds_each_record_once(tmp_path):
    """README: "An output appears under its name only when complete (a failed, interrupted or
    killed run leaves the old file or none)"; CLI.md: SIGKILL leaves "the *.partial file
    behind, never anything under OUT's name".

    `pack --append` writes its records into OUT itself; killed, it leaves them there as an
    uncommitted tail, and the retry (or any later `Writer(OUT, "a")`) salvages and commits
    them before appending everything again: OUT ends with the killed run's records twice
    (the retry only notes "salvaged N records of a crashed writer first", exit 0)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(200):
        np.save(src / f"{i:04d}.npy", np.full(30_000, i, np.int64))
    out = tmp_path / "out.evs"
    with evs.Writer(out, "w") as w:
        w.append([-1])
    committed = os.path.getsize(out)
    proc = _cli("pack", str(src), "-o", str(out), "--append", "-q")

    def written() -> int:  # into OUT or into a temporary file beside it
        return sum(os.path.getsize(p) for p in tmp_path.glob("out.evs*"))

    while written() < committed + 5_000_000 and proc.poll() is None:
        time.sleep(0.005)
    assert proc.poll() is None, "the pack ended before it could be killed"
    proc.kill()
    proc.wait()
    assert len(evs.open(out)) == 1  # the killed run committed nothing
    retry = subprocess.run(
        [sys.executable, "-m", "evalue_store", "pack", str(src), "-o", str(out), "--append"],
        capture_output=True,
        text=True,
    )
    assert retry.returncode == 0, retry.stderr
    ds = evs.open(out)
    firsts = [int(np.asarray(ds[i][0]).flat[0]) for i in range(len(ds))]
    assert firsts == [-1, *range(200)], (
        f"{len(ds)} records, expected 201; retry said: {retry.stderr.strip()}"
    )


def test_deeply_nested_metadata_argument_is_a_one_line_usage_error(tmp_path):
    """README: "Exit codes: 0 ok, 1 data problems found, 2 usage error or unreadable input;
    errors are one line, no traceback". `pack --metadata` with 2,000 nested brackets (a
    valid JSON object) prints a full RecursionError traceback and exits 1."""
    src = tmp_path / "a.npy"
    np.save(src, np.arange(3))
    md = '{"a": ' + "[" * 2000 + "]" * 2000 + "}"
    p = subprocess.run(
        [sys.executable, "-m", "evalue_store", "pack", str(src), "-o", str(tmp_path / "o.evs")]
        + ["--metadata", md],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2, (p.returncode, p.stderr[-300:])
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr[-300:]
