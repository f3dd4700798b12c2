"""The indexed zstd layout's own structures (docs/FRAMES.md, layout 2), declared once.

A file is a layout frame, then one group per commit: the commit's data frames (standard
zstd frames of the container's bytes), a run frame of record locators if the commit added
records, a map frame listing the group's data frames, and the index block that ends the
group and makes the commit visible. All but the data frames are skippable frames, so stock
``zstd -d`` writes the plain container. Open reads the last index block (a fixed size plus
one descriptor per locator run); a lookup reads one checksummed locator group and the frames
it names. Every size read here is checked against the file before it is used.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .. import container
from ..errors import CHECKSUM, LAYOUT, LIMIT, TRUNCATED, UNSUPPORTED, FormatError
from .zframe import SKIPPABLE_HEADER, SKIPPABLE_HEADER_SIZE

checksum = container.crc32c  # CRC-32C, whatever the container's (FRAMES.md section 6)

LAYOUT_MAGIC = 0x184D2A5B  # skippable: the layout frame, first in the file
RUN_MAGIC = 0x184D2A5A  # skippable: a run of record locators
MAP_MAGIC = 0x184D2A59  # skippable: the sizes of a group's data frames
INDEX_MAGIC = 0x184D2A5C  # skippable: the index block ending a group
LAYOUT_TAG = b"EVZ2"
LAYOUT_VERSION = 2
LAYOUT_HEAD = struct.Struct("<4sHHI")  # tag, version, flags, dictionary size
INDEX_TAG = b"EVZI"
MAX_DICT_SIZE = 1 << 20

EXTENT = struct.Struct("<QQI")  # file offset, logical offset, file bytes
BLOCK = struct.Struct("<QQQQQQIIII" + "QQI" * 3)
"""Index block body: group start, logical start, logical end, previous block, record count,
map offset, frame count, run count, first frame logical size, largest frame logical size,
then three extents: footer, metadata, first frame."""
RUN = struct.Struct("<QQQ")  # run frame offset, first record, record count
BLOCK_TRAILER = struct.Struct("<II4s")  # checksum, block size, tag
FRAME_SIZES = struct.Struct("<II")  # a map entry: compressed size, logical size
MAP_CHECKSUM = struct.Struct("<I")
LOCATOR = struct.Struct("<QQII")  # logical offset, file offset, span, position
LOCATOR_DTYPE = np.dtype(
    [("logical", "<u8"), ("physical", "<u8"), ("span", "<u4"), ("position", "<u4")]
)
GROUP = 16  # locators per checksummed group
GROUP_BYTES = GROUP * LOCATOR.size + 4
FIXED_BLOCK = SKIPPABLE_HEADER_SIZE + BLOCK.size + BLOCK_TRAILER.size
MAX_RUNS = 4096
MAX_BLOCK = FIXED_BLOCK + MAX_RUNS * RUN.size
SPAN_UNKNOWN = 0xFFFFFFFF  # a record whose frames take 4 GiB or more: found by the map
CRC_RESIDUE = checksum(bytes(4))  # CRC-32C of bytes followed by their CRC: 0x48674BC7


class Extent(NamedTuple):
    """Consecutive data frames: where they start in the file and in the logical stream, and
    how many file bytes they take."""

    physical: int
    logical: int
    span: int


class Run(NamedTuple):
    offset: int
    first: int
    count: int


@dataclass(frozen=True)
class Block:
    """A parsed, checked index block (``offset``: its file offset, ``size``: its bytes)."""

    offset: int
    size: int
    group_start: int
    logical_start: int
    logical_end: int
    previous: int
    record_count: int
    map_offset: int
    frame_count: int
    first: Extent  # the file's first data frame: the container header
    first_logical_size: int
    largest: int  # logical size of the largest data frame in the file
    footer: Extent
    metadata: Extent
    runs: tuple[Run, ...]

    @property
    def end(self) -> int:
        return self.offset + self.size


def pread_exact(reader: Any, offset: int, n: int) -> Any:
    """``n`` bytes at ``offset``, or a FormatError: a file that ends sooner (cut, or cut
    while it was being read) is the caller's to judge, never a short buffer to unpack."""
    data = reader.pread(offset, n)
    if len(data) != n:
        raise FormatError(f"file ends before byte {offset + n}", offset, code=TRUNCATED)
    return data


def layout_frame(dictionary: bytes | None) -> bytes:
    """The frame a new file starts with; it carries the dictionary, if any."""
    dictionary = dictionary or b""
    head = LAYOUT_HEAD.pack(LAYOUT_TAG, LAYOUT_VERSION, 0, len(dictionary))
    return SKIPPABLE_HEADER.pack(LAYOUT_MAGIC, len(head) + len(dictionary)) + head + dictionary


