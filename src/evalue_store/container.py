"""Byte layout of the container: header, record frames, index segments, footers.

Everything here follows docs/FORMAT.md; the functions parse untrusted bytes and raise
FormatError naming the offset and the reason. All integers are little-endian.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

try:
    from . import _native
except ImportError as exc:  # a source tree used without being built
    raise ImportError(
        "evalue_store._native is not built: install with `pip install -e .` (needs g++ and "
        "the Python headers), or build in place with `python setup.py build_ext --inplace`"
    ) from exc
from .errors import (
    CHECKSUM,
    COMMIT,
    HEADER,
    INDEX,
    LIMIT,
    METADATA,
    NOT_A_CONTAINER,
    OUT_OF_BOUNDS,
    TRUNCATED,
    UNSUPPORTED,
    FormatError,
    UsageError,
)

MAGIC = b"\x89EVS\r\n\x1a\n"
VERSION_MAJOR = 1
FLAG_CRC32C = 0x1  # header flag bit 0 (format 1.1): every checksum of the file is CRC-32C
KNOWN_FLAGS = FLAG_CRC32C
VERSIONS = {"1.0": 0, "1.1": FLAG_CRC32C}  # what a writer may create: its header flags
DEFAULT_VERSION = "1.1"

MIN_ALIGNMENT = 8
MAX_ALIGNMENT = 1 << 16
DEFAULT_ALIGNMENT = 64
MAX_WRITER_INFO = 1024
MAX_SEGMENTS = 4096
MAX_METADATA = 64 << 20

# header: magic, major, minor, flags, alignment, header_length, file_id, created_ns, writer_len
HEADER_FIXED = struct.Struct("<8sHHIII16sQH")
HEADER_CRC = struct.Struct("<I")  # crc32 of everything before it, after the writer info
HEADER_MIN = HEADER_FIXED.size + HEADER_CRC.size

# record frame header: magic, crc32 of payload, payload length
FRAME = struct.Struct("<4sIQ")
FRAME_MAGIC = b"EVR1"
FRAME_SIZE = FRAME.size
FRAME_CRC_AT = len(FRAME_MAGIC)  # byte offsets of the crc32 and the length in the frame header
FRAME_LENGTH_AT = struct.calcsize("<4sI")

# index entry: record frame offset, payload length, payload crc32, reserved (0)
ENTRY = struct.Struct("<QQII")
ENTRY_SIZE = ENTRY.size
ENTRY_DTYPE = np.dtype([("offset", "<u8"), ("length", "<u8"), ("crc", "<u4"), ("reserved", "<u4")])

# footer: magic, file_id, commit, record_count, prev_footer, metadata offset/length/crc, n_segments
FOOTER_FIXED = struct.Struct("<8s16sQQQQQII")
FOOTER_MAGIC = b"EVSFOOT1"
SEGMENT = struct.Struct("<QQII")  # offset, record count, crc32 of its entries, level
TRAILER = struct.Struct("<QII8s")  # footer offset, footer length, crc32, end magic
TRAILER_MAGIC = b"EVSEND01"
TRAILER_UNCHECKED = struct.calcsize("<I8s")  # the trailer's crc32 and magic: not checksummed
MAX_FOOTER = FOOTER_FIXED.size + MAX_SEGMENTS * SEGMENT.size + TRAILER.size
SEARCH_CHUNK = 1 << 20  # bytes of tail read at a time by the backward search


def valid_alignment(alignment: int) -> bool:
    """The header's alignment rule: a power of two in [MIN_ALIGNMENT, MAX_ALIGNMENT]."""
    return MIN_ALIGNMENT <= alignment <= MAX_ALIGNMENT and not alignment & (alignment - 1)


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) & ~(alignment - 1)


# A checksum function: (bytes-like, running value) -> u32, taking any contiguous buffer
# without a copy and releasing the GIL for big ones. CRC-32 (zlib's) is every 1.0 file's;
# CRC-32C the one of files with FLAG_CRC32C. Both are evalue_store._native's (the C++
# reader's code: SSE4.2 / ARMv8 CRC-32C, PCLMULQDQ CRC-32, tables elsewhere), equal to
# zlib.crc32 and crc32c.crc32c and at least as fast at every size (benchmarks/crc_speed.py).
Checksum = Callable[..., int]
crc32: Checksum = _native.crc32
crc32c: Checksum = _native.crc32c


