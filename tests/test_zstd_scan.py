"""Sequential scans, slices and batches of compressed files (``Dataset._by_spans``,
``ZstdSource.span``, ``batch._located_rows``): every record as ``ds[i]`` reads it, and a
damaged frame an error naming the record it holds."""

from __future__ import annotations

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.dataset import scans

from .test_core import assert_same

N = 700


def _records(n: int = N) -> list:
    """W1-like records whose lengths vary (ids of 1 to 3 digits), with now and then one of
    another structure and one bigger than a 2 KiB frame (it spans frames)."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(n):
        if i % 97 == 50:
            out.append([rng.random((3, 700)), f"big-{i}"])
        elif i % 61 == 7:
            out.append([None, i * 1.5, True, b"raw"])
        else:
            out.append([rng.integers(0, 50000, 128), rng.random(16, dtype=np.float32), i, f"{i}"])
    return out


@pytest.fixture(params=[None, 64 << 10], ids=["one-per-frame", "several-per-frame"])
def compressed(request, tmp_path):
    path = tmp_path / "s.evs.zst"
    options = {} if request.param is None else {"frame_size": request.param}
    recs = _records()
    with evs.Writer(path, compression="zstd", **options) as w:
        w.extend(recs[:400])
    with evs.Writer(path, mode="a", compression="zstd", **options) as w:
        w.extend(recs[400:])  # a second index segment and index block
    with evs.open(path) as ds:
        data_frames = len(ds._source._frame_map()[0])
    assert (data_frames > N * 0.9) if request.param is None else (data_frames < N // 10)
    return path, recs


def _same_as_gets(got: list, ds, where) -> None:
    want = [ds[i] for i in where]
    assert_same(got, want)
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            if isinstance(b, np.ndarray):
                assert a.flags.writeable == b.flags.writeable


@pytest.mark.parametrize("span", [None, 5000], ids=["spans", "small-spans"])
def test_scan_slices_and_batches_give_exactly_what_gets_give(compressed, span, monkeypatch):
    """(Small spans: a scan's spans end inside frames, whose last one the next span reuses.)"""
    if span is not None:
        monkeypatch.setattr(scans, "SCAN_SPAN", span)
    path, recs = compressed
    with evs.open(path) as ds:
        assert_same([ds[i] for i in range(N)], recs)
        report = ds.verify()
        assert report.ok and report.records == N, report.problems
    with evs.open(path) as ds:  # a fresh open: the scan learns the layouts
        _same_as_gets(list(ds), ds, range(N))
    for a, b in [(0, N), (3, 398), (399, 402), (N - 5, N), (10, 10)]:
        with evs.open(path) as ds:
            _same_as_gets(ds[a:b], ds, range(a, b))
    with evs.open(path) as ds:
        _same_as_gets(ds[N:2:-3], ds, range(N - 1, 2, -3))
    rng = np.random.default_rng(1)
    w1 = [i for i in range(N) if i % 97 != 50 and i % 61 != 7]
    for picks in (rng.choice(w1, 64).tolist(), [w1[5], w1[5], w1[3]], w1[100:300]):
        with evs.open(path) as ds:
            got = ds.get_batch(picks)
            assert_same(ds.get_many(picks), [ds[i] for i in picks])
            for k in range(4):
                column = [ds[i][k] for i in picks]
                stacked = got[k]
                if k < 2:
                    assert isinstance(stacked, np.ndarray) and stacked.shape[0] == len(picks)
                    assert_same(list(stacked), column)
                elif k == 2:
                    assert stacked.tolist() == column
                else:
                    assert stacked == column
    with evs.open(path) as ds:  # mixed kinds (record 68): lists of values
        picks = list(range(60, 76))
        got = ds.get_batch(picks)
        for k in range(4):
            assert_same(got[k], [ds[i][k] for i in picks])


def _damage_frame_of(path, i: int) -> tuple[int, int]:
    """Flip a byte in the middle of the data frame holding record ``i``'s first byte: the
    frame's file offset, and the first record with bytes in it."""
    with evs.open(path) as ds:
        phys, logi, csizes, lsizes = ds._source._frame_map()
        entries = ds.entries()
        starts = entries["offset"].astype(np.int64)
        ends = starts + 24 + entries["length"].astype(np.int64)  # 24: a record's frame header
        k = int(np.searchsorted(logi, starts[i], "right")) - 1
        touch = (starts < logi[k] + lsizes[k]) & (ends > logi[k])
        at, first = int(phys[k]), int(np.flatnonzero(touch)[0])
    data = bytearray(path.read_bytes())
    data[at + int(csizes[k]) // 2] ^= 0x55
    path.write_bytes(data)
    return at, first


@pytest.mark.parametrize("victim", [120, 333, 450, 620])
def test_a_damaged_frame_in_a_scan_names_the_first_record_it_holds(compressed, victim):
    path, recs = compressed
    at, first = _damage_frame_of(path, victim)
    with evs.open(path) as ds:
        got = []
        with pytest.raises(evs.FormatError) as err:
            for record in ds:
                got.append(record)
        assert err.value.record == first <= victim and err.value.path == str(path)
        assert f"frame at {at}" in str(err.value)
        assert_same(got, recs[:first])  # every record before it was yielded, unchanged
        with pytest.raises(evs.FormatError) as err:
            ds[first - 2 if first >= 2 else 0 : victim + 3]
        assert err.value.record == first
        with pytest.raises(evs.FormatError) as err:
            ds.get_batch([victim, 0 if first else N - 1])
        assert err.value.record == victim
        assert not ds.verify().ok