def read_layout(reader: Any) -> tuple[int, bytes | None]:
    """(end of the layout frame, dictionary or None) of a layout-2 file."""
    head = bytes(pread_exact(reader, 0, SKIPPABLE_HEADER_SIZE + LAYOUT_HEAD.size))
    magic, size = SKIPPABLE_HEADER.unpack_from(head)
    tag, version, flags, dict_size = LAYOUT_HEAD.unpack_from(head, SKIPPABLE_HEADER_SIZE)
    if magic != LAYOUT_MAGIC or tag != LAYOUT_TAG:
        raise FormatError("not a layout frame", 0, code=LAYOUT)
    if version != LAYOUT_VERSION or flags:
        raise FormatError(
            f"layout version {version} flags {flags:#x} not supported", 12, code=UNSUPPORTED
        )
    if dict_size > MAX_DICT_SIZE:
        reason = f"layout frame claims a {dict_size}-byte dictionary, over {MAX_DICT_SIZE}"
        raise FormatError(reason, 16, code=LAYOUT)
    if size != LAYOUT_HEAD.size + dict_size:
        reason = f"layout frame: Frame_Size {size} is not {LAYOUT_HEAD.size} + Dictionary_Size"
        reason += f" {dict_size}"
        raise FormatError(reason, 4, code=LAYOUT)
    end = SKIPPABLE_HEADER_SIZE + size
    if end > reader.size:
        raise FormatError("file ends inside its layout frame", 0, code=TRUNCATED)
    if not dict_size:
        return end, None
    return end, bytes(pread_exact(reader, end - dict_size, dict_size))


def encode_block(fields: dict, runs: list[Run]) -> bytes:
    """An index block; ``fields`` are Block's, without offset, size and runs."""
    body = BLOCK.pack(
        fields["group_start"],
        fields["logical_start"],
        fields["logical_end"],
        fields["previous"],
        fields["record_count"],
        fields["map_offset"],
        fields["frame_count"],
        len(runs),
        fields["first_logical_size"],
        fields["largest"],
        *fields["footer"],
        *fields["metadata"],
        *fields["first"],
    ) + b"".join(RUN.pack(*r) for r in runs)
    size = SKIPPABLE_HEADER_SIZE + len(body) + BLOCK_TRAILER.size
    head = SKIPPABLE_HEADER.pack(INDEX_MAGIC, size - SKIPPABLE_HEADER_SIZE)
    return head + body + BLOCK_TRAILER.pack(checksum(body), size, INDEX_TAG)


def parse_block(data: Any, offset: int, layout_end: int) -> Block:
    """The index block ``data`` (its bytes, from file offset ``offset``), checked: tags,
    sizes, checksum, and that everything it points at lies in the file before it."""

    def fail(reason: str, at: int = 0, code: str = LAYOUT) -> FormatError:
        return FormatError(f"index block at {offset}: {reason}", offset + at, code=code)

    size = len(data)
    if size < FIXED_BLOCK:
        raise fail(f"{size} bytes cannot hold an index block")
    crc, stated, tag = BLOCK_TRAILER.unpack_from(data, size - BLOCK_TRAILER.size)
    magic, frame_size = SKIPPABLE_HEADER.unpack_from(data)
    if tag != INDEX_TAG or stated != size or magic != INDEX_MAGIC or frame_size + 8 != size:
        raise fail("tag, magic or size disagree")
    body = memoryview(data)[SKIPPABLE_HEADER_SIZE : size - BLOCK_TRAILER.size]
    if checksum(body) != crc:
        raise fail("checksum mismatch", size - BLOCK_TRAILER.size, CHECKSUM)
    v = BLOCK.unpack_from(body)
    (gstart, lstart, lend, prev, records, map_off, frames, nruns, first_lsize, largest) = v[:10]
    footer, metadata, first = Extent(*v[10:13]), Extent(*v[13:16]), Extent(*v[16:19])
    if nruns > MAX_RUNS or BLOCK.size + nruns * RUN.size != len(body):
        raise fail(f"{nruns} runs do not fill the block")
    runs = tuple(Run(*RUN.unpack_from(body, BLOCK.size + k * RUN.size)) for k in range(nruns))
    map_size = SKIPPABLE_HEADER_SIZE + frames * FRAME_SIZES.size + MAP_CHECKSUM.size
    if not layout_end <= gstart <= map_off or map_off + map_size != offset:
        raise fail("its group's frames and map do not end at the block")
    if prev and not layout_end <= prev < gstart or not prev and gstart != layout_end:
        raise fail("previous block out of place")
    if lstart > lend or lend >= 1 << 62 or not prev and lstart:
        raise fail("logical range out of order")
    if first.physical != layout_end or not 0 < first.span <= min(offset, 1 << 32):
        raise fail("first frame out of place")
    for name, ext in (("footer", footer), ("metadata", metadata)):
        if ext.span and not (gstart <= ext.physical and ext.physical + ext.span <= map_off):
            raise fail(f"{name} extent outside its group")
    total = 0
    for run in runs:
        if run.first != total or not run.count or not layout_end <= run.offset < map_off:
            raise fail("runs do not cover the records in order")
        total += run.count
    if total != records:
        raise fail(f"runs hold {total} records, the block says {records}")
    return Block(
        offset,
        size,
        gstart,
        lstart,
        lend,
        prev,
        records,
        map_off,
        frames,
        first,
        first_lsize,
        largest,
        footer,
        metadata,
        runs,
    )


