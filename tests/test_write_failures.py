"""A write that fails part way through a record (disk full, an interrupt) must leave no stray
bytes, and a writer that cannot undo it must refuse to go on rather than commit a bad file."""

from __future__ import annotations

import errno

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.physical import plain, zstd_legacy, zstd_sink


def failing_writes(monkeypatch, fail_at: int, partial: bool = False) -> None:
    """Make the ``fail_at``-th write of record data (1-based) fail with ENOSPC, after
    writing half of it if ``partial``; every other write goes through."""
    real = plain.pwrite_all
    calls = {"n": 0}

    def pwrite_all(fd, data, offset):
        calls["n"] += 1
        if calls["n"] == fail_at:
            if partial:
                real(fd, memoryview(data)[: len(data) // 2], offset)
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        return real(fd, data, offset)

    for module in (plain, zstd_sink, zstd_legacy):  # every sink writes through it
        monkeypatch.setattr(module, "pwrite_all", pwrite_all)


def test_plain_writer_forgets_a_half_written_big_record(tmp_path, monkeypatch):
    path = tmp_path / "p.evs"
    with evs.Writer(path) as w:
        w.append([np.arange(10)])
        w.commit()
        w.append([np.arange(3)])  # buffered: flushed before the big record's direct write
        failing_writes(monkeypatch, fail_at=2, partial=True)
        with pytest.raises(OSError, match="simulated"):
            w.append([np.zeros(3 << 20, np.uint8)])
        monkeypatch.undo()
        w.append([np.arange(5)])
    with evs.open(path) as ds:
        assert [r[0].tolist() for r in ds] == [list(range(10)), [0, 1, 2], list(range(5))]
        report = ds.verify()
        assert report.ok and report.uncommitted_bytes == 0, report


def test_plain_writer_forgets_a_record_whose_one_direct_write_failed_half_way(
    tmp_path, monkeypatch
):
    """A record whose first piece is itself a direct write (a 2 MiB string): its half
    written bytes lie past every position the sink counted, and are cut all the same."""
    path = tmp_path / "p.evs"
    with evs.Writer(path) as w:
        w.append([np.arange(10)])
        w.commit()
        size = path.stat().st_size
        failing_writes(monkeypatch, fail_at=1, partial=True)
        with pytest.raises(OSError, match="simulated"):
            w.append(["x" * (2 << 20)])
        monkeypatch.undo()
        assert path.stat().st_size <= -(-size // 64) * 64  # the alignment padding at most
        w.append([np.arange(5)])
    with evs.open(path) as ds:
        assert [r[0].tolist() for r in ds] == [list(range(10)), list(range(5))]
        report = ds.verify()
        assert report.ok and report.uncommitted_bytes == 0, report


@pytest.mark.parametrize(("fail_at", "undone"), [(1, True), (2, True), (3, False)])
def test_compressed_writer_that_cannot_undo_keeps_the_last_commit(
    tmp_path, monkeypatch, fail_at, undone
):
    """Writing a 3 MiB record first closes the open frame (write 1: the small record), then
    compresses it in 1 MiB frames (writes 2, 3...). A failure at write 1 or 2 leaves nothing
    of the record in the file, so the writer goes on; at write 3 its first frame is already
    written, so the writer stops and close() keeps the last commit."""
    path = tmp_path / "z.evs.zst"
    w = evs.Writer(path, compression="zstd")
    w.append([np.arange(10)])
    w.commit()
    w.append([np.arange(3)])
    failing_writes(monkeypatch, fail_at=fail_at)
    with pytest.raises(OSError, match="simulated"):
        w.append([np.zeros(3 << 20, np.uint8)])
    monkeypatch.undo()
    if undone:
        w.append([np.arange(5)])
        w.close()
        expected = [list(range(10)), [0, 1, 2], list(range(5))]
    else:
        with pytest.raises(ValueError, match="failed part way.*reopen the file with mode='a'"):
            w.append([np.arange(5)])
        with pytest.raises(ValueError, match="failed part way"):
            w.close()
        expected = [list(range(10))]  # the last commit; what came after it is discarded
    with evs.open(path) as ds:
        assert [r[0].tolist() for r in ds] == expected
        report = ds.verify()
        assert report.ok and report.uncommitted_bytes == 0, report
    with evs.Writer(path, "a") as w:  # and the file takes appends again
        w.append([np.arange(2)])
    with evs.open(path) as ds:
        assert len(ds) == len(expected) + 1 and ds.verify().ok
