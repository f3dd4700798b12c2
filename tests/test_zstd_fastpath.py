"""The zstd random-read and columnar-write paths (docs/FRAMES.md sections 3, 7, 9, 10).

A read parses each frame header itself, so its parser must agree with libzstd's on every
header; reads through a mapping of the committed bytes must give what ``pread`` gives;
columnar writes must cut the frames appends cut; index segments get large frames, and
data frames do not name the file's one dictionary.
"""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import evalue_store as evs
from evalue_store import byteio
from evalue_store.physical import zframe

from .test_core import assert_same

UNKNOWN = zstandard.CONTENTSIZE_UNKNOWN


def libzstd_header(frame: bytes) -> tuple[int, int, int, bool] | None:
    try:
        params = zstandard.get_frame_parameters(frame)
        size = zstandard.frame_header_size(frame)
    except zstandard.ZstdError:
        return None
    content = -1 if params.content_size == UNKNOWN else params.content_size
    return size, content, params.window_size, bool(params.has_checksum)


def ours(frame: bytes) -> tuple[int, int, int, bool] | None:
    try:
        return zframe.frame_header(frame)
    except zframe.FrameError:
        return None


@settings(max_examples=3000, deadline=None)
@given(st.binary(min_size=1, max_size=14))
def test_frame_header_parser_agrees_with_libzstd(tail):
    frame = zframe.MAGIC_NUMBER.pack(zframe.ZSTD_FRAME_MAGIC) + tail
    expected, got = libzstd_header(frame), ours(frame)
    if expected is not None and expected[1] >= UNKNOWN - 1:  # libzstd's sentinels
        assert got is not None and got[1] >= UNKNOWN - 1  # over any cap: refused anyway
        return
    assert got == expected


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65791, 65792, 1 << 20])
@pytest.mark.parametrize("checksum", [True, False])
@pytest.mark.parametrize("dict_id", [True, False])
def test_frame_header_of_real_frames(size, checksum, dict_id):
    data = np.random.default_rng(size).integers(0, 4, size, dtype=np.uint8).tobytes()
    rng = np.random.default_rng(1)
    samples = [rng.integers(0, 8, 300, dtype=np.uint8).tobytes() for _ in range(200)]
    dictionary = zstandard.train_dictionary(4096, samples)
    for dict_data in (None, dictionary):
        for content_size in (True, False):
            c = zstandard.ZstdCompressor(
                dict_data=dict_data,
                write_checksum=checksum,
                write_content_size=content_size,
                write_dict_id=dict_id,
            )
            for frame in (c.compress(data), b"".join(c.read_to_iter(data))):
                assert ours(frame) == libzstd_header(frame)