def block_size_at(reader: Any, end: int, layout_end: int) -> int:
    """The size of the index block the trailer ending at ``end`` claims, if the trailer's
    own fields allow one there (cheap checks, no hashing), else FormatError."""
    if end - layout_end < FIXED_BLOCK:
        raise FormatError(f"no index block ends at {end}", end, code=LAYOUT)
    tail = bytes(pread_exact(reader, end - BLOCK_TRAILER.size, BLOCK_TRAILER.size))
    _, size, tag = BLOCK_TRAILER.unpack(tail)
    if tag != INDEX_TAG or not FIXED_BLOCK <= size <= end - layout_end:
        raise FormatError(f"no index block ends at {end}", end - 4, code=LAYOUT)
    if size > MAX_BLOCK:
        raise FormatError(f"index block claims {size} bytes", end - 8, code=LAYOUT)
    return size


def read_block(reader: Any, end: int, layout_end: int, size: int | None = None) -> Block:
    """The index block that ends at file offset ``end`` (``size``: its checked claim)."""
    if size is None:
        size = block_size_at(reader, end, layout_end)
    return parse_block(pread_exact(reader, end - size, size), end - size, layout_end)


def find_last_block(reader: Any, size: int, layout_end: int) -> Block | None:
    """The last valid index block: the one ending the file, or (a torn tail) the last one
    found searching backwards for its tag. The candidates read in full (their claimed
    size each) may total 2 x size + 1 MiB, so a tail of fake ones costs linear time."""
    try:
        return read_block(reader, size, layout_end)
    except FormatError:
        pass
    budget = 2 * size + (1 << 20)
    hi = size
    while hi > layout_end:
        lo = max(layout_end, hi - (1 << 20))
        chunk = bytes(pread_exact(reader, lo, hi - lo))
        top = len(chunk)
        while (p := chunk.rfind(INDEX_TAG, 0, top)) >= 0:
            top = p + 3
            end = lo + p + 4
            start = p + 4 - BLOCK_TRAILER.size
            if start >= 0:  # the trailer's claim, checked from the chunk (as block_size_at
                # does: a tail of tags cost a read and an exception each, 0.75 s a MiB)
                claimed = BLOCK_TRAILER.unpack_from(chunk, start)[1]
                if not FIXED_BLOCK <= claimed <= min(end - layout_end, MAX_BLOCK):
                    continue
            else:
                try:
                    claimed = block_size_at(reader, end, layout_end)
                except FormatError:
                    continue
            budget -= claimed
            if budget < 0:
                raise FormatError(
                    "too many candidate index blocks; giving up the search", lo + p, code=LIMIT
                )
            try:
                return read_block(reader, end, layout_end, claimed)
            except FormatError:
                continue
        if lo == layout_end:
            break
        hi = lo + 3
    return None


