"""The zstd frame layer: same container, same API, readable by the stock zstd tool."""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evalue_store as evs
from evalue_store.physical import zstd_sink

from .test_core import assert_same, records
from .test_damage import kill_trials, record, same

ZSTD = shutil.which("zstd")


def need_zstd() -> str:
    if ZSTD is None:
        pytest.fail("the zstd CLI is missing: CI must install Debian's zstd package")
    return ZSTD


def stock_decompress(zstd: str, path: os.PathLike, out: os.PathLike) -> None:
    """``zstd -d`` of a compressed container, as FRAMES.md tells a user without this
    library: the dictionary, if the file has one, is bytes [20, 20 + D) of the file, D the
    u32 at 16 (here read in Python, as ``head -c``/``tail -c`` or ``dd`` would)."""
    head = open(path, "rb").read(20)
    size = int.from_bytes(head[16:20], "little")
    options = []
    if size:
        with open(path, "rb") as f:
            f.seek(20)
            dictionary = f.read(size)
        assert dictionary == evs.read_dictionary(path)  # what `evalue-store dictionary` gives
        dict_path = f"{out}.dict"
        open(dict_path, "wb").write(dictionary)
        options = ["-D", dict_path]
    subprocess.run([zstd, "-q", "-d", "-f", *options, str(path), "-o", str(out)], check=True)


def w1(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(0, 50000, 128), rng.random(16, dtype=np.float32), i % 10, f"ex-{i:06d}"]
        for i in range(n)
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records, max_size=8), st.sampled_from([4096, 16384]))
def test_round_trip_compressed(tmp_path_factory, recs, frame_size):
    path = tmp_path_factory.mktemp("z") / "data.evs.zst"
    with evs.Writer(path, compression="zstd", frame_size=frame_size) as w:
        w.extend(recs)
    with evs.open(path) as ds:
        assert ds.compressed and len(ds) == len(recs)
        for got, want in zip(ds, recs):
            assert_same(got, want)
        assert ds.verify().ok


def test_stock_zstd_decompresses_to_a_plain_container(tmp_path):
    zstd = need_zstd()
    recs = w1(3000)
    path = tmp_path / "train.evs.zst"
    with evs.Writer(path, compression="zstd", metadata={"k": 1}) as w:
        w.extend(recs[:1000])
        w.commit()
        w.extend(recs[1000:2000])
    with evs.Writer(path, mode="a") as w:  # appends keep the file a valid seekable stream
        w.extend(recs[2000:])
        w.append([np.arange(1 << 19, dtype=np.float64)])  # 4 MiB: frames of its own
    plain = tmp_path / "train.evs"
    assert evs.read_dictionary(path)  # trained by default: zstd -d needs it
    assert subprocess.run([zstd, "-q", "-t", str(path)], capture_output=True).returncode
    stock_decompress(zstd, path, plain)
    dictionary = tmp_path / "train.dict"
    dictionary.write_bytes(evs.read_dictionary(path))
    subprocess.run([zstd, "-q", "-t", "-D", str(dictionary), str(path)], check=True)
    ds, dz = evs.open(plain), evs.open(path)
    assert not ds.compressed and dz.compressed
    assert len(ds) == len(dz) == 3001 and ds.metadata == dz.metadata == {"k": 1}
    for i in (0, 999, 1000, 2999):
        assert_same(ds[i], recs[i])
        assert_same(dz[i], recs[i])
    assert np.array_equal(dz[3000][0], np.arange(1 << 19, dtype=np.float64))
    assert dz[3000][0].ctypes.data % 64 == 0
    assert ds.verify().ok and dz.verify().ok
    assert os.path.getsize(path) < 0.6 * os.path.getsize(plain)


def test_told_apart_by_bytes_not_names(tmp_path):
    zpath, ppath = tmp_path / "a.evs", tmp_path / "b.evs.zst"
    with evs.Writer(zpath, compression="zstd") as w:
        w.append([1])
    with evs.Writer(ppath) as w:
        w.append([2])
    assert evs.open(zpath).compressed and evs.open(zpath)[0] == [1]
    assert not evs.open(ppath).compressed and evs.open(ppath)[0] == [2]


