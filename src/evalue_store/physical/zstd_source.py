"""Reading a layout-2 (indexed) compressed file through a byte reader (docs/FRAMES.md).

Open reads the layout frame and the last index block; a record lookup reads one locator
group (checksummed) and then the frames the locator names, so a cold ``ds[i]`` costs two
bounded preads whatever the record or frame count, on a local file or a remote one. Reads
of other logical bytes use the extents the index block names (header, footer, metadata) and,
for anything older, the frame map built once from the chain of index blocks.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Any

import numpy as np
import zstandard

from ..container import ENTRY, ENTRY_DTYPE, FRAME, FRAME_MAGIC, Commit, Header, parse_footer_at
from ..errors import (
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
    FrameError,
    LogicalReads,
    aligned_bytes,
    aligned_empty,
    check_frame,
    decompress_into,
    decompress_small,
    new_decompressor,
)
from .zstd_layout import (
    GROUP,
    LOCATOR,
    SPAN_UNKNOWN,
    Extent,
    find_last_block,
    frame_map,
    read_group,
    read_layout,
    read_run,
)

SMALL_FRAME = 256 << 10  # frames up to this size are decompressed in one decoder call
MAX_HINTS = 1 << 14  # records located but not yet read (a batch's lookups come first)
MAX_GROUPS = 1 << 16  # locator groups kept (16 locators each: 25 MiB at most)


class ZstdSource(LogicalReads):
    """Random access to the logical bytes of a layout-2 file. Decompressed frames are kept
    in an LRU cache of ``cache_bytes``, keyed by their file offset; buffers are placed so
    that a logical offset that is a multiple of the alignment is an aligned address."""

    compressed = True
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
        dict_data = zstandard.ZstdCompressionDict(self.dictionary) if self.dictionary else None
        try:
            self.dctx = new_decompressor(dict_data)
        except zstandard.ZstdError as exc:
            raise FormatError(
                f"layout frame holds no usable dictionary: {exc}", 16, code=DICTIONARY
            ) from None
        self.size = block.logical_end
        self.physical_end = block.end  # file bytes up to the last commit
        self.cap = max_frame_size
        self.cache_bytes = cache_bytes
        self.alignment = 64
        self._cache: OrderedDict[int, tuple[int, memoryview]] = OrderedDict()
        self._cached = 0
        self._groups: dict[tuple[int, int], memoryview] = {}
        self._hints: dict[int, Extent] = {}
        self._hot: tuple[int, Any, int] | None = None
        self._runs = block.runs
        self._firsts = [r.first for r in block.runs]
        self._extents = [e for e in (block.footer, block.metadata, block.first) if e.span]
        self._map: tuple[np.ndarray, ...] | None = None
        self.commit: Commit | None = None

    def set_alignment(self, alignment: int) -> None:
        if alignment != self.alignment:
            self.alignment = alignment
            self._hot = None
            self._cache.clear()
            self._cached = 0

    # ------------------------------------------------------------------ frames

    def _decode(self, frame: Any, logical: int) -> tuple[int, memoryview]:
        """(length, bytes) of the checked frame at the start of ``frame``."""
        length, size = check_frame(frame, self.cap, exact=False)
        out = aligned_bytes(size, logical, self.alignment)
        if size <= SMALL_FRAME:
            out[:] = decompress_small(frame[:length], size, self.dctx)
        else:
            decompress_into(frame[:length], out, self.dctx)
        return length, out.toreadonly()

    def _frames(self, ext: Extent, need: int, strict: bool = True) -> list[tuple[int, Any]]:
        """(logical start, bytes) of the frames of ``ext`` from its first one until logical
        offset ``need`` is covered (``strict``: it must be), one pread for those not in
        the cache."""
        out = []
        phys, logical, end = ext.physical, ext.logical, ext.physical + ext.span
        data, data_at = None, 0
        while logical < need:
            if phys >= end:
                if not strict:
                    break
                raise FormatError(
                    f"frames at {ext.physical} end before logical {need}", phys, code=ZSTD_FRAME
                )
            hit = self._cache.get(phys)
            if hit is not None:
                self._cache.move_to_end(phys)
                length, buf = hit
            else:
                if data is None:
                    data, data_at = memoryview(self.reader.pread(phys, end - phys)), phys
                    if len(data) != end - phys:
                        raise FormatError("file ends inside a frame", phys, code=TRUNCATED)
                try:
                    length, buf = self._decode(data[phys - data_at :], logical)
                except FrameError as exc:
                    raise FormatError(f"frame at {phys}: {exc}", phys, code=ZSTD_FRAME) from None
                self._remember(phys, length, buf)
            out.append((logical, buf))
            phys += length
            logical += buf.nbytes
        return out

    def _remember(self, phys: int, length: int, buf: memoryview) -> None:
        self._cache[phys] = (length, buf)
        self._cached += buf.nbytes
        while self._cached > self.cache_bytes and len(self._cache) > 1:
            _, (_, old) = self._cache.popitem(last=False)
            self._cached -= old.nbytes

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
        return memoryview(out).toreadonly(), 0

    # ------------------------------------------------------------------ records

    def entry(self, at: int, i: int) -> tuple[int, int, int, int]:
        """Record ``i``'s index entry, from its locator and its record header: the index
        itself is never decompressed (its frames are decompressed now, and cached, for the
        read that follows). A locator that cannot be used (damaged, or a record of 4 GiB of
        frames) gives way to the container's index entry at ``at``, read through the frame
        map: a read is right or raises, as a read of the decompressed file would be."""
        try:
            located = self._locate(i)
        except FormatError:
            located = None
        if located is None:
            return ENTRY.unpack_from(*self.frame(at, ENTRY.size))
        return located

    def _locate(self, i: int) -> tuple[int, int, int, int] | None:
        runs = self._runs
        k = 0 if len(runs) == 1 else bisect.bisect_right(self._firsts, i) - 1
        if k < 0 or i >= self.block.record_count:
            return None
        run = runs[k]
        j = i - run.first
        key = (run.offset, j // GROUP)
        group = self._groups.get(key)
        if group is None:
            if len(self._groups) >= MAX_GROUPS:
                self._groups.clear()
            group = self._groups[key] = read_group(self.reader, run, j)[0]
        logical, phys, span, position = LOCATOR.unpack_from(group, (j % GROUP) * LOCATOR.size)
        if span == SPAN_UNKNOWN or position > logical:
            return None
        if phys < self.layout_end or phys + span > run.offset:
            return None  # a record's frames lie between the layout frame and its run
        if logical + FRAME.size > self.size:
            raise FormatError("a locator points past the logical end", logical, code=OUT_OF_BOUNDS)
        ext = Extent(phys, logical - position, span)
        buf = self._single(ext)
        if buf is None or position + FRAME.size > buf.nbytes:  # the record spans frames
            buf, position = self._record_head(ext, logical)
        magic, crc, length = FRAME.unpack_from(buf, position)
        if magic != FRAME_MAGIC:
            return None
        hints = self._hints  # for a read that comes later (a batch locates all first)
        if len(hints) >= MAX_HINTS:
            hints.clear()
        hints[logical] = ext
        fits = position + FRAME.size + length <= buf.nbytes
        self._hot = (logical, buf, position) if fits else None
        return logical, length, crc, 0

    def _single(self, ext: Extent) -> memoryview | None:
        """The decompressed first frame of ``ext`` when it is cached or is all of ``ext`` (a
        record within one frame, the common case: one read, one decoder call); None
        otherwise (the caller goes frame by frame)."""
        phys, logical, span = ext
        hit = self._cache.get(phys)
        if hit is not None:
            self._cache.move_to_end(phys)
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
        self._remember(phys, length, buf)
        return buf if length == span else None

    def _record_head(self, ext: Extent, logical: int) -> tuple[Any, int]:
        frames = self._frames(ext, logical + FRAME.size)
        for start, buf in frames:
            if start <= logical and logical + FRAME.size <= start + buf.nbytes:
                return buf, logical - start
        return b"".join(bytes(b) for _, b in frames), logical - frames[0][0]

    # ------------------------------------------------------------------ whole file

    def chunks(self) -> Any:
        """Every data frame's logical bytes in order (decompressing each once, uncached)."""
        phys, logi, csizes, lsizes = self._frame_map()
        for k in range(len(phys)):
            yield self._whole_frame(int(phys[k]), int(logi[k]), int(csizes[k]), int(lsizes[k]))

    def _whole_frame(self, at: int, logical: int, csize: int, lsize: int) -> memoryview:
        """The frame the map lists at ``at``, which must fill exactly its listed sizes."""
        try:
            length, buf = self._decode(memoryview(self.reader.pread(at, csize)), logical)
        except FrameError as exc:
            raise FormatError(f"frame at {at}: {exc}", at, code=ZSTD_FRAME) from None
        if length != csize or buf.nbytes != lsize:
            raise FormatError(f"frame at {at} disagrees with the frame map", at, code=ZSTD_FRAME)
        return buf

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

    def verify_frames(self) -> list[str]:
        """Problems of the frame layer: the chain of index blocks and maps, every data
        frame, every locator against the frame map and the container's index."""
        try:
            phys, logi, csizes, lsizes = self._frame_map()
            for k in range(len(phys)):
                self._whole_frame(int(phys[k]), int(logi[k]), int(csizes[k]), int(lsizes[k]))
        except FormatError as exc:
            return [f"frame layer: {exc}"]
        problems = []
        ends = phys + csizes
        for run in self._runs:
            try:
                loc = read_run(self.reader, run)
            except FormatError as exc:
                problems.append(str(exc))
                continue
            entries = self._entries(run.first, run.count)
            k = np.searchsorted(phys, loc["physical"])
            k = np.minimum(k, len(phys) - 1)
            last = loc["logical"] + FRAME.size + entries["length"] - 1
            k2 = np.searchsorted(logi, last, side="right") - 1
            bad = (
                (loc["logical"] != entries["offset"])
                | (phys[k] != loc["physical"])
                | (logi[k] + loc["position"] != loc["logical"])
                | ((loc["span"] != SPAN_UNKNOWN) & (ends[k2] - loc["physical"] != loc["span"]))
            )
            if bad.any():
                first = run.first + int(np.flatnonzero(bad)[0])
                problems.append(f"locator of record {first} disagrees with the index and frames")
        return problems

    def _entries(self, first: int, count: int) -> np.ndarray:
        """Index entries of records [first, first + count), read through the frame map."""
        out, start = [], 0
        for seg in self.commit.segments if self.commit else ():
            lo, hi = max(first, start), min(first + count, start + seg.count)
            if lo < hi:
                raw = self.read(seg.offset + (lo - start) * ENTRY.size, (hi - lo) * ENTRY.size)
                out.append(np.frombuffer(bytes(raw), ENTRY_DTYPE))
            start += seg.count
        return np.concatenate(out) if out else np.zeros(0, ENTRY_DTYPE)

    def close(self) -> None:
        self._cache.clear()
        self._groups.clear()
        self._hints.clear()
        self._hot = None
        self.reader.close()