def checksum_function(flags: int) -> Checksum:
    """The checksum of every field of a file whose header has ``flags`` (FORMAT.md 3.1)."""
    return crc32c if flags & FLAG_CRC32C else crc32


def checksum_name(flags: int) -> str:
    """The name reports give that checksum: a key of CHECKSUM_TITLES."""
    return "crc32c" if flags & FLAG_CRC32C else "crc32"


CHECKSUM_TITLES = {"crc32": "CRC-32", "crc32c": "CRC-32C"}  # as people write them


def version_flags(version: str) -> int:
    """The header flags of a new file of format ``version`` ("1.0" or "1.1")."""
    if version not in VERSIONS:
        raise UsageError(f"format version must be one of {sorted(VERSIONS)}, not {version!r}")
    return VERSIONS[version]


@dataclass(frozen=True)
class Header:
    alignment: int
    file_id: bytes
    created_ns: int
    writer: str
    minor: int
    data_start: int  # first block offset: header length rounded up to the alignment
    length: int  # header_length: the fixed fields, the writer info and the checksum
    flags: int = 0

    @property
    def checksum(self) -> Checksum:
        """The file's checksum function, ``checksum(data, start=0)``: the one place every
        checksum of this file is computed with (bind it once on hot paths)."""
        return checksum_function(self.flags)

    @property
    def checksum_name(self) -> str:
        return checksum_name(self.flags)

    @property
    def version(self) -> str:
        return f"{VERSION_MAJOR}.{self.minor}"


def encode_header(
    alignment: int, file_id: bytes, created_ns: int, writer: str, flags: int = FLAG_CRC32C
) -> bytes:
    """A new file's header; format 1.1 (minor 1) when it sets a flag, else 1.0."""
    info = writer.encode("utf-8")[:MAX_WRITER_INFO]
    length = HEADER_FIXED.size + len(info) + HEADER_CRC.size
    minor = 1 if flags else 0  # the lowest minor whose features the file uses
    fixed = HEADER_FIXED.pack(
        MAGIC, VERSION_MAJOR, minor, flags, alignment, length, file_id, created_ns, len(info)
    )
    body = fixed + info
    body += HEADER_CRC.pack(checksum_function(flags)(body))
    return body + bytes(align_up(length, alignment) - length)


def parse_header(read: Callable[[int, int], bytes], size: int) -> Header:
    """Parse and check the header; ``read(offset, n)`` returns file bytes."""
    if size == 0:
        raise FormatError("empty file, not an evalue_store container", 0, code=NOT_A_CONTAINER)
    head = bytes(read(0, min(size, HEADER_FIXED.size)))
    if len(head) < len(MAGIC) or head[: len(MAGIC)] != MAGIC:
        raise FormatError("bad magic: not an evalue_store container", 0, code=NOT_A_CONTAINER)
    if len(head) < HEADER_FIXED.size:
        raise FormatError(f"truncated header: file has {size} bytes", size, code=TRUNCATED)
    magic, major, minor, flags, alignment, length, file_id, created, wlen = HEADER_FIXED.unpack(
        head
    )
    if major != VERSION_MAJOR:
        raise FormatError(
            f"unsupported format version {major}.{minor} (reader knows 1.x)", 8, code=UNSUPPORTED
        )
    if flags & ~KNOWN_FLAGS:
        raise FormatError(f"unknown header flags {flags:#x}", 12, code=UNSUPPORTED)
    if not valid_alignment(alignment):
        raise FormatError(
            f"alignment {alignment} is not a power of two in [8, 65536]", 16, code=HEADER
        )
    if wlen > MAX_WRITER_INFO or length != HEADER_FIXED.size + wlen + HEADER_CRC.size:
        raise FormatError(
            f"header length {length} disagrees with writer info length {wlen}", 20, code=HEADER
        )
    data_start = align_up(length, alignment)
    if size < data_start:
        raise FormatError(
            f"truncated header: needs {data_start} bytes, file has {size}", size, code=TRUNCATED
        )
    body = bytes(read(0, length))
    crc_at = length - HEADER_CRC.size
    (stored,) = HEADER_CRC.unpack_from(body, crc_at)
    if checksum_function(flags)(body[:crc_at]) != stored:  # with the function flags name
        raise FormatError("header checksum mismatch", crc_at, code=CHECKSUM)
    writer = body[HEADER_FIXED.size : HEADER_FIXED.size + wlen].decode("utf-8", "replace")
    return Header(alignment, file_id, created, writer, minor, data_start, length, flags)