def test_random_access_decompresses_only_needed_frames(tmp_path):
    """FRAMES.md: a lookup reads one locator group and the frames holding the record; it
    never decompresses the index. A scan decompresses each frame once."""
    path = tmp_path / "r.evs.zst"
    recs = w1(2000)
    with evs.Writer(path, compression="zstd", frame_size=8192) as w:
        w.extend(recs)
    calls = []

    class Counting:  # the source's decoder, counting the frames it decompresses
        def __init__(self, dctx):
            self.dctx = dctx

        def decompress(self, frame):
            calls.append(bytes(frame))
            return self.dctx.decompress(frame)

        def stream_reader(self, frame, **options):
            calls.append(bytes(frame))
            return self.dctx.stream_reader(frame, **options)

    def counted(ds):
        ds._source.dctx = Counting(ds._source.dctx)
        return ds

    ds = counted(evs.open(path))
    n_frames = len(ds._source._frame_map()[0])
    cache = ds._source._native  # ds[i] decompresses in compiled code, into this cache
    before = cache.cached_frames  # opening read the header's and the footer's frames
    assert_same(ds[1234], recs[1234])
    assert cache.cached_frames == before + 1  # the record's frame; no index frame
    assert_same(ds[1235], recs[1235])  # (its neighbour: the same frame, from the cache)
    assert cache.cached_frames == before + 1 and not calls
    for _ in ds:  # a scan decompresses each frame once
        pass
    assert len(calls) == len(set(calls)) and len(calls) <= n_frames
    ds2 = counted(evs.open(path, cache_bytes=1))  # no room to cache: batches group by frame
    calls.clear()
    batch = ds2.get_many([5, 1, 3, 2, 4, 0])
    assert_same(batch, [recs[i] for i in (5, 1, 3, 2, 4, 0)])
    assert len(calls) <= 4


def test_tensors_are_aligned_views_into_the_frame_buffer(tmp_path):
    path = tmp_path / "v.evs.zst"
    with evs.Writer(path, compression="zstd") as w:
        for i in range(10):
            w.append([np.arange(10 + i, dtype=np.int32), np.ones((3, 5), np.float16)])
    ds = evs.open(path)
    a, b = ds[3]
    c, _ = ds[4]
    for t in (a, b, c):
        assert t.ctypes.data % 64 == 0 and not t.flags.writeable  # later reads share it
    base = a.base
    while getattr(base, "base", None) is not None and not isinstance(base, np.ndarray):
        base = base.base
    assert np.shares_memory(a, ds[3][0])  # the cached frame, not a copy per tensor


def test_dictionary_is_stored_once_and_zstd_cli_uses_it(tmp_path):
    zstd = need_zstd()
    recs = w1(2000)
    dictionary = evs.train_dictionary(recs[:500], size=16 << 10)
    plain_z = tmp_path / "nodict.evs.zst"
    dict_z = tmp_path / "dict.evs.zst"
    with evs.Writer(plain_z, compression="zstd", dictionary=None) as w:
        w.extend(recs)
    subprocess.run([zstd, "-q", "-t", str(plain_z)], check=True)  # no -D needed
    with evs.Writer(dict_z, compression="zstd", dictionary=dictionary) as w:
        w.extend(recs)
    with evs.Writer(dict_z, mode="a") as w:  # appends reuse the stored dictionary
        w.append(recs[0])
    assert os.path.getsize(dict_z) < os.path.getsize(plain_z)
    ds = evs.open(dict_z)
    assert len(ds) == 2001 and ds.verify().ok
    assert_same(ds[1999], recs[1999])
    extracted = tmp_path / "dict.zdict"
    extracted.write_bytes(evs.read_dictionary(dict_z))
    out = tmp_path / "dict.evs"
    subprocess.run(
        [zstd, "-q", "-d", "-D", str(extracted), str(dict_z), "-o", str(out)], check=True
    )
    assert len(evs.open(out)) == 2001


