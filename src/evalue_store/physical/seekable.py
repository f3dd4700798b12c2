"""Zstd seekable-format primitives: frames, seek tables, bounded frame decompression.

The compression layer stores the container's logical byte stream as a sequence of
independent, standard zstd frames followed by a seek table in a skippable frame, as
defined by the zstd seekable format (facebook/zstd,
``contrib/seekable_format/zstd_seekable_compression_format.md``). The stock ``zstd -d``
therefore decompresses a file to the plain container, and a reader can locate and
decompress only the frames it needs. docs/FRAMES.md describes the layout.

Everything here is container-agnostic: the caller decides where frames end. Appending a
commit means writing new frames after the previous seek table and ending the file with
a new seek table that lists every earlier frame, the previous seek table itself (as an
empty frame, ``decompressed_size == 0``), and the new frames: see
:meth:`SeekTable.entries_for_next_table`.

Frame-level checks live in ``zframe``. Every size read from a file is checked before it is
used to allocate or index, and a violation raises :class:`evalue_store.errors.FormatError`
with the file offset. A source is a buffer (bytes, mmap, numpy array) or a byte reader
(``byteio``: an object with ``size`` and ``pread``) or a binary file object.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import zstandard

from ..errors import (
    LIMIT,
    OUT_OF_BOUNDS,
    SEEK_TABLE,
    TRUNCATED,
    ZSTD_FRAME,
    FormatError,
    UsageError,
)
from .zframe import (
    DEFAULT_LEVEL,
    MAGIC_NUMBER,
    MAX_EXPANSION_RATIO,
    MIN_FRAME_SIZE,
    SKIPPABLE_HEADER,
    SKIPPABLE_HEADER_SIZE,
    SKIPPABLE_MAGIC_MIN,
    FrameError,
    aligned_empty,
    check_frame,
    decompress_into,
    frame_checksum,
    new_compressor,
)

SEEK_TABLE_SKIPPABLE_MAGIC = 0x184D2A5E
"""The one skippable magic the seekable format uses for its seek table."""
SEEKABLE_MAGIC = 0x8F92EAB1
"""Seekable_Magic_Number: the last 4 bytes of every seekable file."""
SEEK_TABLE_FOOTER = struct.Struct("<IBI")
"""Seek_Table_Footer: Number_Of_Frames (4) + Seek_Table_Descriptor (1) + magic (4)."""
SEEK_TABLE_FOOTER_SIZE = SEEK_TABLE_FOOTER.size
CHECKSUM_FLAG = 0x80
"""Seek_Table_Descriptor bit 7: entries carry a 4-byte checksum."""
RESERVED_BITS = 0x7C
"""Seek_Table_Descriptor bits 6-2: must be zero. Bits 1-0 are unused and ignored."""
MAX_FRAMES = 0x8000000
"""Frame count limit of the reference implementation (ZSTD_SEEKABLE_MAXFRAMES); keeps
the reference decoder's 32-bit seek-table size arithmetic from overflowing."""
MAX_FRAME_DECOMPRESSED_SIZE = 0x80000000
"""Per-frame size limit of the reference compressor
(ZSTD_SEEKABLE_MAX_FRAME_DECOMPRESSED_SIZE)."""
DEFAULT_MAX_FRAME_SIZE = 1 << 30
"""This module's default cap on one frame's decompressed size (1 GiB). evalue_store
readers and appending writers use zstd.MAX_FRAME_SIZE (64 MiB, docs/FRAMES.md)."""
EMPTY_CHECKSUM = 0x51D8E999
"""Low 32 bits of XXH64(b"", seed=0): the seek-table checksum of an empty frame, such as
an earlier seek table kept as a skippable frame."""

_SEARCH_CHUNK = 1 << 20
_MAGIC_BYTES = MAGIC_NUMBER.pack(SEEKABLE_MAGIC)


# --- compression ---------------------------------------------------------------------


class CompressedFrame(NamedTuple):
    """One standard zstd frame plus the seek-table entry that describes it."""

    data: bytes
    decompressed_size: int
    checksum: int
    """Low 32 bits of XXH64 of the decompressed bytes (the frame's Content_Checksum)."""

    @property
    def compressed_size(self) -> int:
        return len(self.data)