@dataclass(frozen=True)
class Segment:
    """One index segment: ``count`` entries of ENTRY_SIZE bytes at ``offset``."""

    offset: int
    count: int
    crc: int
    level: int


@dataclass(frozen=True)
class Commit:
    """The state a footer describes. ``end`` is the offset just past the footer."""

    number: int
    record_count: int
    footer_offset: int
    end: int
    prev_footer: int
    metadata_offset: int
    metadata_length: int
    metadata_crc: int
    segments: tuple[Segment, ...] = field(default_factory=tuple)


def encode_footer(offset: int, file_id: bytes, commit: Commit, checksum: Checksum) -> bytes:
    parts = [
        FOOTER_FIXED.pack(
            FOOTER_MAGIC,
            file_id,
            commit.number,
            commit.record_count,
            commit.prev_footer,
            commit.metadata_offset,
            commit.metadata_length,
            commit.metadata_crc,
            len(commit.segments),
        )
    ]
    parts += [SEGMENT.pack(s.offset, s.count, s.crc, s.level) for s in commit.segments]
    body = b"".join(parts)
    length = len(body) + TRAILER.size
    unsigned = TRAILER.pack(offset, length, 0, TRAILER_MAGIC)
    crc = checksum(unsigned[: TRAILER.size - TRAILER_UNCHECKED], checksum(body))
    return body + TRAILER.pack(offset, length, crc, TRAILER_MAGIC)


def empty_commit(data_start: int) -> Commit:
    """The state of a file with no valid footer: no records, everything after the header is tail."""
    return Commit(0, 0, 0, data_start, 0, 0, 0, 0, ())


def parse_footer_at(
    read: Callable[[int, int], bytes], trailer_end: int, header: Header
) -> Commit | None:
    """The commit whose trailer ends at ``trailer_end``, or None if no valid footer ends there.

    None (not an error) because a torn or overwritten footer is exactly what a crash leaves
    behind; the caller then looks further back.
    """
    if trailer_end - TRAILER.size < header.data_start:
        return None
    trailer = bytes(read(trailer_end - TRAILER.size, TRAILER.size))
    found = _footer_candidate(read, trailer, trailer_end, header)
    return None if found is None else _parse_footer(read, trailer_end, header, *found)


def _footer_candidate(
    read: Callable[[int, int], bytes], trailer: bytes, trailer_end: int, header: Header
) -> tuple[int, int, int] | None:
    """(offset, length, crc) of the footer a trailer points to, if every field that costs no
    hashing is right: the trailer's own fields, then the footer's magic, file_id and segment
    count. Only a candidate passing these is worth its checksum."""
    offset, length, stored_crc, magic = TRAILER.unpack(trailer)
    if magic != TRAILER_MAGIC or offset % header.alignment or offset < header.data_start:
        return None
    fixed_and_trailer = FOOTER_FIXED.size + TRAILER.size
    if length < fixed_and_trailer or offset + length != trailer_end:
        return None
    n_segments = (length - fixed_and_trailer) // SEGMENT.size
    if n_segments > MAX_SEGMENTS or fixed_and_trailer + n_segments * SEGMENT.size != length:
        return None
    magic, file_id, *_, count = FOOTER_FIXED.unpack(bytes(read(offset, FOOTER_FIXED.size)))
    if magic != FOOTER_MAGIC or file_id != header.file_id or count != n_segments:
        return None
    return offset, length, stored_crc


