"""A durable writer of a plain file asks the kernel to start writing what it wrote every
PlainSink.WRITEBACK_BYTES (files.start_writeback), so that a commit's fsync finds most of
it on the disk already. That never replaces the fsyncs (tests/test_crash_states.py): these
tests hold the requests to what was written, in order, and to durable writers only."""

from __future__ import annotations

import os

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import files
from evalue_store.physical import plain


@pytest.fixture
def requests(monkeypatch) -> list:
    """Every (offset, length) of writeback asked for from now on (the real call is made)."""
    asked: list = []
    real = files.start_writeback

    def start_writeback(fd: int, offset: int, length: int) -> None:
        asked.append((offset, length))
        real(fd, offset, length)

    monkeypatch.setattr(plain, "start_writeback", start_writeback)
    return asked


def columns(n: int) -> dict:
    return {"tokens": np.arange(n * 1024, dtype=np.int64).reshape(n, 1024), "id": np.arange(n)}


@pytest.mark.parametrize("how", ["columns", "extend"])
def test_a_durable_writer_starts_the_writeback_of_what_it_wrote(tmp_path, requests, how):
    path = tmp_path / "d.evs"
    with evs.Writer(path) as w:
        if how == "columns":
            w.extend_columns(columns(4000))  # 33 MB
        else:
            w.extend([np.full(1024, i, np.int64), i] for i in range(4000))
        w.commit()
        size = os.path.getsize(path)
    assert len(requests) >= size // plain.PlainSink.WRITEBACK_BYTES - 1
    ends = [0]
    for offset, length in requests:  # the ranges follow each other, in the file
        assert offset <= ends[-1] and length >= plain.PlainSink.WRITEBACK_BYTES
        ends.append(offset + length)
    assert ends[-1] <= size
    with evs.open(path) as ds:
        assert len(ds) == 4000 and ds.verify().ok


@pytest.mark.parametrize("options", [{"durable": False}, {"compression": "zstd"}])
def test_other_writers_leave_writeback_to_the_kernel(tmp_path, requests, options):
    with evs.Writer(tmp_path / "d.evs", **options) as w:
        w.extend_columns(columns(2000))
    assert requests == []


def test_writeback_goes_on_after_a_write_is_undone(tmp_path, requests, monkeypatch):
    """A write that fails part way is cut off; the writeback asked for afterwards starts at
    or before the cut, never beyond the file's end."""
    path = tmp_path / "d.evs"
    real = plain.pwrite_all
    calls = {"n": 0}

    def fail_third(fd, data, offset):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device (simulated)")
        return real(fd, data, offset)

    with evs.Writer(path) as w:
        w.extend_columns(columns(2000))
        cut = w.tell()
        monkeypatch.setattr(plain, "pwrite_all", fail_third)
        with pytest.raises(OSError, match="simulated"):
            w.extend_columns(columns(3000))
        monkeypatch.setattr(plain, "pwrite_all", real)
        del requests[:]
        w.extend_columns(columns(3000))
        w.commit()
        assert requests and requests[0][0] <= cut
        assert all(offset + length <= os.path.getsize(path) for offset, length in requests)
    with evs.open(path) as ds:
        assert len(ds) == 5000 and ds.verify().ok