def compress_frame(
    data,
    *,
    level: int = DEFAULT_LEVEL,
    dict_data: zstandard.ZstdCompressionDict | None = None,
    cctx: zstandard.ZstdCompressor | None = None,
) -> CompressedFrame:
    """Compress one chunk of logical bytes into exactly one standard zstd frame.

    The frame always records its content size (readers check it against the seek table
    before allocating) and a content checksum, which by the zstd format is the low 32
    bits of XXH64(seed 0) of the content, i.e. exactly the seek-table ``Checksum`` the
    seekable format asks for; it is returned so the caller can put it in the table.
    ``cctx`` (from :func:`new_compressor`) overrides ``level``/``dict_data``.
    """
    view = memoryview(data).cast("B")
    size = view.nbytes
    if size > MAX_FRAME_DECOMPRESSED_SIZE:
        raise UsageError(
            f"chunk of {size} bytes exceeds the seekable format's frame limit "
            f"{MAX_FRAME_DECOMPRESSED_SIZE}"
        )
    if cctx is None:
        cctx = new_compressor(level, dict_data)
    frame = cctx.compress(view)
    params = zstandard.get_frame_parameters(frame)
    if params.content_size != size or not params.has_checksum:
        raise UsageError("compressor must write content size and checksum (use new_compressor())")
    return CompressedFrame(frame, size, frame_checksum(frame))


def encode_seek_table(compressed_sizes, decompressed_sizes, checksums) -> bytes:
    """Serialize a seek table as the skippable frame that ends a seekable file.

    Entries are listed in file order and must cover every frame before the table,
    including earlier seek tables (decompressed size 0, checksum ``EMPTY_CHECKSUM``).
    The Checksum_Flag is always set.
    """
    c = np.asarray(compressed_sizes, dtype=np.int64).reshape(-1)
    d = np.asarray(decompressed_sizes, dtype=np.int64).reshape(-1)
    s = np.asarray(checksums, dtype=np.int64).reshape(-1)
    n = c.shape[0]
    if d.shape[0] != n or s.shape[0] != n:
        raise UsageError(f"entry arrays differ in length: {n}, {d.shape[0]}, {s.shape[0]}")
    if n > MAX_FRAMES:
        raise UsageError(f"{n} frames exceed the seekable format's limit {MAX_FRAMES}")
    if n:
        if int(c.min()) < MIN_FRAME_SIZE or int(c.max()) > 0xFFFFFFFF:
            raise UsageError("compressed sizes must lie in [8, 2**32-1]")
        if int(d.min()) < 0 or int(d.max()) > 0xFFFFFFFF:
            raise UsageError("decompressed sizes must lie in [0, 2**32-1]")
        if int(s.min()) < 0 or int(s.max()) > 0xFFFFFFFF:
            raise UsageError("checksums must be unsigned 32-bit values")
    entries = np.empty((n, 3), dtype="<u4")
    entries[:, 0] = c
    entries[:, 1] = d
    entries[:, 2] = s
    frame_size = n * 12 + SEEK_TABLE_FOOTER_SIZE
    return b"".join(
        (
            SKIPPABLE_HEADER.pack(SEEK_TABLE_SKIPPABLE_MAGIC, frame_size),
            entries.tobytes(),
            SEEK_TABLE_FOOTER.pack(n, CHECKSUM_FLAG, SEEKABLE_MAGIC),
        )
    )


# --- reading a seek table ------------------------------------------------------------


