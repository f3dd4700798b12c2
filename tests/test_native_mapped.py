"""``ds[i]`` and the scan of a plain mapped file in one compiled call (``_native.Mapped``).

Its promise: for every record it gives exactly what the Python reader gives, and for any
record it cannot vouch for (a failed check, an unknown structure) it gives nothing, so
that the Python reader says what is wrong. The oracle is the same dataset with the compiled
reader switched off (``ds._fast = ds._fast_get = None``), on good files and on files
damaged byte by byte, with and without their checksums fixed up afterwards.
"""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import _native
from evalue_store.container import FRAME_SIZE, crc32, crc32c
from evalue_store.errors import LIMIT

from .test_fastpaths import assert_identical


def every_kind(i: int) -> list:
    return [
        np.arange(6, dtype=np.int32).reshape(2, 3) + i,
        np.full(5, i / 3, np.float32),
        np.ones((3, 2), np.float64).T * i,  # a dim order: strided rows
        i,
        i / 7,
        f"ex-{i:04d}",
        bytes([i % 256]) * 3,
        i % 2 == 0,
        None,
    ]


def write(path, records: list, version: str = "1.1", sessions: int = 1) -> None:
    """``records`` in ``sessions`` appends (each a segment of the index)."""
    cut = [len(records) * k // sessions for k in range(sessions + 1)]
    for a, b in zip(cut[:-1], cut[1:]):
        mode = "a" if a else "w"
        with evs.Writer(path, mode=mode, format_version=version) as w:
            w.extend(records[a:b])


def outcome(ds, i: int):
    try:
        return ds[i]
    except evs.FormatError as exc:
        return f"{type(exc).__name__}: {exc}"


def assert_same(got, want) -> None:
    if isinstance(want, str):
        assert got == want
    else:
        assert_identical(got, want)


def compiled_and_python(path, **options) -> tuple[list, list, int]:
    """Every record as ds[i] reads it (twice: the first read learns the layouts), as the
    Python reader reads it, and how many the compiled reader served."""
    with evs.open(path, **options) as ds:
        for i in range(len(ds)):
            outcome(ds, i)
        fast = ds._fast
        served = sum(fast.get(i) is not None for i in range(len(ds)))
        got = [outcome(ds, i) for i in range(len(ds))]
        ds._fast = ds._fast_get = None
        want = [outcome(ds, i) for i in range(len(ds))]
    return got, want, served


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("sessions", [1, 3])
def test_serves_every_kind_as_the_python_reader_reads_it(tmp_path, version, sessions):
    path = tmp_path / "kinds.evs"
    records = [every_kind(i) for i in range(60)]
    write(path, records, version, sessions)
    got, want, served = compiled_and_python(path)
    assert served == len(records)
    for g, w, record in zip(got, want, records):
        assert_identical(g, w)
        assert [type(v) for v in g[3:]] == [int, float, str, bytes, bool, type(None)]
        assert np.array_equal(g[2], record[2]) and not g[2].flags.c_contiguous
    with evs.open(path) as ds:  # negative indices, and the scan, through the same path
        assert_identical(ds[-1], want[-1])
        assert_identical(list(ds), want)
        assert ds._fast.get(len(ds)) is None and ds._fast.get(-len(ds) - 1) is None
        assert ds._fast.get(2**70) is None and ds._fast.get(-(2**70)) is None
        with pytest.raises(IndexError):
            ds[len(ds)]


def test_a_0d_tensor_layout_is_left_to_the_python_reader(tmp_path):
    path = tmp_path / "zerod.evs"
    write(path, [[np.array(i), i] for i in range(10)])
    got, want, served = compiled_and_python(path)
    assert served == 0
    for g, w in zip(got, want):
        assert_identical(g, w)


def checksums_fixed(data: bytearray, entries: np.ndarray, version: str) -> None:
    """Every record's frame-header and index checksums made to match its payload again."""
    checksum = crc32c if version == "1.1" else crc32
    for offset, length, _, _ in entries.tolist():
        crc = checksum(bytes(data[offset + FRAME_SIZE : offset + FRAME_SIZE + length]))
        struct.pack_into("<I", data, offset + 4, crc)
        index_at = data.find(struct.pack("<QQ", offset, length))
        if index_at >= 0:
            struct.pack_into("<I", data, index_at + 16, crc)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("resign", [False, True])
def test_damaged_files_read_as_the_python_reader_reads_them(tmp_path, version, resign):
    """Byte changes in the records and the index: at random places, and every byte of one
    record's frame set to a few values. With ``resign`` the checksums are fixed afterwards,
    so the structure, UTF-8 and Bool checks must catch what the checksum no longer does."""
    good = tmp_path / "good.evs"
    write(good, [every_kind(i) for i in range(6)], version)
    with evs.open(good) as ds:
        entries = ds.entries().copy()
        start, end = ds.header.data_start, ds.commit.end
    data = bytes(good.read_bytes())
    rng = np.random.default_rng(1 + resign)
    changes = [(int(at), int(rng.integers(256))) for at in rng.integers(start, end, 100)]
    frame, length = int(entries[3]["offset"]), int(entries[3]["length"])
    for at in range(frame, frame + FRAME_SIZE + length):
        changes += [(at, data[at] ^ 1), (at, 2), (at, 0xFF)]
    bad = tmp_path / "bad.evs"
    disagreements = []
    for at, value in changes:
        damaged = bytearray(data)
        damaged[at] = value
        if resign:
            checksums_fixed(damaged, entries, version)
        bad.write_bytes(damaged)
        try:
            got, want, _ = compiled_and_python(bad)
        except evs.FormatError:
            continue  # the damage broke the file's commit: it does not open
        for i, (g, w) in enumerate(zip(got, want)):
            try:
                assert_same(g, w)
            except AssertionError:
                disagreements.append((at, value, i))
    assert disagreements == []


def test_max_record_bytes_set_after_open_applies(tmp_path):
    path = tmp_path / "limit.evs"
    write(path, [[np.zeros(100, np.uint8), i] for i in range(5)])
    with evs.open(path) as ds:
        assert ds[0][1] == 0 and ds[1][1] == 1  # the layout is learned
        ds.max_record_bytes = 50
        with pytest.raises(evs.FormatError) as caught:
            ds[2]
        assert caught.value.code == LIMIT
        ds.max_record_bytes = None
        assert ds[2][1] == 2 and ds._fast.get(2) is not None


def test_threads_share_a_dataset_while_its_layouts_change(tmp_path):
    """Large records are checksummed without the GIL; another thread meanwhile forgets and
    relearns every layout. Every read is still right (and nothing crashes)."""
    path = tmp_path / "big.evs"
    records = [[np.full(40_000, i, np.uint8), np.full(3, i, np.int64), i] for i in range(40)]
    write(path, records)
    ds = evs.open(path)
    ds[0], ds[1]
    stop = threading.Event()
    errors = []

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                i = int(rng.integers(len(records)))
                got = ds[i]
                assert got[2] == i and got[0][0] == i % 256 and got[0][-1] == i % 256
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for _ in range(300):
        ds._fast.clear()
        ds[0], ds[1]  # relearned by the Python reader, taught to the compiled one again
        ds._bind_fast()
    stop.set()
    for t in threads:
        t.join()
    ds.close()
    assert errors == []


def test_the_type_refuses_misuse():
    blank = _native.Mapped.__new__(_native.Mapped)
    with pytest.raises(TypeError):
        blank.get(0)
    with pytest.raises(TypeError):
        blank.add(8, [], [])
    view = memoryview(bytes(256))
    fast = _native.Mapped(view, [0], [64], 1, 64, 64, 240, None, "crc32c")
    with pytest.raises(TypeError):
        fast.__init__(view, [0], [64], 1, 64, 64, 240, None, "crc32c")
    with pytest.raises(TypeError):
        fast.get("0")
    for runs, steps in (
        ([(-1, b"x")], []),
        ([(20, b"xxxxx")], []),  # past a 24-byte frame
        ([], [(4, 20, "q")]),  # a scalar past the frame
        ([], [(4, 0, "f")]),  # not a scalar code
        ([], [(2, 10, 100)]),  # a string past the frame
        ([], [(9, 0, None)]),  # no such kind
    ):
        with pytest.raises(ValueError):
            fast.add(8, runs, steps)
    with pytest.raises(ValueError):
        _native.Mapped(view, [0], [64], 1, 48, 64, 240, None, None)  # alignment 48
    with pytest.raises(ValueError):
        _native.Mapped(view, [0], [64], 1, 64, 64, 240, None, "md5")
    assert fast.get(0) is None  # an all-zero index entry: no layout, no record
    with pytest.raises(ValueError):
        fast.decode_entries(bytes(23))


class NoFrames:
    """In place of ``ds._fast_frames``: serves nothing, so the Python reader reads all."""

    def decode_frame(self, *args):
        return None

    def add(self, *args):
        pass

    def clear(self):
        pass


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_compressed_records_decode_as_the_python_reader_decodes_them(tmp_path, version):
    """A compressed file's ds[i] decodes its frame's record in the same compiled call
    (``decode_frame``), 0-d and strided tensors too; on damaged frames, re-signed or not,
    it gives what the Python reader gives."""
    path = tmp_path / "kinds.evs"
    records = [[*every_kind(i), np.array(i)] for i in range(40)]
    with evs.Writer(path, compression="zstd", format_version=version) as w:
        w.extend(records)
    with evs.open(path) as ds:
        ds[0], ds[1]
        found = [ds._located(i) for i in range(len(ds))]
        served = [ds._fast_frames.decode_frame(*f[:5]) for f in found]
        assert all(record is not None for record in served)
        got = [ds[i] for i in range(len(ds))]
        ds._fast_frames, ds._fast_get = NoFrames(), None
        want = [ds[i] for i in range(len(ds))]
    for g, w, s in zip(got, want, served):
        assert_identical(g, w)
        assert_identical(s, w)
    buf, pos, offset, length, crc = found[5][:5]
    frame = bytes(buf[pos : pos + FRAME_SIZE + length])
    with evs.open(path) as ds:
        ds[0], ds[1]
        decode = ds._fast_frames.decode_frame
        for at in range(len(frame)):
            for value in (frame[at] ^ 1, 2, 0xFF):
                damaged = bytearray(frame)
                damaged[at] = value
                view = memoryview(bytes(damaged))
                fast = decode(view, 0, offset, length, crc)
                try:
                    slow = ds._decode(5, view, 0, offset, length, crc)
                except evs.FormatError:
                    slow = None
                if fast is not None:  # served: what the Python reader decodes
                    assert slow is not None
                    assert_identical(fast, slow)
        assert decode(memoryview(frame), 1, offset, length, crc) is None  # not its place
        assert decode(memoryview(frame[:-1]), 0, offset, length, crc) is None  # cut short
        assert decode(memoryview(frame), 0, offset, length, crc ^ 1) is None
        assert decode(memoryview(frame), 0, offset + 1, length, crc) is None  # unaligned
        assert decode(memoryview(frame), -5, offset, length, crc) is None
        assert decode(memoryview(frame), 0, -1, length, crc) is None
        with pytest.raises(TypeError):
            decode(memoryview(frame), 0, offset, length)
        with pytest.raises(TypeError):
            decode("not a buffer", 0, offset, length, crc)


SHAPES = [(), (0,), (1,), (5,), (0, 3), (3, 0), (1, 1), (2, 3, 4)]
DTYPES = [np.int8, np.float16, np.dtype(">i4"), np.complex128, np.uint64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_frame_tensors_of_every_shape_match_the_python_reader(tmp_path, dtype):
    """Tensors a frame's record holds, made by numpy's C API, have the dtype, shape,
    strides, flags and bytes np.frombuffer gives the Python reader; dim-ordered ones too."""
    arrays = [np.arange(int(np.prod(s)), dtype=np.int64).astype(dtype).reshape(s) for s in SHAPES]
    arrays += [a.T for a in arrays if a.ndim >= 2]
    path = tmp_path / "shapes.evs"
    with evs.Writer(path, compression="zstd") as w:
        w.extend([[*arrays, i] for i in range(6)])
    with evs.open(path) as ds:
        ds[0], ds[1]
        got = [ds[i] for i in range(2, 6)]
        assert all(ds._fast_frames.decode_frame(*ds._located(i)[:5]) for i in range(6))
        ds._fast_frames, ds._fast_get = NoFrames(), None
        want = [ds[i] for i in range(2, 6)]
    for g, w in zip(got, want):
        assert_identical(g, w)
        for tensor, array in zip(g, arrays):
            assert np.array_equal(tensor, array)  # (stored little-endian, as append stores it)