def test_incompressible_data_still_reads(tmp_path):
    path = tmp_path / "noise.evs.zst"
    rng = np.random.default_rng(1)
    noise = [[rng.random(4096).astype(np.float32)] for _ in range(50)]
    with evs.Writer(path, compression="zstd") as w:
        w.extend(noise)
    ds = evs.open(path)
    assert all(np.array_equal(ds[i][0], noise[i][0]) for i in range(50))


def test_truncated_compressed_tail_opens_at_last_commit(tmp_path):
    path = tmp_path / "t.evs.zst"
    ends = []
    with evs.Writer(path, compression="zstd", frame_size=4096) as w:
        for c in range(3):
            for i in range(5):
                w.append(record(c * 5 + i))
            w.commit()
            ends.append(os.path.getsize(path))
    data = path.read_bytes()
    cut = tmp_path / "cut.evs.zst"
    for size in range(ends[0], len(data), 3):
        cut.write_bytes(data[:size])
        ds = evs.open(cut)
        whole = [k for k, end in enumerate(ends) if end <= size]
        assert len(ds) == 5 * (whole[-1] + 1)
        assert all(same(ds[i], i) for i in range(len(ds)))
    for size in range(0, 40):
        cut.write_bytes(data[:size])
        with pytest.raises(evs.FormatError):
            evs.open(cut)


def test_corrupted_frames_raise_and_verify_reports(tmp_path):
    path = tmp_path / "c.evs.zst"
    with evs.Writer(path, compression="zstd", frame_size=4096) as w:
        for i in range(200):
            w.append(record(i))
    data = bytearray(path.read_bytes())
    rng = random.Random(3)
    for _ in range(60):
        flipped = bytearray(data)
        pos = rng.randrange(len(data))
        flipped[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(flipped)
        try:
            ds = evs.open(path)
        except evs.FormatError:
            continue
        report = ds.verify()
        if report.ok:  # some bits of a zstd bitstream are padding: the data must be intact
            assert len(ds) == 200 and all(same(ds[i], i) for i in range(200)), pos
            continue
        for i in range(len(ds)):  # never silently wrong: each record is right or raises
            try:
                assert same(ds[i], i)
            except evs.FormatError:
                pass


def test_killed_compressed_writers_lose_no_committed_record(tmp_path):
    path = str(tmp_path / "k.evs.zst")
    evs.Writer(path, compression="zstd", frame_size=4096).close()
    kill_trials(path, trials=30, seed=11)  # mode="a" keeps the file's compression


def test_sink_read_decompresses_only_the_frames_it_needs(tmp_path, monkeypatch):
    """ZstdSink.read (old index segments, at commit) decompresses only the frames holding
    the bytes, and gives them back right across frames, commits (their run, map and index
    frames lie between the data frames) and frames written after earlier reads."""
    path = tmp_path / "z.evs"
    writer = evs.Writer(path, compression="zstd", frame_size=256, durable=False)
    checked = []
    real = zstd_sink.check_frame

    def spy(frame, cap, exact=True):
        checked.append(len(frame))
        return real(frame, cap, exact)

    monkeypatch.setattr(zstd_sink, "check_frame", spy)
    sink = writer._sink
    for commit in range(3):
        for i in range(40):
            writer.append([np.full(50, commit * 100 + i, np.int16), f"r{i}"])
        writer.commit()
        m = sink.pos // 1000
        logical = b"".join(sink.read(1000 * j, 1000) for j in range(m))
        assert len(sink._fstart) > 30 * (commit + 1)
        checked.clear()
        assert logical == bytes(sink.read(0, 1000 * m))
        assert len(checked) == sum(1 for start in sink._flog if start < 1000 * m)
    writer.close()
    monkeypatch.undo()
    with evs.open(path) as ds:
        assert bytes(ds._source.read(0, len(logical))) == logical  # what a reader sees
        assert len(ds) == 120 and ds[119][1] == "r39"
