"""Tests for evalue_store.physical.seekable: zstd seekable-format frames and seek tables."""

from __future__ import annotations

import io
import mmap
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalue_store.errors import FormatError
from evalue_store.physical import seekable as sk
from evalue_store.physical import zframe

# --- helpers -------------------------------------------------------------------------

_M64 = (1 << 64) - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """Plain XXH64, written from the algorithm's description, to check checksums
    independently of libzstd (only used on small inputs)."""
    n = len(data)
    pos = 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed, (seed - _P1) & _M64]
        while pos + 32 <= n:
            lanes = struct.unpack_from("<4Q", data, pos)
            v = [_round(a, x) for a, x in zip(v, lanes)]
            pos += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for a in v:
            h = (((h ^ _round(0, a)) * _P1) + _P4) & _M64
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while pos + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, pos)
        h = (_rotl(h ^ _round(0, lane), 27) * _P1 + _P4) & _M64
        pos += 8
    if pos + 4 <= n:
        (lane,) = struct.unpack_from("<I", data, pos)
        h = (_rotl(h ^ ((lane * _P1) & _M64), 23) * _P2 + _P3) & _M64
        pos += 4
    while pos < n:
        h = (_rotl(h ^ ((data[pos] * _P5) & _M64), 11) * _P1) & _M64
        pos += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def build_file(commits, level: int = 3) -> tuple[bytes, list[int]]:
    """Write commits the way the container does: each appends frames and a seek table
    listing every frame so far (earlier tables included as empty frames)."""
    buf = bytearray()
    ends = []
    for chunks in commits:
        if ends:
            c, d, s = (list(a) for a in sk.read_seek_table(buf).entries_for_next_table())
        else:
            c, d, s = [], [], []
        for chunk in chunks:
            frame = sk.compress_frame(chunk, level=level)
            buf += frame.data
            c.append(frame.compressed_size)
            d.append(frame.decompressed_size)
            s.append(frame.checksum)
        buf += sk.encode_seek_table(c, d, s)
        ends.append(len(buf))
    return bytes(buf), ends


def read_all(buf, end=None, **kw) -> bytes:
    table = sk.read_seek_table(buf, end, **kw)
    return b"".join(sk.decompress_frame(buf, table, k).tobytes() for k in range(table.num_frames))


def table_bytes(frames) -> bytes:
    return sk.encode_seek_table(
        [f.compressed_size for f in frames],
        [f.decompressed_size for f in frames],
        [f.checksum for f in frames],
    )


def patch_fcs(frame: bytes, value: int) -> bytes:
    """Rewrite a zstd frame header's Frame_Content_Size in place (same field width)."""
    fhd = frame[4]
    fcs_flag, single, did_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    out = bytearray(frame)
    if width == 2:
        assert 256 <= value < 65536 + 256
        out[pos : pos + 2] = (value - 256).to_bytes(2, "little")
    else:
        out[pos : pos + width] = value.to_bytes(width, "little")
    return bytes(out)


def sample_chunks() -> list[bytes]:
    rng = np.random.default_rng(1)
    return [
        b"header-bytes" * 10,
        b"",
        rng.integers(0, 256, 3000, dtype=np.uint8).tobytes(),
        bytes(300_000),  # several 128 KiB blocks
        (b"pattern-" + bytes(range(200))) * 1500,
        b"z",
    ]


@pytest.fixture(scope="module")
def zstd_cli() -> str:
    path = shutil.which("zstd") or ("/usr/bin/zstd" if os.path.exists("/usr/bin/zstd") else None)
    if path is None:
        pytest.fail(
            "the stock `zstd` command-line tool is required by these tests and was not found; "
            "CI must install it (Debian package `zstd`: apt-get install -y zstd)"
        )
    return path


