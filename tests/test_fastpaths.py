"""Tensor views stay valid however they were read, and after the dataset is closed."""

from __future__ import annotations

import struct

import numpy as np

import evalue_store as evs


def assert_identical(got, want):
    """Same types, values, dtypes, shapes, strides and flags; floats bit for bit."""
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert (got.dtype, got.shape, got.strides) == (want.dtype, want.shape, want.strides)
        assert got.flags.c_contiguous == want.flags.c_contiguous
        assert got.flags.writeable == want.flags.writeable
        assert got.ctypes.data % 8 == want.ctypes.data % 8
        assert got.tobytes() == want.tobytes()
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_identical(g, w)
    elif isinstance(want, float):
        assert struct.pack("<d", got) == struct.pack("<d", want)
    else:
        assert got == want


def test_views_outlive_close(tmp_path):
    """Every way of reading hands out views that keep the mapping alive after close().

    No rank-1 tensor here: those come from np.frombuffer, whose export would keep the
    mapping open for the others too.
    """
    path = tmp_path / "close.evs"
    record = [np.ones((2, 3)), np.array(5), np.ones((3, 2), np.float32).T]
    with evs.Writer(path) as writer:
        writer.extend([record] * 10)
    ds = evs.open(path)
    held = [ds[0], ds[1], ds[9], *ds]  # generic, then Layout.decode; the scan
    ds.close()
    for values in held:
        assert_identical(values, [np.asarray(v) for v in values])  # reads the pages
        assert_identical([v.sum() for v in values], [v.sum() for v in record])
