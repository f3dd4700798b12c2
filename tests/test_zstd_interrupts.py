"""Ctrl-C inside a compressed writer's frame bookkeeping, then going on.

A KeyboardInterrupt can surface between any two lines (faults.py). Here it lands while the
writer cuts and writes frames, the caller catches it, appends, commits and closes, as a
training loop that survives Ctrl-C does. The writer may refuse to go on (reopen with mode
"a"); it must never write a commit whose frame map or index describes bytes that are not
where it says (the attacker's B04 and B07: a commit returned, then the file no longer
opened, or scans failed on committed records), nor leave bytes in the padding (B05).
"""

from __future__ import annotations

import shutil

import numpy as np

import evalue_store as evs

from . import faults
from .faults import interrupt_at, interrupt_at_line


def rec(i: int) -> list:
    return [np.arange(128, dtype=np.int64) + i, np.full(16, i, np.float32), i, f"ex-{i:06d}"]


def check(path, committed: int) -> None:
    """The file opens at a commit of at least ``committed`` records, each the one appended
    at its place, and verifies but for an uncommitted tail."""
    with evs.open(path) as ds:
        assert len(ds) >= committed
        report = ds.verify()
        assert [p for p in report.problems if "after the last commit" not in p] == []
        assert report.bad_records == []
        for i in range(len(ds)):
            assert ds[i][2] == i and ds[i][0][0] == i
        assert [r[2] for r in ds] == list(range(len(ds)))


def go_on(writer, path, appended: int, committed: int) -> None:
    """After the interrupt: one more record and a commit (or the writer's refusal), close,
    and check the file (``committed``: records whose commit returned before)."""
    try:
        writer.append(rec(appended))
        writer.commit()
        committed = appended + 1
    except evs.Error:
        pass  # refusing to go on is allowed: reopen with mode "a"
    try:
        writer.close()
    except evs.Error:
        pass
    check(path, committed)


def test_an_interrupted_flush_of_held_frames_then_a_commit_keeps_every_record(tmp_path):
    """A new file holds its first MiB of frames back, then writes them out, one pwrite each,
    from inside an append (B04: an interrupt there let a later commit choose a dictionary
    and rebuild the file without the frames already written)."""

    def trial(path, interrupt):
        writer = evs.Writer(path, compression="zstd", durable=False)
        appended = 0
        with interrupt:
            try:
                for i in range(1200):
                    writer.append(rec(i))
                    appended += 1
            except KeyboardInterrupt:
                pass
        return writer, appended

    calls: list[str] = []
    writer, _ = trial(tmp_path / "count.evs.zst", faults.recorded_calls(calls))
    writer.close()
    pwrites = [n for n, name in enumerate(calls, 1) if name == "pwrite"]
    assert len(pwrites) > 300  # the held frames' among them
    for n in pwrites[len(pwrites) // 3 : 2 * len(pwrites) // 3 : 8]:
        path = tmp_path / f"{n}.evs.zst"
        writer, appended = trial(path, interrupt_at(n, "before"))
        go_on(writer, path, appended, 0)


FRAME_STEPS = {"write", "_emit", "_write_frame", "_emit_frames", "rewind", "_commit_now"}


def test_an_interrupted_commit_of_a_compressed_file_then_a_commit_keeps_every_record(tmp_path):
    """An existing compressed file (mode "a"), 20 records appended, commit() cut before each
    library line of the frame steps (B07: a frame's bookkeeping cut between two of its
    fields; B05: a commit's blocks written, then the interrupt before it was in flight)."""
    base = tmp_path / "base.evs.zst"
    with evs.Writer(base, compression="zstd", durable=False) as writer:
        writer.extend([rec(i) for i in range(30)])

    def trial(path, interrupt):
        shutil.copy(base, path)
        writer = evs.Writer(path, mode="a", durable=False)
        writer.extend([rec(i) for i in range(30, 50)])
        faults.cut_short(writer.commit, interrupt)
        return writer

    lines: list[str] = []
    trial(tmp_path / "count.evs.zst", faults.recorded_lines(lines)).close()
    picks = [n for n, name in enumerate(lines, 1) if name in FRAME_STEPS]
    assert len(picks) > 30
    for n in picks:
        path = tmp_path / f"{n}.evs.zst"
        go_on(trial(path, interrupt_at_line(n)), path, 50, 30)