def stock_decompress(zstd_cli: str, data: bytes) -> bytes:
    proc = subprocess.run([zstd_cli, "-d", "-q", "-c"], input=data, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


# --- checksums and constants ---------------------------------------------------------


def test_xxh64_reference_value_and_empty_checksum():
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert sk.EMPTY_CHECKSUM == xxh64(b"") & 0xFFFFFFFF
    assert sk.compress_frame(b"").checksum == sk.EMPTY_CHECKSUM


@pytest.mark.parametrize("size", [1, 3, 4, 7, 8, 31, 32, 33, 100, 1000])
def test_table_checksum_is_low32_of_xxh64(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert sk.compress_frame(data).checksum == xxh64(data) & 0xFFFFFFFF


# --- round trips ---------------------------------------------------------------------


def test_round_trip_stock_zstd_and_reader(zstd_cli, tmp_path):
    chunks = sample_chunks()
    data, (end,) = build_file([chunks])
    path = tmp_path / "one.zst"
    path.write_bytes(data)
    proc = subprocess.run([zstd_cli, "-d", "-q", "-c", str(path)], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b"".join(chunks)

    table = sk.read_seek_table(data)
    assert end == len(data) == table.end
    assert table.num_frames == len(chunks)
    assert table.decompressed_sizes.tolist() == [len(c) for c in chunks]
    assert table.checksums.tolist() == [xxh64(c) & 0xFFFFFFFF for c in chunks]
    assert table.compressed_offsets[-1] == table.table_offset
    assert table.logical_size == sum(len(c) for c in chunks)
    for k, chunk in enumerate(chunks):
        got = sk.decompress_frame(data, table, k)
        assert got.tobytes() == chunk
        if chunk:  # tensors inside keep their file alignment in memory
            assert (got.ctypes.data - int(table.decompressed_offsets[k])) % 64 == 0


def test_append_leaves_earlier_seek_table_as_empty_frame(zstd_cli):
    first = [b"commit-one " * 50, bytes(70_000)]
    second = [b"commit-two " * 80, b"tail"]
    data, (end1, end2, _) = build_file([first, second, []])  # third commit adds no frame
    logical = b"".join(first + second)
    assert stock_decompress(zstd_cli, data) == logical
    assert stock_decompress(zstd_cli, data[:end2]) == logical
    assert stock_decompress(zstd_cli, data[:end1]) == b"".join(first)

    old = sk.read_seek_table(data, end1)
    assert old.num_frames == 2 and read_all(data, end1) == b"".join(first)
    table = sk.read_seek_table(data)
    # frames: 2 of commit one, table 1, 2 of commit two, table 2
    assert table.num_frames == 6
    assert table.decompressed_sizes.tolist() == [
        len(first[0]),
        len(first[1]),
        0,
        len(second[0]),
        len(second[1]),
        0,
    ]
    mid = sk.read_seek_table(data, end2)
    for k, earlier in ((2, old), (5, mid)):
        assert table.checksums[k] == sk.EMPTY_CHECKSUM
        assert table.compressed_sizes[k] == earlier.table_size
        assert table.compressed_offsets[k] == earlier.table_offset
        assert sk.decompress_frame(data, table, k).size == 0
    assert table.compressed_offsets[2] == old.table_offset
    assert read_all(data) == logical
    # A spec-following decoder locates frames by binary search over decompressed
    # offsets (last frame starting at or before the position): empty entries are
    # never selected, so it skips the embedded table.
    picks = {table.frame_at(p) for p in range(table.logical_size)}
    assert picks == {0, 1, 3, 4}
    with pytest.raises(IndexError):
        table.frame_at(table.logical_size)


def test_file_object_sources(tmp_path):
    data, ends = build_file([sample_chunks()[:3], [b"more" * 500]])
    path = tmp_path / "f.zst"
    path.write_bytes(data)
    expected = read_all(data)
    with open(path, "rb") as fh:  # os.pread path
        table = sk.read_seek_table(fh)
        assert (
            b"".join(sk.decompress_frame(fh, table, k).tobytes() for k in range(table.num_frames))
            == expected
        )
        found = sk.find_last_seek_table(fh)
        assert found is not None and found[1] == ends[-1]
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        table_mm = sk.read_seek_table(mm)
        assert sk.decompress_frame(mm, table_mm, 1).tobytes() == sample_chunks()[1]
        assert sk.find_last_seek_table(mm)[1] == ends[-1]
        del table_mm
    bio = io.BytesIO(data)  # seek/read path
    assert sk.read_seek_table(bio).table_offset == table.table_offset
    assert sk.read_seek_table(np.frombuffer(data, np.uint8)).num_frames == table.num_frames
    with pytest.raises(FormatError):  # the file is shorter than the caller claims
        sk.read_seek_table(io.BytesIO(data[:-5]), len(data))


def test_decompress_into_caller_buffer():
    chunks = [b"abc" * 1000, b""]
    data, _ = build_file([chunks])
    table = sk.read_seek_table(data)
    out = bytearray(5000)
    got = sk.decompress_frame(data, table, 0, out)
    assert got.tobytes() == chunks[0] and bytes(out[:3000]) == chunks[0]
    assert sk.decompress_frame(data, table, 1, bytearray()).size == 0
    with pytest.raises(ValueError):
        sk.decompress_frame(data, table, 0, bytearray(2999))
    with pytest.raises(ValueError):
        sk.decompress_frame(data, table, 0, bytes(3000))
    with pytest.raises(IndexError):
        sk.decompress_frame(data, table, 2)


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
@pytest.mark.parametrize("start", [0, 1, 63, 64, 1000, 2**40 + 5])
def test_aligned_empty(alignment, start):
    arr = sk.aligned_empty(100, start, alignment)
    assert arr.dtype == np.uint8 and arr.shape == (100,) and arr.flags.writeable
    assert (arr.ctypes.data - start) % alignment == 0


def test_dictionary_frames():
    dictionary = zstandard.ZstdCompressionDict(
        b"shared vocabulary of tensor names " * 20, dict_type=zstandard.DICT_TYPE_RAWCONTENT
    )
    cctx = sk.new_compressor(5, dictionary)
    chunk = b"shared vocabulary of tensor names: weight, bias " * 5
    frame = sk.compress_frame(chunk, cctx=cctx)
    data = frame.data + table_bytes([frame])
    table = sk.read_seek_table(data)
    got = sk.decompress_frame(data, table, 0, dctx=zframe.new_decompressor(dictionary))
    assert got.tobytes() == chunk
    with pytest.raises(FormatError):
        sk.decompress_frame(data, table, 0)


def test_compressor_must_record_size_and_checksum():
    with pytest.raises(ValueError):
        sk.compress_frame(b"x", cctx=zstandard.ZstdCompressor(write_checksum=False))


def test_encode_rejects_bad_entries():
    with pytest.raises(ValueError):
        sk.encode_seek_table([10], [1, 2], [0])
    with pytest.raises(ValueError):
        sk.encode_seek_table([2**32], [1], [0])
    with pytest.raises(ValueError):
        sk.encode_seek_table([4], [1], [0])
    with pytest.raises(ValueError):
        sk.encode_seek_table([10], [-1], [0])


# --- hostile files: seek table -------------------------------------------------------


def test_truncation_at_every_tail_byte_and_recovery():
    data, (end1, end2) = build_file([[b"first" * 100, b"x" * 10], [b"second" * 300, b"y"]])
    view = memoryview(data)
    for cut in range(end1 + 1, end2):
        with pytest.raises(FormatError):
            sk.read_seek_table(view[:cut])
        found = sk.find_last_seek_table(view[:cut])
        assert found is not None and found[1] == end1
    for cut in range(0, min(end1, 40)):
        with pytest.raises(FormatError):
            sk.read_seek_table(view[:cut])


def test_bit_flips_in_seek_table_are_detected():
    data, _ = build_file([[b"a" * 100, b""], [bytes(range(256)) * 4, b"end"]])
    table = sk.read_seek_table(data)
    descriptor_at = len(data) - 5
    for pos in range(table.table_offset, len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[pos] ^= 1 << bit
            if pos == descriptor_at and bit < 2:  # Unused_Bits: a decoder must ignore them
                assert read_all(bytes(bad)) == read_all(data)
                continue
            with pytest.raises(FormatError):
                read_all(bytes(bad))


def footer(n: int, descriptor: int = sk.CHECKSUM_FLAG) -> bytes:
    return struct.pack("<IBI", n, descriptor, sk.SEEKABLE_MAGIC)


def _one_frame_file():
    frame = sk.compress_frame(b"payload " * 64)
    return frame, frame.data + table_bytes([frame])


def _edit_entry(data: bytes, table: sk.SeekTable, k: int, field: int, value: int) -> bytes:
    at = table.table_offset + 8 + 12 * k + 4 * field
    return data[:at] + struct.pack("<I", value) + data[at + 4 :]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: b"\0" * 91 + footer(2**32 - 1), id="2**32-1 frames in 100 bytes"),
        pytest.param(lambda: b"\0" * 91 + footer(sk.MAX_FRAMES), id="2**27 frames in 100 bytes"),
        pytest.param(
            lambda: (
                struct.pack("<II", sk.SEEK_TABLE_SKIPPABLE_MAGIC, 9 + 12 * (sk.MAX_FRAMES + 1))
                + footer(sk.MAX_FRAMES + 1)
            ),
            id="over MAX_FRAMES",
        ),
        pytest.param(lambda: b"\0" * 91 + footer(0, 0x80 | 0x04), id="reserved bit"),
        pytest.param(lambda: struct.pack("<II", 0x184D2A50, 9) + footer(0), id="other skip magic"),
        pytest.param(
            lambda: struct.pack("<II", sk.SEEK_TABLE_SKIPPABLE_MAGIC, 10) + footer(0),
            id="Frame_Size disagrees",
        ),
        pytest.param(lambda: b"\1" + sk.encode_seek_table([], [], []), id="gap before table"),
        pytest.param(lambda: sk.encode_seek_table([], [], []) + b"\0", id="byte after table"),
        pytest.param(lambda: _one_frame_file()[1][:-4] + b"\xb1\xea\x92\x8e", id="footer magic"),
        pytest.param(lambda: b"", id="empty file"),
    ],
)
def test_malformed_tables_raise(make):
    data = make()
    with pytest.raises(FormatError):
        sk.read_seek_table(data)
    found = sk.find_last_seek_table(data)
    if found is not None:  # only a valid table followed by junk may be found
        assert found[1] < len(data) and sk.read_seek_table(data, found[1]).end == found[1]


def test_lying_entries_raise():
    frames = [sk.compress_frame(b"alpha" * 100), sk.compress_frame(b"beta" * 100)]
    data = frames[0].data + frames[1].data + table_bytes(frames)
    table = sk.read_seek_table(data)

    shifted = _edit_entry(data, table, 0, 0, frames[0].compressed_size + 1)
    shifted = _edit_entry(shifted, table, 1, 0, frames[1].compressed_size - 1)
    lying = sk.read_seek_table(shifted)  # still tiles the file ...
    for k in range(2):  # ... but neither frame ends where its entry says
        with pytest.raises(FormatError, match=f"frame {k}"):
            sk.decompress_frame(shifted, lying, k)

    with pytest.raises(FormatError):  # sizes no longer sum to the table's position
        sk.read_seek_table(_edit_entry(data, table, 0, 0, frames[0].compressed_size + 1))
    with pytest.raises(FormatError):  # under the 8-byte minimum frame
        sk.read_seek_table(_edit_entry(data, table, 0, 0, 7))
    with pytest.raises(FormatError, match="reader cap"):
        sk.read_seek_table(data, max_frame_size=499)
    with pytest.raises(FormatError, match="32768x"):
        sk.read_seek_table(
            _edit_entry(data, table, 0, 1, frames[0].compressed_size * 32768 + 1),
            max_frame_size=2**32,
        )
    wrong_size = _edit_entry(data, table, 1, 1, 401)
    with pytest.raises(FormatError, match="declares 400"):
        sk.decompress_frame(wrong_size, sk.read_seek_table(wrong_size), 1)
    wrong_sum = _edit_entry(data, table, 1, 2, frames[1].checksum ^ 1)
    with pytest.raises(FormatError, match="checksum"):
        sk.decompress_frame(wrong_sum, sk.read_seek_table(wrong_sum), 1)


def test_skippable_frame_entries_are_checked():
    data, (end1, _) = build_file([[b"one"], [b"two"]])
    table = sk.read_seek_table(data)
    assert table.decompressed_sizes[1] == 0
    for field, value in ((1, 1), (2, 0)):
        bad = _edit_entry(data, table, 1, field, value)
        with pytest.raises(FormatError, match="frame 1"):
            read_all(bad)


# --- hostile files: frames -----------------------------------------------------------


def _file_with_frame(frame: bytes, size: int, checksum: int) -> bytes:
    return frame + sk.encode_seek_table([len(frame)], [size], [checksum])


def test_bomb_declared_small_but_larger_output():
    data = (bytes(range(256)) * 4) * 2000  # 2 MB, compressed blocks only
    frame = sk.compress_frame(data)
    for claim in (1000, 100_000, len(data) - 1):
        bomb = patch_fcs(frame.data, claim)
        buf = _file_with_frame(bomb, claim, frame.checksum)
        table = sk.read_seek_table(buf)
        with pytest.raises(FormatError, match="frame 0"):
            sk.decompress_frame(buf, table, 0)
        out = bytearray(claim + 10)  # nothing is ever written past the declared size
        with pytest.raises(FormatError):
            sk.decompress_frame(buf, table, 0, out)
        assert out[claim:] == bytes(10)
    rle = sk.compress_frame(bytes(1_000_000))  # RLE blocks: exact output sizes known
    bomb = patch_fcs(rle.data, 5000)
    with pytest.raises(FormatError, match="frame 0"):
        read_all(_file_with_frame(bomb, 5000, rle.checksum))


def test_frames_missing_size_or_checksum_or_with_junk():
    payload = b"some payload " * 40
    frame = b"".join(
        zstandard.ZstdCompressor(write_checksum=True).read_to_iter(io.BytesIO(payload))
    )
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    good = sk.compress_frame(payload)
    with pytest.raises(FormatError, match="content size"):
        read_all(_file_with_frame(frame, len(payload), good.checksum))
    no_sum = zstandard.ZstdCompressor(write_checksum=False).compress(payload)
    with pytest.raises(FormatError, match="no content checksum"):
        read_all(_file_with_frame(no_sum, len(payload), good.checksum))
    with pytest.raises(FormatError, match="its entry says"):
        read_all(_file_with_frame(good.data + b"JUNK", len(payload), good.checksum))
    with pytest.raises(FormatError, match="not a zstd frame"):
        read_all(_file_with_frame(b"\0" * 20, 10, good.checksum))
    corrupt = bytearray(good.data)
    corrupt[-6] ^= 0x40  # inside the last block: content no longer matches the checksum
    with pytest.raises(FormatError, match="frame 0"):
        read_all(_file_with_frame(bytes(corrupt), len(payload), good.checksum))


_RLIMIT_SCRIPT = textwrap.dedent(
    """
    import resource, struct, sys
    from evalue_store.physical import seekable as sk
    from evalue_store.errors import FormatError

    def vm_size():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    footer = lambda n: struct.pack("<IBI", n, 0x80, sk.SEEKABLE_MAGIC)
    # a frame whose header claims 1 GiB (single segment, checksum) but whose one raw
    # block holds 40000 bytes: the table entry passes the 32768x bound.
    header = struct.pack("<IB", 0xFD2FB528, 0xA4) + struct.pack("<I", 1 << 30)
    fake = header + struct.pack("<I", (40000 << 3) | 1)[:3] + bytes(40000) + bytes(4)
    fake_file = fake + sk.encode_seek_table([len(fake)], [1 << 30], [0])
    garbage = bytes(40000)
    garbage_file = garbage + sk.encode_seek_table([len(garbage)], [(1 << 30) - 1], [0])
    cases = {
        "2**32-1 frames in 100 bytes": b"\\0" * 91 + footer(2**32 - 1),
        "2**27 frames in 100 bytes": b"\\0" * 91 + footer(1 << 27),
        "2**27 frames, consistent header": struct.pack("<II", 0x184D2A5E, 9 + 12 * (1 << 27))
            + footer(1 << 27),
        "4 GiB frame in 100 bytes": bytes(64) + sk.encode_seek_table([64], [2**32 - 1], [0]),
    }
    limit = vm_size() + (256 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        bytearray(1 << 30)
        sys.exit("RLIMIT_AS is not enforced")
    except MemoryError:
        pass
    for name, data in cases.items():
        with open(sys.argv[1], "wb") as f:
            f.write(data)
        with open(sys.argv[1], "rb") as f:  # file reads allocate what they ask for
            for src in (data, f):
                try:
                    sk.read_seek_table(src)
                    sys.exit("accepted: " + name)
                except FormatError:
                    pass
                if sk.find_last_seek_table(src) is not None:
                    sys.exit("found: " + name)
    for name, data in (("fake 1 GiB header", fake_file), ("garbage", garbage_file)):
        table = sk.read_seek_table(data)
        try:
            sk.decompress_frame(data, table, 0)
            sys.exit("decompressed: " + name)
        except FormatError:
            pass
    print("OK")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")
def test_huge_claims_under_address_space_limit(tmp_path):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _RLIMIT_SCRIPT, str(tmp_path / "hostile.zst")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stdout + proc.stderr


# --- crash recovery ------------------------------------------------------------------


def test_find_last_seek_table_after_garbage(monkeypatch):
    data, (end1, end2) = build_file([[b"one" * 100], [b"two" * 100, b"three"]])
    rng = np.random.default_rng(7)
    tails = [
        b"",
        rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        struct.pack("<I", sk.SEEKABLE_MAGIC) * 5000,  # many fake candidates
        data[end1:end2],  # a copy of the last table: valid-looking, frames do not tile
        sk.compress_frame(b"uncommitted" * 50).data + b"\x5e\x2a\x4d\x18partial",
    ]
    for tail in tails:
        found = sk.find_last_seek_table(data + tail)
        assert found is not None and found[1] == end2
        table, end = found
        assert read_all(data, end) == b"one" * 100 + b"two" * 100 + b"three"
    assert sk.find_last_seek_table(rng.integers(0, 256, 10_000, dtype=np.uint8).tobytes()) is None
    # chunked backward scan (file objects, memoryviews): magics straddling windows
    monkeypatch.setattr(sk, "_SEARCH_CHUNK", 7)
    for tail in tails:
        for src in (io.BytesIO(data + tail), memoryview(data + tail)):
            found = sk.find_last_seek_table(src)
            assert found is not None and found[1] == end2


# --- property: random chunk lists ----------------------------------------------------

_chunk = st.one_of(
    st.binary(max_size=600),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=8), st.integers(1, 30_000)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    commits=st.lists(st.lists(_chunk, max_size=5), min_size=1, max_size=3),
    level=st.sampled_from([-5, 1, 3]),
)
def test_random_chunk_lists_round_trip(zstd_cli, commits, level):
    data, ends = build_file(commits, level=level)
    logical = b"".join(b"".join(c) for c in commits)
    assert read_all(data) == logical
    assert stock_decompress(zstd_cli, data) == logical
    table = sk.read_seek_table(data)
    assert table.num_frames == sum(len(c) for c in commits) + len(commits) - 1
    found = sk.find_last_seek_table(data + b"\0garbage")
    assert found is not None and found[1] == ends[-1]
    if table.logical_size:
        for pos in {0, table.logical_size // 2, table.logical_size - 1}:
            k = table.frame_at(pos)
            assert table.decompressed_offsets[k] <= pos < table.decompressed_offsets[k + 1]


def test_table_without_checksum_flag_is_read():
    frame = sk.compress_frame(b"no checksums in the table " * 9)
    table_frame = (
        struct.pack("<II", sk.SEEK_TABLE_SKIPPABLE_MAGIC, 8 + 9)
        + struct.pack("<II", frame.compressed_size, frame.decompressed_size)
        + footer(1, descriptor=0x03)  # Checksum_Flag clear, Unused_Bits set
    )
    data = frame.data + table_frame
    table = sk.read_seek_table(data)
    assert table.checksums is None and table.num_frames == 1
    assert read_all(data) == b"no checksums in the table " * 9
    with pytest.raises(ValueError):
        table.entries_for_next_table()