def _parse_footer(
    read: Callable[[int, int], bytes],
    trailer_end: int,
    header: Header,
    offset: int,
    length: int,
    stored_crc: int,
) -> Commit | None:
    """The commit of a candidate footer, or None if its checksum does not match."""
    body = bytes(read(offset, length))
    if header.checksum(body[: length - TRAILER_UNCHECKED]) != stored_crc:
        return None
    (_, _, number, count, prev, meta_off, meta_len, meta_crc, n) = FOOTER_FIXED.unpack_from(body)
    segments = tuple(
        Segment(*SEGMENT.unpack_from(body, FOOTER_FIXED.size + k * SEGMENT.size)) for k in range(n)
    )
    commit = Commit(
        number, count, offset, trailer_end, prev, meta_off, meta_len, meta_crc, segments
    )
    _check_commit(commit, header)
    return commit


def parse_footer_from(
    read: Callable[[int, int], bytes], offset: int, limit: int, header: Header
) -> Commit | None:
    """The commit whose footer starts at ``offset`` (used to walk the chain of old footers)."""
    if offset < header.data_start or offset + FOOTER_FIXED.size > limit:
        return None
    n_segments = FOOTER_FIXED.unpack(bytes(read(offset, FOOTER_FIXED.size)))[-1]
    end = offset + FOOTER_FIXED.size + n_segments * SEGMENT.size + TRAILER.size
    if n_segments > MAX_SEGMENTS or end > limit:
        return None
    return parse_footer_at(read, end, header)


def _check_commit(commit: Commit, header: Header) -> None:
    """Reject a checksum-valid footer whose contents are impossible (hostile or buggy writer)."""
    where = commit.footer_offset
    total = 0
    for k, seg in enumerate(commit.segments):
        if seg.offset % header.alignment or seg.offset < header.data_start:
            raise FormatError(
                f"index segment {k} at bad offset {seg.offset}", where, code=OUT_OF_BOUNDS
            )
        if seg.count == 0 or seg.offset + seg.count * ENTRY_SIZE > commit.footer_offset:
            raise FormatError(
                f"index segment {k} ({seg.count} entries) overruns the footer",
                where,
                code=OUT_OF_BOUNDS,
            )
        total += seg.count
    if total != commit.record_count:
        raise FormatError(
            f"footer counts {commit.record_count} records but its segments hold {total}",
            where,
            code=INDEX,
        )
    spans = sorted((seg.offset, seg.offset + seg.count * ENTRY_SIZE) for seg in commit.segments)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:  # else an index of n entries could count as 4096 n records
            raise FormatError(f"index segments overlap at {start}", where, code=INDEX)
    if commit.metadata_length:
        if commit.metadata_length > MAX_METADATA or commit.metadata_offset < header.data_start:
            raise FormatError("metadata block out of bounds", where, code=OUT_OF_BOUNDS)
        if commit.metadata_offset + commit.metadata_length > commit.footer_offset:
            raise FormatError("metadata block overruns the footer", where, code=OUT_OF_BOUNDS)
    elif commit.metadata_offset or commit.metadata_crc:  # "no metadata" has one encoding
        raise FormatError(
            "no metadata (length 0) but a metadata offset or checksum", where, code=METADATA
        )
    if commit.prev_footer >= commit.footer_offset:
        raise FormatError("previous footer does not precede this one", where, code=COMMIT)
    if commit.number == 0 or (commit.number == 1) != (commit.prev_footer == 0):
        reason = f"commit {commit.number} with previous footer {commit.prev_footer}"
        raise FormatError(f"{reason}: only commit 1 has none", where, code=COMMIT)


def open_container(source: Any) -> tuple[Header, Commit]:
    """The header and last commit of the container a source (plain or compressed; see the
    source protocol in ``plain``) holds: what readers, writers and recovery all start from."""
    header = parse_header(source.read, source.size)
    source.set_alignment(header.alignment)
    return header, source.last_commit(header)


