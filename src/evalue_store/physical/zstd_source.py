"""Reading a layout-2 (indexed) compressed file through a byte reader (docs/FRAMES.md).

Open reads the layout frame and the last index block; a record lookup reads one locator
group (checksummed) and then the frames the locator names, so a cold ``ds[i]`` costs two
bounded preads whatever the record or frame count, on a local file or a remote one. Reads
of other logical bytes use the extents the index block names (header, footer, metadata) and,
for anything older, the frame map built once from the chain of index blocks.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np
import zstandard

from .._native import ZstdGet
from ..buffers import read_only
from ..container import ENTRY, FRAME, FRAME_MAGIC, Commit, Header, parse_footer_at
from ..errors import (
    CHECKSUM,
    COMMIT,
    DICTIONARY,
    LAYOUT,
    LIMIT,
    OUT_OF_BOUNDS,
    TRUNCATED,
    ZSTD_FRAME,
    FormatError,
)
from .zframe import (
    SKIPPABLE_HEADER_SIZE,
    SMALL_FRAME,
    FrameError,
    LogicalReads,
    aligned_bytes,
    aligned_empty,
    check_frame,
    decompress_into,
    decompress_small,
)
from .zstd_layout import (
    CRC_RESIDUE,
    GROUP,
    GROUP_BYTES,
    LOCATOR,
    SPAN_UNKNOWN,
    Extent,
    Run,
    checksum,
    find_last_block,
    frame_map,
    read_layout,
)
from .zstd_pass import FramePasses

MAX_HINTS = 1 << 14  # records located but not yet read (a batch's lookups come first)
MAX_GROUPS = 1 << 16  # locator groups kept (16 locators each: 25 MiB at most)
LOCATOR_AT = LOCATOR.unpack_from
LOCATOR_SIZE = LOCATOR.size
FRAME_SIZE = FRAME.size
FRAME_SLACK = 4 << 10  # a frame's own bytes beyond its blocks' (header, checksum), with room


class ZstdSource(FramePasses, LogicalReads):
    """Random access to the logical bytes of a layout-2 file. Decompressed frames are kept
    in an LRU cache of ``cache_bytes``, keyed by their file offset; buffers are placed so
    that a logical offset that is a multiple of the alignment is an aligned address.

    ``record_frame(i)``, the random read ``ds[i]`` makes, is compiled (``_native.ZstdGet``,
    which also holds the cache the general path here uses): record ``i`` (0 <= i < record
    count) found through its locator: (buffer, position of its frame header in it, logical
    offset, payload length, crc, file offset and span of its frame), when the record lies
    within one data frame and every check of the frame layer passes (the caller checks the
    offset and length as FORMAT.md section 10 says). None otherwise: the caller then goes
    the general way (``entry``, ``frame``), which reads any other record or says what is
    wrong. A cold read costs two bounded reads (the locator's group, the frame) and one
    decoder call."""

    compressed = True
    _native: Any = None  # the ZstdGet, once made
    record_frame: Callable[[int], tuple | None]
    checks_content = True  # every frame's content checksum is checked as it is decompressed
    mapped = None  # the logical bytes exist only in decompressed frames

    def __init__(self, reader: Any, *, cache_bytes: int, max_frame_size: int):
        self.reader = reader
        self.layout_end, self.dictionary = read_layout(reader)
        block = find_last_block(reader, reader.size, self.layout_end)
        if block is None:
            raise FormatError(
                "compressed file holds no valid index block", reader.size, code=LAYOUT
            )
        if block.largest > max_frame_size:
            reason = (
                f"frames of up to {block.largest} bytes, over the reader cap {max_frame_size} "
                "(open with a larger max_frame_size to read it)"
            )
            raise FormatError(reason, block.offset, code=LIMIT)
        self.block = block
        try:
            self._decode_with(self.dictionary)
        except zstandard.ZstdError as exc:
            raise FormatError(
                f"layout frame holds no usable dictionary: {exc}", 16, code=DICTIONARY
            ) from None
        self.size = block.logical_end
        self.physical_end = block.end  # file bytes up to the last commit
        self.cap = max_frame_size
        self.cache_bytes = cache_bytes
        self.alignment = 64
        self._groups: dict[int, memoryview] = {}  # by file offset
        self._hints: dict[int, Extent] = {}
        self._hot: tuple[int, Any, int] | None = None
        self._last: tuple[int, memoryview] | None = None  # a span's last frame (file offset)
        self._runs = block.runs
        self._run1 = block.runs[0] if len(block.runs) == 1 else None  # the common case
        self._firsts = [r.first for r in block.runs]
        self._extents = [e for e in (block.footer, block.metadata, block.first) if e.span]
        self._map: tuple[np.ndarray, ...] | None = None
        self.commit: Commit | None = None
        native = ZstdGet(
            self.dictionary or None,
            block.runs,
            self.layout_end,
            max_frame_size,
            cache_bytes,
            self.alignment,
            FormatError,
        )
        self._native = native
        self.record_frame = native.record_frame
        self.reader = reader  # (the compiled reads too)

    @property
    def reader(self) -> Any:
        return self._reader

    @reader.setter
    def reader(self, reader: Any) -> None:
        """The byte reader; a local file's mapping (``byteio.MapReader``) is also sliced
        directly by the lookups, which saves a call per read."""
        self._reader = reader
        self._mmap = getattr(reader, "map", None)
        if self._native is not None:
            self._native.read_from(self._mmap, reader.pread)

    def set_alignment(self, alignment: int) -> None:
        if alignment != self.alignment:
            self.alignment = alignment
            self._hot = self._last = None
            self._native.reset(alignment)

    # ------------------------------------------------------------------ frames

    def _decode(self, frame: Any, logical: int) -> tuple[int, memoryview]:
        """(length, bytes) of the checked frame at the start of ``frame``."""
        length, size = check_frame(frame, self.cap, exact=False)
        out = aligned_bytes(size, logical, self.alignment)
        if size <= SMALL_FRAME:
            out[:] = decompress_small(frame[:length], size, self.dctx)
        else:
            decompress_into(frame[:length], out, self.dctx)
        return length, read_only(out)

    def _frames(self, ext: Extent, need: int, strict: bool = True) -> list[tuple[int, Any]]:
        """(logical start, bytes) of the frames of ``ext`` from its first one until logical
        offset ``need`` is covered (``strict``: it must be), read for those not in the
        cache with one pread of what they can take (``_reach``), or, if that falls short,
        one more of the rest of ``ext``: a record's head costs its first frame, not all of
        its frames (a remote record over max_record_bytes is refused after that)."""
        out = []
        phys, logical, end = ext.physical, ext.logical, ext.physical + ext.span
        data, data_at = memoryview(b""), phys
        while logical < need:
            if phys >= end:
                if not strict:
                    break
                raise FormatError(
                    f"frames at {ext.physical} end before logical {need}", phys, code=ZSTD_FRAME
                )
            hit = self._native.cached(phys)
            if hit is not None:
                length, buf = hit
            else:
                while True:
                    if phys >= data_at + len(data):  # nothing of this frame read yet
                        data, data_at = (
                            self._read_frames(phys, self._reach(need - logical, end - phys)),
                            phys,
                        )
                    try:
                        length, buf = self._decode(data[phys - data_at :], logical)
                        break
                    except FrameError as exc:
                        if data_at + len(data) >= end:  # the whole extent was read: damaged
                            raise FormatError(
                                f"frame at {phys}: {exc}", phys, code=ZSTD_FRAME
                            ) from None
                        data, data_at = self._read_frames(phys, end - phys), phys  # it is longer
                self._native.remember(phys, length, buf)
            out.append((logical, buf))
            phys += length
            logical += buf.nbytes
        return out

    def _reach(self, logical: int, most: int) -> int:
        """File bytes enough, in all but a hostile file, for the frames holding the next
        ``logical`` bytes: those bytes and one more frame (the last may run on past them),
        as zstd's worst case (incompressible data) makes them, at most ``most``."""
        n = logical + min(self.block.largest, self.cap)
        return min(most, n + (n >> 7) + FRAME_SLACK)

    def _read_frames(self, phys: int, n: int) -> memoryview:
        data = memoryview(self.reader.pread(phys, n))
        if len(data) != n:
            raise FormatError("file ends inside a frame", phys, code=TRUNCATED)
        return data

    def _located(self, offset: int, n: int) -> list[tuple[int, Any]]:
        """Frames holding logical bytes [offset, offset + n), from the first one holding
        ``offset``: a record just located, an extent the index block names, or else the
        frame map (frames of several groups are not adjacent in the file: one each)."""
        hint = self._hints.get(offset)
        if hint is not None:
            return self._frames(hint, offset + n)
        for ext in self._extents:
            if ext.logical <= offset:
                frames = self._frames(ext, offset + n, strict=False)  # small frames, cached
                start, last = frames[-1]
                if offset + n <= start + last.nbytes:
                    return frames
        phys, logi, csizes, lsizes = self._frame_map()
        k = int(np.searchsorted(logi, offset, side="right")) - 1
        k2 = int(np.searchsorted(logi, offset + max(n, 1) - 1, side="right")) - 1
        out = []
        for j in range(k, k2 + 1):
            ext = Extent(int(phys[j]), int(logi[j]), int(csizes[j]))
            frames = self._frames(ext, ext.logical + 1)
            if len(frames) != 1 or frames[0][1].nbytes != int(lsizes[j]):
                raise FormatError(
                    f"frame at {ext.physical} disagrees with the frame map",
                    ext.physical,
                    code=ZSTD_FRAME,
                )
            out += frames
        return out

    def _frame_map(self) -> tuple[np.ndarray, ...]:
        if self._map is None:
            self._map = frame_map(self.reader, self.block, self.layout_end)
        return self._map

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        """(buffer, position): logical bytes [offset, offset + n) are buffer[position:...]."""
        hot = self._hot  # the record just located, when its frame holds all of it
        if hot is not None and hot[0] == offset and hot[2] + n <= hot[1].nbytes:
            return hot[1], hot[2]
        if offset < 0 or n < 0 or offset + n > self.size:
            raise FormatError(
                f"read of {n} bytes runs past the logical end {self.size}",
                offset,
                code=OUT_OF_BOUNDS,
            )
        frames = self._located(offset, n)
        while len(frames) > 1 and frames[1][0] <= offset:
            frames.pop(0)
        start, buf = frames[0]
        if offset + n <= start + buf.nbytes:
            return buf, offset - start
        out = aligned_empty(n, offset, self.alignment)
        for start, buf in frames:
            lo, hi = max(start, offset), min(start + buf.nbytes, offset + n)
            out[lo - offset : hi - offset] = buf[lo - start : hi - start]
        return read_only(out), 0

    # ------------------------------------------------------------------ records

    def entry(self, at: int, i: int) -> tuple[int, int, int, int]:
        """Record ``i``'s index entry, from its locator and its record header: the index
        itself is never decompressed (its frames are decompressed now, and cached, for the
        read that follows). A locator that cannot be used (damaged, or a record of 4 GiB of
        frames) gives way to the container's index entry at ``at``, read through the frame
        map: a read is right or raises, as a read of the decompressed file would be."""
        found = self.record_frame(i) if i < self.block.record_count else None
        if found is not None:  # the common case, as ds[i] finds it
            buf, position, logical, length, crc, phys, span = found
            self._hint(logical, Extent(phys, logical - position, span))
            self._hot = (logical, buf, position)
            return logical, length, crc, 0
        try:
            located = self._locate(i)
        except FormatError:
            located = None
        if located is None:
            return ENTRY.unpack_from(*self.frame(at, ENTRY.size))
        return located

    def _locator(self, i: int) -> tuple[int, int, int, int] | None:
        """Record ``i``'s locator (logical offset, file offset, span, position) from its
        checked group, when it is usable (FRAMES.md section 9 rule 1); None otherwise."""
        run = self._run1 or self._runs[bisect.bisect_right(self._firsts, i) - 1]
        j = i - run.first
        group = self._groups.get(i - j % GROUP)
        if group is None:
            group = self._read_group(run, i)
            if group is None:
                reason = f"locator group {j // GROUP} of the run at {run.offset}: checksum mismatch"
                raise FormatError(reason, run.offset, code=CHECKSUM)
        logical, phys, span, position = LOCATOR_AT(group, j % GROUP * LOCATOR_SIZE)
        if (
            span == SPAN_UNKNOWN
            or position > logical
            or phys < self.layout_end  # a record's frames lie between the layout frame
            or phys + span > run.offset  # and its run
        ):
            return None
        if logical + FRAME_SIZE > self.size:
            raise FormatError("a locator points past the logical end", logical, code=OUT_OF_BOUNDS)
        return logical, phys, span, position

    def _read_group(self, run: Run, i: int) -> bytes | None:
        """The locator group of ``run`` holding record ``i``, read and checked (FRAMES.md
        section 6 rule 3) and kept by the index of its first record; None if it fails its
        CRC or the file ends before it."""
        run_offset, first, count = run
        g = (i - first) // GROUP
        at = run_offset + SKIPPABLE_HEADER_SIZE + g * GROUP_BYTES
        left = count - g * GROUP  # locators in this group and after it
        size = (GROUP if left > GROUP else left) * LOCATOR_SIZE + 4
        mapped = self._mmap
        data = mapped[at : at + size] if mapped is not None else self.reader.pread(at, size)
        if len(data) != size or checksum(data) != CRC_RESIDUE:  # the locators, then their CRC
            return None
        groups = self._groups
        if len(groups) >= MAX_GROUPS:
            groups.clear()
        groups[first + g * GROUP] = data
        return data

    def _locate(self, i: int) -> tuple[int, int, int, int] | None:
        if i >= self.block.record_count:
            return None
        located = self._locator(i)
        if located is None:
            return None
        logical, phys, span, position = located
        ext = Extent(phys, logical - position, span)
        buf = self._single(ext)
        if buf is None or position + FRAME.size > buf.nbytes:  # the record spans frames
            buf, position = self._record_head(ext, logical)
        magic, crc, length = FRAME.unpack_from(buf, position)
        if magic != FRAME_MAGIC:
            return None
        self._hint(logical, ext)
        fits = position + FRAME.size + length <= buf.nbytes
        self._hot = (logical, buf, position) if fits else None
        return logical, length, crc, 0

    def _hint(self, logical: int, ext: Extent) -> None:
        """Remember where the record at ``logical`` is, for a read that comes later (a batch
        locates all its records first)."""
        if len(self._hints) >= MAX_HINTS:
            self._hints.clear()
        self._hints[logical] = ext

    def _single(self, ext: Extent) -> memoryview | None:
        """The decompressed first frame of ``ext`` when it is cached or is all of ``ext`` (a
        record within one frame, the common case: one read, one decoder call); None
        otherwise (the caller goes frame by frame)."""
        phys, logical, span = ext
        hit = self._native.cached(phys)
        if hit is not None:
            return hit[1]
        if span > SMALL_FRAME:
            return None
        data = self.reader.pread(phys, span)
        if len(data) != span:
            raise FormatError("file ends inside a frame", phys)
        try:
            length, buf = self._decode(data, logical)
        except FrameError as exc:
            raise FormatError(f"frame at {phys}: {exc}", phys) from None
        self._native.remember(phys, length, buf)
        return buf if length == span else None

    def _record_head(self, ext: Extent, logical: int) -> tuple[Any, int]:
        frames = self._frames(ext, logical + FRAME.size)
        for start, buf in frames:
            if start <= logical and logical + FRAME.size <= start + buf.nbytes:
                return buf, logical - start
        head = memoryview(b"".join(bytes(b) for _, b in frames))  # (a header across frames)
        return head, logical - frames[0][0]

    # ------------------------------------------------------------------ whole file

    def last_commit(self, header: Header) -> Commit:
        """The commit the last index block ends: its logical end is a commit's."""
        commit = parse_footer_at(self.read, self.size, header)
        if commit is None:
            reason = "the last index block does not end with a container footer"
            raise FormatError(reason, self.block.offset, code=COMMIT)
        if commit.record_count != self.block.record_count:
            reason = f"the index block locates {self.block.record_count} records, the footer has"
            raise FormatError(f"{reason} {commit.record_count}", self.block.offset, code=LAYOUT)
        self.commit = commit
        return commit

    def close(self) -> None:
        self._mmap = None
        self._native.close()
        self._groups.clear()
        self._hints.clear()
        self._hot = self._last = None
        self.reader.close()