@dataclass(frozen=True)
class SeekTable:
    """A parsed, validated seek table. Arrays are read-only numpy arrays, one row per
    frame (no per-frame Python objects): sizes and offsets are int64, checksums uint32.

    Frame ``k`` occupies file bytes ``compressed_offsets[k]:compressed_offsets[k+1]``
    and logical bytes ``decompressed_offsets[k]:decompressed_offsets[k+1]``.
    """

    compressed_sizes: np.ndarray
    decompressed_sizes: np.ndarray
    checksums: np.ndarray | None
    """None when the table's Checksum_Flag is clear (we always set it)."""
    compressed_offsets: np.ndarray
    """n+1 entries; the last one equals ``table_offset``."""
    decompressed_offsets: np.ndarray
    """n+1 entries; the last one is the logical stream's size."""
    table_offset: int
    """File offset where the seek table's skippable frame starts."""
    end: int
    """File offset just past the seek table (its Seekable_Magic_Number)."""

    @property
    def num_frames(self) -> int:
        return int(self.compressed_sizes.shape[0])

    @property
    def logical_size(self) -> int:
        return int(self.decompressed_offsets[-1])

    @property
    def table_size(self) -> int:
        return self.end - self.table_offset

    def frame_at(self, logical_offset: int) -> int:
        """Index of the frame holding logical byte ``logical_offset``.

        Like the reference decoder's binary search it picks the last frame starting at
        or before the offset, so empty frames (old seek tables) are never chosen.
        """
        if not 0 <= logical_offset < self.logical_size:
            raise IndexError(f"logical offset {logical_offset} outside [0, {self.logical_size})")
        return int(np.searchsorted(self.decompressed_offsets, logical_offset, side="right")) - 1

    def entries_for_next_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(compressed, decompressed, checksum) arrays a table appended after this one
        must start with: this table's frames, then this seek table itself as an empty
        frame, so that cumulative compressed sizes keep matching file positions."""
        checksums = self.checksums
        if checksums is None:
            raise UsageError("cannot carry a seek table without checksums forward")
        return (
            np.append(self.compressed_sizes, self.table_size),
            np.append(self.decompressed_sizes, 0),
            np.append(checksums.astype(np.int64), EMPTY_CHECKSUM),
        )


def _resolve_end(src: Any, end: int | None) -> int:
    """``end`` defaults to the source's size; a buffer must contain ``[0, end)`` (a file
    shorter than ``end`` shows up as a FormatError when read)."""
    if end is None:
        if hasattr(src, "pread"):
            return src.size
        if _is_file(src):
            pos = src.tell()
            size = src.seek(0, 2)
            src.seek(pos)
            return size
        return memoryview(src).nbytes
    end = int(end)
    buffer = not hasattr(src, "pread") and not _is_file(src)
    if end < 0 or (buffer and end > memoryview(src).nbytes):
        raise UsageError(f"end {end} outside the source")
    return end


def _is_file(src: Any) -> bool:
    """A binary file object (``seek``/``read``) rather than a buffer (mmap has both)."""
    try:
        memoryview(src).release()
    except TypeError:
        return True
    return False


def read_at(src: Any, offset: int, size: int) -> memoryview | bytes:
    """Exactly ``size`` bytes at ``offset``: a zero-copy view of a buffer, or one pread of
    a byte reader. A short result means the file is shorter than the caller said."""
    if hasattr(src, "pread"):
        chunk = src.pread(offset, size)
    elif _is_file(src):
        src.seek(offset)
        chunk = src.read(size)
    else:
        chunk = memoryview(src).cast("B")[offset : offset + size]
    if len(chunk) != size:
        raise FormatError(
            f"file ends before byte {offset + size} (truncated?)", offset, code=TRUNCATED
        )
    return chunk


def _parse_header_footer(src: Any, end: int) -> tuple[int, int, int]:
    """O(1) checks of a seek table ending at ``end``: footer magic, descriptor, frame
    count vs. bytes available, skippable header. Returns (n, entry_size, table_offset)."""
    if end < SKIPPABLE_HEADER_SIZE + SEEK_TABLE_FOOTER_SIZE:
        raise FormatError(f"{end} bytes cannot hold a seek table (needs 17)", 0, code=TRUNCATED)
    footer_at = end - SEEK_TABLE_FOOTER_SIZE
    n, descriptor, magic = SEEK_TABLE_FOOTER.unpack(read_at(src, footer_at, SEEK_TABLE_FOOTER_SIZE))
    if magic != SEEKABLE_MAGIC:
        raise FormatError(
            f"no seekable magic at end (found {magic:#010x})", end - 4, code=SEEK_TABLE
        )
    if descriptor & RESERVED_BITS:
        raise FormatError(
            f"seek table descriptor {descriptor:#04x} sets reserved bits",
            footer_at + 4,
            code=SEEK_TABLE,
        )
    entry_size = 12 if descriptor & CHECKSUM_FLAG else 8
    if n > MAX_FRAMES:
        raise FormatError(
            f"seek table claims {n} frames, over the limit {MAX_FRAMES}", footer_at, code=LIMIT
        )
    table_size = SKIPPABLE_HEADER_SIZE + n * entry_size + SEEK_TABLE_FOOTER_SIZE  # Python int
    if table_size > end:
        raise FormatError(
            f"seek table claims {n} frames ({table_size} bytes) but only {end} bytes precede "
            "its end",
            footer_at,
            code=OUT_OF_BOUNDS,
        )
    table_offset = end - table_size
    skip_magic, frame_size = SKIPPABLE_HEADER.unpack(
        read_at(src, table_offset, SKIPPABLE_HEADER_SIZE)
    )
    if skip_magic != SEEK_TABLE_SKIPPABLE_MAGIC:
        raise FormatError(
            f"seek table does not start with skippable magic 0x184D2A5E (found {skip_magic:#010x})",
            table_offset,
            code=SEEK_TABLE,
        )
    if frame_size + SKIPPABLE_HEADER_SIZE != table_size:
        raise FormatError(
            f"seek table Frame_Size {frame_size} disagrees with its footer "
            f"({table_size - SKIPPABLE_HEADER_SIZE})",
            table_offset + 4,
            code=SEEK_TABLE,
        )
    return n, entry_size, table_offset


def _parse_entries(
    src: Any, n: int, entry_size: int, table_offset: int, end: int, max_frame_size: int
) -> SeekTable:
    """O(n) numpy checks of the entries; every allocation here is bounded by the file."""
    entries_at = table_offset + SKIPPABLE_HEADER_SIZE
    raw = read_at(src, entries_at, n * entry_size)
    words = np.frombuffer(raw, dtype="<u4").reshape(n, entry_size // 4)
    csize = words[:, 0].astype(np.int64)
    dsize = words[:, 1].astype(np.int64)
    checksums = words[:, 2].astype(np.uint32) if entry_size == 12 else None

    def fail(mask: np.ndarray, what: str, code: str = SEEK_TABLE) -> None:
        bad = int(np.flatnonzero(mask)[0])
        at = entries_at + bad * entry_size
        raise FormatError(f"seek table entry {bad}: {what}", at, code=code)

    small = csize < MIN_FRAME_SIZE
    if small.any():
        fail(small, f"compressed size below the {MIN_FRAME_SIZE}-byte minimum frame")
    coff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(csize, out=coff[1:])  # n <= 2**27 and sizes < 2**32: no int64 overflow
    if int(coff[-1]) != table_offset:
        raise FormatError(
            f"frames' compressed sizes sum to {int(coff[-1])} but the seek table starts at "
            f"{table_offset}: frames must tile the file from offset 0",
            table_offset,
            code=SEEK_TABLE,
        )
    too_big = dsize > max_frame_size
    if too_big.any():
        fail(too_big, f"decompressed size over the reader cap {max_frame_size}", LIMIT)
    bomb = dsize > csize * MAX_EXPANSION_RATIO
    if bomb.any():
        fail(bomb, f"decompressed size over {MAX_EXPANSION_RATIO}x its compressed size", LIMIT)
    doff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(dsize, out=doff[1:])
    for arr in (csize, dsize, coff, doff, checksums):
        if arr is not None:
            arr.flags.writeable = False
    return SeekTable(csize, dsize, checksums, coff, doff, table_offset, end)


def read_seek_table(
    src: Any, end: int | None = None, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
) -> SeekTable:
    """Parse and validate the seek table that ends at ``end`` (default: end of ``src``).

    Rejects with FormatError: wrong magics, reserved descriptor bits, a frame count the
    bytes before ``end`` cannot hold (checked before reading the entries), a Frame_Size
    that disagrees with the footer, frames that do not exactly tile ``[0, table)``,
    frames under 8 bytes, and per-frame decompressed sizes over ``max_frame_size`` or
    over ``MAX_EXPANSION_RATIO`` times the compressed size.
    """
    end = _resolve_end(src, end)
    n, entry_size, table_offset = _parse_header_footer(src, end)
    return _parse_entries(src, n, entry_size, table_offset, end, max_frame_size)


def _magic_positions(src: Any, end: int) -> Iterator[int]:
    """Offsets of SEEKABLE_MAGIC starting before ``end - 3``, from the last backwards.
    Each byte is scanned a bounded number of times (linear)."""
    hi = end
    if hasattr(src, "rfind") and not hasattr(src, "pread") and not _is_file(src):  # bytes, mmap
        while True:
            p = src.rfind(_MAGIC_BYTES, 0, hi)
            if p < 0:
                return
            yield p
            hi = p + 3
    while hi >= 4:
        lo = max(0, hi - _SEARCH_CHUNK)
        block = bytes(read_at(src, lo, hi - lo))
        top = len(block)
        while True:
            p = block.rfind(_MAGIC_BYTES, 0, top)
            if p < 0:
                break
            yield lo + p
            top = p + 3
        if lo == 0:
            return
        hi = lo + 3  # a magic straddling the window edge is seen in the next window


def find_last_seek_table(
    src: Any, end: int | None = None, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
) -> tuple[SeekTable, int] | None:
    """The last valid seek table ending at or before ``end`` and its end offset, or None.

    For recovery after a crash left a partial commit after the last seek table. Scans
    backwards for the seekable magic; each candidate gets the O(1) checks first and
    the O(entries) checks only if those pass. The total entry bytes examined is capped
    at ``2 * end + 1 MiB``, so a file stuffed with fake candidates costs linear time
    and raises FormatError instead of going quadratic.
    """
    end = _resolve_end(src, end)
    budget = 2 * end + (1 << 20)
    for p in _magic_positions(src, end):
        cand_end = p + 4
        try:
            n, entry_size, table_offset = _parse_header_footer(src, cand_end)
        except FormatError:
            continue
        budget -= n * entry_size
        if budget < 0:
            raise FormatError("too many candidate seek tables; giving up the search", p, code=LIMIT)
        try:
            table = _parse_entries(src, n, entry_size, table_offset, cand_end, max_frame_size)
        except FormatError:
            continue
        return table, cand_end
    return None


# --- decompressing one frame ---------------------------------------------------------


def decompress_frame(
    src: Any,
    table: SeekTable,
    k: int,
    out: Any = None,
    *,
    dctx: zstandard.ZstdDecompressor | None = None,
    alignment: int = 64,
) -> np.ndarray:
    """Decompress frame ``k`` into ``out`` (writable buffer of at least its decompressed
    size) or into a new array from ``aligned_empty`` aligned to the frame's logical offset.
    Returns a uint8 array over exactly the frame's bytes.

    Before allocating: the frame's header must declare the seek table's decompressed size
    and a content checksum equal to the table's, and its blocks must end exactly at the
    table's frame end and be able to produce that size (``zframe.check_frame``). A
    skippable frame (an earlier seek table) must be listed as empty with
    ``EMPTY_CHECKSUM``. Errors raise FormatError naming the frame and its file offset.
    """
    if not 0 <= k < table.num_frames:
        raise IndexError(f"frame {k} outside [0, {table.num_frames})")
    c0 = int(table.compressed_offsets[k])
    csize = int(table.compressed_sizes[k])
    dsize = int(table.decompressed_sizes[k])
    expected = None if table.checksums is None else int(table.checksums[k])

    def fail(reason: str, code: str = SEEK_TABLE) -> FormatError:
        return FormatError(f"frame {k}: {reason}", c0, code=code)

    if out is not None:
        target = memoryview(out).cast("B")
        if target.readonly:
            raise UsageError("out must be writable")
        if target.nbytes < dsize:
            raise UsageError(f"out holds {target.nbytes} bytes, frame {k} needs {dsize}")
        target = target[:dsize]
    frame = read_at(src, c0, csize)
    (magic,) = MAGIC_NUMBER.unpack_from(frame)
    if magic & 0xFFFFFFF0 == SKIPPABLE_MAGIC_MIN:
        _, user_size = SKIPPABLE_HEADER.unpack_from(frame)
        if user_size + SKIPPABLE_HEADER_SIZE != csize:
            raise fail(f"skippable frame holds {user_size + 8} bytes, seek table says {csize}")
        if dsize != 0:
            raise fail(f"skippable frame listed with decompressed size {dsize}, not 0")
        if expected is not None and expected != EMPTY_CHECKSUM:
            raise fail(f"skippable frame listed with checksum {expected:#010x}")
        return np.empty(0, dtype=np.uint8) if out is None else np.frombuffer(target, np.uint8)
    try:
        _, declared = check_frame(frame, MAX_FRAME_DECOMPRESSED_SIZE)
        if declared != dsize:
            raise FrameError(f"frame header declares {declared} bytes, seek table {dsize}")
        stored = frame_checksum(frame, csize)
        if expected is not None and stored != expected:
            raise FrameError(
                f"content checksum {stored:#010x} differs from the seek table's {expected:#010x}"
            )
        if out is None:
            result = aligned_empty(dsize, int(table.decompressed_offsets[k]), alignment)
            target = memoryview(result)
        else:
            result = np.frombuffer(target, dtype=np.uint8)
        decompress_into(frame, target, dctx or zstandard.ZstdDecompressor())
    except FrameError as exc:
        raise fail(str(exc), ZSTD_FRAME) from None
    return result
