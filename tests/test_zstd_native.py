"""``ds[i]`` of a compressed file through the compiled lookup (``_native.ZstdGet``,
src/evalue_store/_native_zstd.cc): a damaged file reads as the general path reads it (the
same value, or a FormatError with the same code and message), threads share one dataset,
and a forked child reads what its parent had cached.
"""

from __future__ import annotations

import os
import random
import threading

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import _native
from evalue_store.physical.zstd_layout import GROUP_BYTES

from .test_core import assert_same


def _records(n: int, seed: int = 0, big: tuple[int, ...] = ()) -> list:
    """W1-like records; the ones at ``big``'s positions hold incompressible tensors of
    40-200 KB (frames of their own, of one or two blocks, decompressed without the GIL)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rec = [rng.integers(0, 50000, 64), rng.random(8, dtype=np.float32), i % 10, f"ex-{i:05d}"]
        if i in big:
            rec[0] = rng.integers(0, 2**62, (40_000 + 80_000 * (i % 3)) // 8)
        out.append(rec)
    return out


def _write(path, recs, **options) -> None:
    with evs.Writer(path, compression="zstd", **options) as w:
        half = len(recs) // 2  # two commits: two locator runs
        w.extend(recs[:half])
        w.commit()
        w.extend(recs[half:])


def _general(path):
    """The dataset read the general way only: the compiled lookup is never asked."""
    ds = evs.open(path)
    ds._source.record_frame = lambda i: None
    ds._located = ds._fast_get = None
    return ds


def _outcome(ds, i):
    try:
        return "value", ds[i]
    except evs.FormatError as exc:
        return "error", exc.code, str(exc)


def _same_reads(path, order) -> None:
    try:
        fast, general = evs.open(path), _general(path)
    except evs.FormatError:
        return  # refused at open: no read happens
    with fast, general:
        assert fast._located is not None and len(fast) == len(general)
        for i in order:
            if i >= len(fast):  # (a cut file opens at an earlier commit)
                continue
            got, want = _outcome(fast, i), _outcome(general, i)
            if want[0] == "value":
                assert got[0] == "value", (i, got)
                assert_same(got[1], want[1])
            else:
                assert got == want, i


def _regions(path) -> dict[str, list[int]]:
    """Byte positions of the file worth damaging, by part: the locator groups, each data
    frame's header and first block header, and the frames' contents."""
    with evs.open(path) as ds:
        source = ds._source
        phys, _, csizes, _ = source._frame_map()
        runs = source.block.runs
    groups, heads, contents = [], [], []
    for offset, _, count in runs:
        at = offset + 8
        size = min(GROUP_BYTES * ((count + 15) // 16), 2 * GROUP_BYTES)
        groups += range(at, at + size)
    for a, n in zip(phys.tolist(), csizes.tolist()):
        heads += range(a, a + min(n, 10))
        contents += range(a + 10, a + n)
    return {"locators": groups, "frame headers": heads, "frame contents": contents}


@pytest.mark.parametrize("part", ["locators", "frame headers", "frame contents"])
def test_damaged_files_read_as_the_general_path_reads_them(tmp_path, part):
    """Bit flips and overwritten bytes in locator groups, frame headers and frames: every
    ``ds[i]`` gives what the general path gives (value or the same FormatError)."""
    path = tmp_path / "d.evs.zst"
    recs = _records(60)
    _write(path, recs, frame_size=1024, dictionary=None)
    data = path.read_bytes()
    positions = _regions(path)[part]
    rng = random.Random(part)
    order = list(range(len(recs))) * 2  # twice: cold, then from the cache
    for trial in range(120):
        pos = rng.choice(positions)
        damaged = bytearray(data)
        if trial % 2:
            damaged[pos] ^= 1 << rng.randrange(8)
        else:
            damaged[pos] = (damaged[pos] + rng.randrange(1, 256)) % 256
        path.write_bytes(damaged)
        _same_reads(path, order)


def test_truncated_and_dictionary_files_read_as_the_general_path(tmp_path):
    """A file cut anywhere in its last commit, and a file with a trained dictionary whose
    frames are damaged: the same reads both ways."""
    path = tmp_path / "t.evs.zst"
    recs = _records(400)
    _write(path, recs)  # the defaults: 2 KiB frames, a trained dictionary
    data = path.read_bytes()
    order = list(range(len(recs)))
    _same_reads(path, order)
    with evs.open(path) as ds:
        assert ds._source.dictionary  # (the frames need it)
        for i in order:
            assert_same(ds[i], recs[i])
    rng = random.Random(1)
    for cut in sorted(rng.sample(range(len(data) // 2, len(data)), 25)):
        path.write_bytes(data[:cut])
        _same_reads(path, order[::7])
    path.write_bytes(data)
    contents = _regions(path)["frame contents"]
    for pos in rng.sample(contents, 30):
        damaged = bytearray(data)
        damaged[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(damaged)
        _same_reads(path, order[::3])


def test_reserved_mode_bits_are_refused_as_the_general_path_refuses_them(tmp_path):
    """A frame whose sequences header sets the reserved bits of its compression modes
    (RFC 8878 3.1.1.3.2.1): a libzstd before 1.5.6 decodes it, the general path refuses it;
    so does ``ds[i]``."""
    path = tmp_path / "m.evs.zst"
    recs = _records(60)
    _write(path, recs, frame_size=1024, dictionary=None)
    data = path.read_bytes()
    with evs.open(path) as ds:
        phys, _, csizes, _ = ds._source._frame_map()
    tried = 0
    for a, n in zip(phys.tolist(), csizes.tolist()):
        frame = data[a : a + n]
        if frame[4] != 0x64 or frame[10] & 3 != 2:  # own frame, compressed literals
            continue
        form = frame[10] >> 2 & 3
        header = 3 if form < 2 else 4 if form == 2 else 5
        bits = 10 if form < 2 else 14 if form == 2 else 18
        size = int.from_bytes(frame[10 : 10 + header], "little") >> (4 + bits) & (1 << bits) - 1
        at = 10 + header + size
        count = frame[at]
        if count == 0:
            continue
        at += 1 if count < 128 else 2 if count < 255 else 3
        damaged = bytearray(data)
        damaged[a + at] |= 1
        path.write_bytes(damaged)
        _same_reads(path, range(len(recs)))
        tried += 1
    assert tried


def test_threads_share_one_compressed_dataset(tmp_path):
    """Eight threads reading one dataset with a cache too small to keep its frames (every
    read decompresses, big frames without the GIL): every record right, no crash."""
    path = tmp_path / "th.evs.zst"
    big = tuple(range(5, 300, 37))
    recs = _records(300, big=big)
    _write(path, recs, frame_size=2048)
    errors = []
    with evs.open(path, cache_bytes=64 << 10) as ds:

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(400):
                    i = rng.choice(big) if rng.random() < 0.2 else rng.randrange(len(recs))
                    assert_same(ds[i], recs[i])
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        # The LRU (its newest frame stays) and the last frame that held its record alone.
        assert ds._source._native.cached_bytes <= max(64 << 10, 200_000) + 200_000


def test_a_forked_child_reads_what_its_parent_cached(tmp_path):
    path = tmp_path / "f.evs.zst"
    recs = _records(500, big=(7, 250))
    _write(path, recs)
    with evs.open(path) as ds:
        for i in range(0, 500, 3):
            assert_same(ds[i], recs[i])
        pid = os.fork()
        if pid == 0:  # the child: the cache and decoders it inherited, then its own reads
            code = 0
            try:
                for i in list(range(500)) + [7, 250]:
                    assert_same(ds[i], recs[i])
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        for i in range(1, 500, 3):
            assert_same(ds[i], recs[i])


def test_big_frames_and_alignment_placement(tmp_path):
    """Frames of 40-200 KB (a 4-byte content size, two blocks) read through the compiled
    path, every tensor at an address congruent to its file offset; the cache is bounded."""
    path = tmp_path / "b.evs.zst"
    big = (3, 4, 5, 20, 21)
    recs = _records(40, big=big)
    with evs.Writer(path, compression="zstd", alignment=4096) as w:
        w.extend(recs)
    with evs.open(path, cache_bytes=1) as ds:
        native = ds._source._native
        for i in (*big, *range(40)):
            found = ds._source.record_frame(i)
            assert found is not None, i  # served compiled, not by the general path
            got = ds[i]
            assert_same(got, recs[i])
            assert got[0].ctypes.data % 4096 == 0  # the tensor's file alignment
            assert native.cached_frames <= 2  # the newest frame, and the last lone one


def test_zstd_get_refuses_bad_arguments():
    args = (None, [(100, 0, 5)], 16, 1 << 20, 1 << 20)
    with pytest.raises(ValueError, match="power of two"):
        _native.ZstdGet(*args, 48, evs.FormatError)
    with pytest.raises(ValueError, match="sorted"):
        _native.ZstdGet(None, [(100, 5, 5), (200, 0, 5)], 16, 1, 1, 64, evs.FormatError)
    get = _native.ZstdGet(*args, 64, evs.FormatError)
    with pytest.raises(TypeError, match="once"):
        get.__init__(*args, 64, evs.FormatError)
    assert get.record_frame(0) is None  # no file to read from yet
    get.read_from(b"\0" * 200, lambda offset, n: b"")
    assert get.record_frame(0) is None and get.record_frame(-1) is None  # a bad group CRC
    assert get.record_frame(2**70) is None and get.record_frame(5) is None
    with pytest.raises(ValueError, match="power of two"):
        get.reset(3)


def test_get_is_one_compiled_call_and_its_tensors_hold_their_frame(tmp_path):
    """ds[i] of a compressed file, once its layout is learned, is the compiled reader's
    get (locator, frame, record in one call), negative indices too: the same values as
    the general path; its tensors view the decompressed frame (not a copy), read-only,
    and outlive the dataset."""
    path = tmp_path / "g.evs.zst"
    recs = _records(300)
    _write(path, recs)
    with evs.open(path) as ds, _general(path) as general:
        ds[0], ds[1]  # the second read of a length learns its layout
        get = ds._fast_get
        assert get is not None
        for i in [*range(300), -1, -300]:
            served = get(i)
            assert served is not None, i
            assert_same(served, general[i])
            assert_same(ds[i], recs[i])
        for got, i in zip(ds.get_many([5, 299, 3, 5, -1]), [5, 299, 3, 5, 299]):
            assert_same(got, recs[i])  # get_many: the same compiled get, in file order
        assert get(300) is None and get(-301) is None  # the general path raises IndexError
        with pytest.raises(IndexError):
            ds[300]
        tensor = ds[7][0]
        assert type(tensor.base) is _native.ZstdFrame
        assert not tensor.flags.writeable
        with pytest.raises(ValueError):
            tensor.setflags(write=True)
    del ds
    assert np.array_equal(tensor, recs[7][0])  # the frame lives while a view does


def test_the_lru_keeps_frames_read_again_not_lone_or_once_read_ones(tmp_path):
    """A frame enters the LRU cache only if other records are read from it and it was
    decompressed once already lately: random reads that never come back (a file much
    larger than the cache) do not churn the LRU, yet the last frame decompressed is kept
    (the same record, or a neighbour, read again decompresses nothing), and frames read
    again are cached from their second decompression on."""
    big = _records(200, seed=2)  # ~600-byte records, 512-byte frames: one record a frame
    small = [[np.arange(4), i] for i in range(200)]  # many a frame
    for name, recs in (("lone", big), ("shared", small)):
        path = tmp_path / f"{name}.evs.zst"
        _write(path, recs, frame_size=512, dictionary=None)
        with evs.open(path) as ds:
            native, locate = ds._source._native, ds._source.record_frame
            ds[0], ds[1]
            before = native.cached_frames
            picks = list(range(0, 200, 7))
            for i in picks:  # first pass: every frame decompressed once
                first = locate(i)[0].obj
                assert locate(i)[0].obj is first  # the same decompressed frame
                assert_same(ds[i], recs[i])
            assert native.cached_frames <= before + 1  # only the last one is kept
            for i in picks:  # second pass: decompressed again, and so cached if shared
                locate(i)
            kept = {i: locate(i)[0].obj for i in picks}
            for i in picks:  # third pass: shared frames come from the LRU
                assert (locate(i)[0].obj is kept[i]) == (name == "shared") or i == picks[-1]
            if name == "lone":
                assert native.cached_frames <= before + 1
            else:
                assert native.cached_frames > before + 10


def test_locate_batch_finds_a_batch_as_ds_i_finds_it(tmp_path):
    """``_native.locate_batch`` (get_batch's compressed path): each record's entry as its
    frame header gives it, the decompressed frame holding it and its frame header's place
    there, as ``ds._located`` finds them; None for anything it cannot find whole or over
    the limit; bad arguments refused."""
    path = tmp_path / "g.evs.zst"
    recs = _records(120)
    _write(path, recs, frame_size=1024)
    with evs.open(path) as ds:
        zget = ds._source._native
        positions = np.array([3, 3, 40, 41, 119, 0], np.int64)
        entries, frames, places = _native.locate_batch(zget, positions, 1 << 20)
        rows = np.frombuffer(entries, evs.container.ENTRY_DTYPE)
        at = np.frombuffer(places, np.int64)
        assert len(frames) == len(rows) == len(at) == len(positions)
        for k, i in enumerate(positions.tolist()):
            frame, pos, offset, length, crc = ds._located(i)[:5]
            assert tuple(rows[k])[:3] == (offset, length, crc) and rows[k]["reserved"] == 0
            mine = memoryview(frames[k])
            assert bytes(mine[at[k] : at[k] + 16 + length]) == bytes(frame[pos : pos + 16 + length])
            address = np.frombuffer(mine, np.uint8).ctypes.data + at[k]
            assert address % ds.header.alignment == offset % ds.header.alignment
        assert_same(ds.get_batch([3, 40])[0], np.stack([recs[3][0], recs[40][0]]))
        assert _native.locate_batch(zget, np.array([5, 120], np.int64), 1 << 20) is None
        assert _native.locate_batch(zget, np.array([5, -1], np.int64), 1 << 20) is None
        total = int((rows["length"] + 16).sum())
        assert _native.locate_batch(zget, positions, total) is not None
        assert _native.locate_batch(zget, positions, total - 1) is None  # over the limit
        assert _native.locate_batch(zget, np.zeros(0, np.int64), 1 << 20) == (b"", [], b"")
        with pytest.raises(TypeError):
            _native.locate_batch(object(), positions, 1 << 20)
        with pytest.raises(TypeError):
            _native.locate_batch(zget, positions.astype(np.float64), 1 << 20)
        with pytest.raises(ValueError, match="1-D"):
            _native.locate_batch(zget, positions.reshape(2, 3), 1 << 20)
        with pytest.raises(ValueError, match="1-D"):
            _native.locate_batch(zget, np.int64(3), 1 << 20)
        with pytest.raises(ValueError, match="negative"):
            _native.locate_batch(zget, positions, -1)
        with pytest.raises(TypeError):
            _native.locate_batch(zget, positions)