def find_last_commit(read: Callable[[int, int], bytes], size: int, header: Header) -> Commit:
    """The last valid commit in a file of ``size`` bytes.

    A cleanly closed file ends with its footer: one check. After a crash (or while a writer
    is appending) the file has a tail after its last footer; the search walks backwards
    from the end over trailer magics (docs/FORMAT.md section 9). It reads the tail once,
    in chunks; each magic costs O(1) checks, and the bytes hashed for candidate footers are
    capped at twice the tail searched plus two of the largest footers, so a hostile tail of
    fake trailers costs time linear in its size and then raises FormatError.
    """
    commit = parse_footer_at(read, size, header)
    if commit is not None:
        return commit
    hashed = 0
    hi = size
    while hi - header.data_start >= len(TRAILER_MAGIC):
        lo = max(header.data_start, hi - SEARCH_CHUNK)
        chunk = bytes(read(lo, hi - lo))
        pos = len(chunk)
        while (hit := chunk.rfind(TRAILER_MAGIC, 0, pos)) >= 0:
            pos = hit + len(TRAILER_MAGIC) - 1
            trailer_end = lo + hit + len(TRAILER_MAGIC)
            start = trailer_end - TRAILER.size
            if trailer_end == size or start < header.data_start:
                continue
            if start >= lo:
                trailer = chunk[start - lo : hit + len(TRAILER_MAGIC)]
            else:
                trailer = bytes(read(start, TRAILER.size))
            found = _footer_candidate(read, trailer, trailer_end, header)
            if found is None:
                continue
            hashed += found[1]
            if hashed > 2 * (size - trailer_end) + 2 * MAX_FOOTER:
                raise FormatError(
                    f"no valid commit found after checksumming {hashed} bytes of candidate "
                    f"footers in the last {size - trailer_end} bytes (a hostile tail?)",
                    trailer_end,
                    code=LIMIT,
                )
            commit = _parse_footer(read, trailer_end, header, *found)
            if commit is not None:
                return commit
        if lo == header.data_start:
            break
        hi = lo + len(TRAILER_MAGIC) - 1  # a magic cut by the chunk boundary is found next
    return empty_commit(header.data_start)


def check_frame(
    frame: bytes, offset: int, limit: int, length: int | None = None, crc: int | None = None
) -> tuple[int, int]:
    """Check a record frame header at ``offset``; returns (payload length, payload crc).

    ``limit`` bounds where the payload may end; ``length``/``crc`` are what the index says.
    """
    magic, frame_crc, frame_len = FRAME.unpack(frame)
    if magic != FRAME_MAGIC:
        raise FormatError("no record frame here (bad frame magic)", offset, code=INDEX)
    if offset + FRAME_SIZE + frame_len > limit:
        raise FormatError(
            f"record length {frame_len} runs past the committed data", offset, code=OUT_OF_BOUNDS
        )
    if length is not None and (frame_len != length or frame_crc != crc):
        raise FormatError("record frame disagrees with its index entry", offset, code=INDEX)
    return frame_len, frame_crc


def scan_frames(
    read: Callable[[int, int], bytes],
    start: int,
    end: int,
    header: Header,
    validate: Callable[[int, int], None],
) -> tuple[list[tuple[int, int, int]], int]:
    """Walk complete, checksum-valid record frames from ``start``; stops at the first bad one.

    Returns ([(offset, length, crc), ...], offset just past the last good frame). ``validate``
    (offset, length) may raise FormatError to reject a frame whose payload does not decode.
    """
    found = []
    pos = start
    good_end = start
    checksum = header.checksum
    while pos + FRAME_SIZE <= end:
        try:
            length, crc = check_frame(bytes(read(pos, FRAME_SIZE)), pos, end)
            if checksum(read(pos + FRAME_SIZE, length)) != crc:
                break
            validate(pos, length)
        except FormatError:
            break
        found.append((pos, length, crc))
        good_end = pos + FRAME_SIZE + length
        pos = align_up(good_end, header.alignment)
    return found, good_end


def new_file_id() -> bytes:
    return os.urandom(16)