def read_map(reader: Any, block: Block) -> tuple[np.ndarray, np.ndarray]:
    """(compressed sizes, logical sizes) of the data frames of ``block``'s group, checked
    against its checksum and against the group's bounds."""
    n = block.frame_count
    at = block.map_offset
    data = pread_exact(reader, at, block.offset - at)
    magic, frame_size = SKIPPABLE_HEADER.unpack_from(data)
    body = memoryview(data)[SKIPPABLE_HEADER_SIZE:]
    if magic != MAP_MAGIC or frame_size != len(body):
        raise FormatError("map frame: magic or size disagree", at, code=LAYOUT)
    if checksum(body[:-4]) != MAP_CHECKSUM.unpack_from(body, len(body) - 4)[0]:
        raise FormatError("map frame: checksum mismatch", at, code=CHECKSUM)
    sizes = np.frombuffer(body[:-4], "<u4").reshape(n, 2).astype(np.int64)
    csizes, lsizes = sizes[:, 0], sizes[:, 1]
    runs_here = [r.offset for r in block.runs if r.offset >= block.group_start]
    data_end = runs_here[-1] if runs_here else at
    if int(csizes.sum()) != data_end - block.group_start or (n and int(csizes.min()) < 9):
        raise FormatError("map frame: its frames do not fill the group", at, code=LAYOUT)
    if int(lsizes.sum()) != block.logical_end - block.logical_start:
        raise FormatError(
            "map frame: its frames do not hold the group's logical bytes", at, code=LAYOUT
        )
    return csizes, lsizes


def encode_map(csizes: list[int], lsizes: list[int]) -> bytes:
    pairs = np.empty((len(csizes), 2), "<u4")
    pairs[:, 0] = csizes
    pairs[:, 1] = lsizes
    body = pairs.tobytes()
    body += MAP_CHECKSUM.pack(checksum(body))
    return SKIPPABLE_HEADER.pack(MAP_MAGIC, len(body)) + body


def run_frame(locators: np.ndarray) -> bytes:
    """A run frame: locators in groups of GROUP, each group followed by its checksum."""
    raw = locators.astype(LOCATOR_DTYPE, copy=False).tobytes()
    step = GROUP * LOCATOR.size
    parts = []
    for at in range(0, len(raw), step):
        piece = raw[at : at + step]
        parts += (piece, MAP_CHECKSUM.pack(checksum(piece)))
    body = b"".join(parts)
    return SKIPPABLE_HEADER.pack(RUN_MAGIC, len(body)) + body


def run_size(count: int) -> int:
    return SKIPPABLE_HEADER_SIZE + count * LOCATOR.size + 4 * -(-count // GROUP)


def read_run(reader: Any, run: Run) -> np.ndarray:
    """Every locator of ``run``, each group's checksum checked (a merge, a verify)."""
    size = run_size(run.count)
    data = pread_exact(reader, run.offset, size)
    magic, frame_size = SKIPPABLE_HEADER.unpack_from(data)
    if magic != RUN_MAGIC or frame_size + SKIPPABLE_HEADER_SIZE != size:
        raise FormatError("run frame: magic or size disagree", run.offset, code=LAYOUT)
    out = np.empty(run.count, LOCATOR_DTYPE)
    view = memoryview(data)
    for g in range(-(-run.count // GROUP)):
        n = min(GROUP, run.count - g * GROUP)
        at = SKIPPABLE_HEADER_SIZE + g * GROUP_BYTES
        body = view[at : at + n * LOCATOR.size]
        if checksum(body) != MAP_CHECKSUM.unpack_from(view, at + n * LOCATOR.size)[0]:
            raise FormatError(
                f"locator group {g}: checksum mismatch", run.offset + at, code=CHECKSUM
            )
        out[g * GROUP : g * GROUP + n] = np.frombuffer(body, LOCATOR_DTYPE)
    return out


def chain(reader: Any, last: Block, layout_end: int) -> Iterator[Block]:
    """The index blocks from ``last`` back to the first, each checked to chain to the next."""
    block = last
    while True:
        yield block
        if not block.previous:
            return
        prev = read_block(reader, block.group_start, layout_end)
        if prev.offset != block.previous or prev.logical_end != block.logical_start:
            raise FormatError("index blocks do not chain", block.offset, code=LAYOUT)
        block = prev


def frame_map(reader: Any, last: Block, layout_end: int) -> tuple[np.ndarray, ...]:
    """(file offsets, logical offsets, compressed sizes, logical sizes) of every data frame,
    from the chain of index blocks ending at ``last``: what a sequential pass or a read of
    old bytes needs (a lookup never does)."""
    parts = []
    for block in chain(reader, last, layout_end):
        csizes, lsizes = read_map(reader, block)
        parts.append((block.group_start, block.logical_start, csizes, lsizes))
    parts.reverse()
    phys, logi = [], []
    for gstart, lstart, csizes, lsizes in parts:
        phys.append(gstart + np.concatenate(([0], np.cumsum(csizes)[:-1])))
        logi.append(lstart + np.concatenate(([0], np.cumsum(lsizes)[:-1])))
    cs = np.concatenate([p[2] for p in parts])
    ls = np.concatenate([p[3] for p in parts])
    return (
        np.concatenate(phys).astype(np.int64),
        np.concatenate(logi).astype(np.int64),
        cs,
        ls,
    )