@pytest.mark.parametrize(
    "frame_size,n,width", [(1024, 300, 100), (4096, 60, 3000), (1 << 20, 600, 4000)]
)
def test_columnar_writes_cut_the_frames_appends_cut(tmp_path, frame_size, n, width):
    """Records of several per frame, of frames of their own, and (1 MiB frames) records
    whose padding crosses a frame's end."""
    rng = np.random.default_rng(width)
    columns = {0: rng.integers(0, 50_000, (n, width)), 1: rng.random((n, 3), np.float32)}
    sizes = []
    for how in ("columns", "rows"):
        path = tmp_path / f"{how}.evs.zst"
        with evs.Writer(path, compression="zstd", frame_size=frame_size, durable=False) as w:
            w.append([np.zeros(3), 1])  # the columns start inside a frame
            if how == "columns":
                w.extend_columns(columns)
            else:
                w.extend([columns[0][k], columns[1][k]] for k in range(n))
        with evs.open(path) as ds:
            sizes.append(ds._source._frame_map()[3].tolist())
            for k in (0, n // 2, n - 1):
                assert_same(ds[k + 1], [columns[0][k], columns[1][k]])
            assert ds.verify().ok
    assert sizes[0] == sizes[1]


def test_mapped_and_pread_reads_agree_and_map_only_committed_bytes(tmp_path):
    path = tmp_path / "m.evs.zst"
    rng = np.random.default_rng(0)
    recs = [[rng.integers(0, 1000, 50), f"r{i}"] for i in range(3000)]
    with evs.Writer(path, compression="zstd", frame_size=2048) as w:
        w.extend(recs)
    committed = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x28\xb5\x2f\xfd" + bytes(5000))  # a torn tail after the commit
    with evs.open(path) as mapped, evs.open(path, backend="pread") as pread:
        assert isinstance(mapped._source.reader, byteio.MapReader)
        assert mapped._source.reader.size == committed
        assert isinstance(pread._source.reader, byteio.FdReader)
        for i in rng.integers(0, len(recs), 300).tolist() + [0, len(recs) - 1]:
            assert_same(mapped[i], recs[i])
            assert_same(pread[i], recs[i])
        for report in (mapped.verify(), pread.verify()):  # every record good; the tail named
            assert not report.bad_records and report.uncommitted_bytes == 5004
    with pytest.raises(OSError):
        byteio.MapReader(0, 0).pread(-1, 4)


def test_index_segments_get_large_frames_and_frames_name_no_dictionary(tmp_path):
    path = tmp_path / "i.evs.zst"
    recs = [[i, f"r{i}"] for i in range(6000)]  # 144,000 bytes of index entries
    dictionary = evs.train_dictionary(recs[:500], size=4096)
    with evs.Writer(path, compression="zstd", frame_size=1024, dictionary=dictionary) as w:
        w.extend(recs)
    with evs.open(path) as ds:
        phys, logi, csizes, lsizes = ds._source._frame_map()
        (seg,) = ds.commit.segments
        inside = (logi >= seg.offset) & (logi < seg.offset + seg.count * 24)
        assert lsizes[inside][:-1].tolist() == [65520] * (int(inside.sum()) - 1)
        data = path.read_bytes()
        for at in phys.tolist():
            assert data[at + 4] & 3 == 0  # Frame_Header_Descriptor: no Dictionary_ID
        assert_same(ds[5999], recs[5999])


def reference_check(frame: bytes, cap: int) -> tuple[int, int] | None:
    """check_frame's rules through libzstd's header parser and the general block walk."""
    header = libzstd_header(frame) if frame[:4] == bytes.fromhex("28b52ffd") else None
    if header is None or len(frame) < 9:
        return None
    size, content, window, has_checksum = header
    if content < 0 or not has_checksum or content > cap or content >= UNKNOWN - 1:
        return None
    try:
        length, lo, hi = zframe.walk_blocks(frame, size, window, True, exact=False)
    except zframe.FrameError:
        return None
    return (length, content) if lo <= content <= hi else None


def checked(frame: bytes, cap: int) -> tuple[int, int] | None:
    try:
        return zframe.check_frame(frame, cap, exact=False)
    except zframe.FrameError:
        return None


FRAMES = [
    zframe.new_compressor().compress(np.random.default_rng(n).integers(0, 9, n, np.uint8).tobytes())
    for n in (0, 7, 300, 5000, 70_000, 300_000)
]


@settings(max_examples=2000, deadline=None)
@given(
    st.sampled_from(FRAMES),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 255)), max_size=4),
    st.integers(0, 40),
    st.sampled_from([1 << 26, 4096, 0]),
)
def test_frame_checks_agree_with_libzstd_on_damaged_frames(frame, edits, cut, cap):
    """The fast path for the frames writers make (one block, 2-byte content size) accepts
    exactly what the general checks accept, with the same length and size."""
    data = bytearray(frame)
    for at, value in edits:
        if at < len(data):
            data[at] = value
    data = bytes(data[: len(data) - cut] if cut < len(data) else data)
    assert checked(data, cap) == reference_check(data, cap)
