"""Writing a layout-2 (indexed) compressed file, and reopening one to append.

A commit costs what it adds: its data frames, one run frame with the locators of its new
records (merged with the newest earlier runs while those are no longer, so each locator is
rewritten O(log n) times and a file has O(log n) runs), a map frame of its data frames, and
an index block of fixed size plus one descriptor per run. See docs/FRAMES.md.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zstandard

from ..byteio import FdReader
from ..container import (
    ENTRY_DTYPE,
    ENTRY_SIZE,
    FOOTER_FIXED,
    FRAME_SIZE,
    SEGMENT,
    open_container,
)
from ..errors import INDEX, ZSTD_FRAME, FormatError
from .plain import pwrite_all
from .zframe import (
    FrameCutter,
    FrameError,
    check_frame,
    decompress_into,
    new_compressor,
    new_decompressor,
)
from .zsalvage import salvage_frames, tail_salvage
from .zstd_layout import (
    LOCATOR_DTYPE,
    SPAN_UNKNOWN,
    Extent,
    Run,
    encode_block,
    encode_map,
    frame_map,
    read_run,
    run_frame,
)
from .zstd_source import ZstdSource

MAX_FRAME_SIZE = 64 << 20
NO_EXTENT = Extent(0, 0, 0)


@dataclass
class GroupState:
    """Where a layout-2 file stands after its last commit (or salvaged tail)."""

    physical: int  # where the next frame goes
    logical: int  # logical bytes so far
    layout_end: int
    previous: int = 0  # file offset of the last index block (0: none yet)
    record_count: int = 0
    runs: list[Run] = field(default_factory=list)
    first: Extent = NO_EXTENT
    first_logical_size: int = 0
    largest: int = 0  # logical size of the largest data frame so far
    frames: list[tuple[int, int]] = field(default_factory=list)  # the open group's so far
    old_block: Any = None  # the last index block on disk: the frame map of older bytes


class ZstdSink(FrameCutter):
    """Compresses the logical bytes into zstd frames and ends each commit with a group's
    run, map and index block."""

    def __init__(
        self,
        fd: int,
        state: GroupState,
        *,
        level: int,
        frame_size: int,
        dictionary: bytes | None,
    ):
        super().__init__(state.logical, frame_size)
        self.fd = fd
        self.state = state
        self.physical = state.physical
        dict_data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        self.cctx = new_compressor(level, dict_data)
        self.dctx = new_decompressor(dict_data)
        self.marker: tuple[int, bytes] | None = None  # as PlainSink.marker: the index block
        self._group_start = state.physical - sum(c for c, _ in state.frames)
        self._group_logical = state.logical - sum(d for _, d in state.frames)
        # Every data frame written by this sink (and the kept salvaged ones): file offset,
        # logical offset, compressed size; those of the open group start at index _g0.
        self._fstart: list[int] = []
        self._flog: list[int] = []
        self._fsize: list[int] = []
        phys, logical = self._group_start, self._group_logical
        for c, d in state.frames:
            self._add(phys, logical, c)
            phys, logical = phys + c, logical + d
        self._g0 = 0
        self._old_map: tuple[np.ndarray, ...] | None = None

    def _add(self, phys: int, logical: int, csize: int) -> None:
        self._fstart.append(phys)
        self._flog.append(logical)
        self._fsize.append(csize)

    def _emit(self) -> None:
        frame = self.cctx.compress(self.pending)
        pwrite_all(self.fd, memoryview(frame), self.physical)
        if not self.state.first.span:
            self.state.first = Extent(self.physical, 0, len(frame))
            self.state.first_logical_size = len(self.pending)
        self.physical += len(frame)
        self._add(self.physical - len(frame), self.pos - len(self.pending), len(frame))
        self.state.frames.append((len(frame), len(self.pending)))
        self.state.largest = max(self.state.largest, len(self.pending))
        self.pending = bytearray()

    @property
    def physical_end(self) -> int:
        return self.physical

    # ------------------------------------------------------------------ commit

    def _group(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """File offsets, logical offsets (one more: the end) and file ends of the open
        group's data frames."""
        start = np.asarray(self._fstart[self._g0 :], np.int64)
        logical = np.asarray(self._flog[self._g0 :] + [self.pos], np.int64)
        return start, logical, start + np.asarray(self._fsize[self._g0 :], np.int64)

    def _extent(self, lo: int, hi: int) -> Extent:
        """The open group's frames holding logical bytes [lo, hi)."""
        if hi <= lo or lo < self._group_logical:
            return NO_EXTENT
        start, logical, end = self._group()
        k = int(np.searchsorted(logical, lo, side="right")) - 1
        k2 = int(np.searchsorted(logical, hi - 1, side="right")) - 1
        span = int(end[k2] - start[k])
        return Extent(int(start[k]), int(logical[k]), span) if span < 1 << 32 else NO_EXTENT

    def _locators(self, entries: np.ndarray) -> np.ndarray:
        """Locators of records written in the open group (vectorized: a commit may add
        millions)."""
        start, logical, end = self._group()
        offsets = entries["offset"].astype(np.int64)
        if len(offsets) and int(offsets.min()) < self._group_logical:
            raise FormatError(
                "a new record lies before its commit's frames", int(offsets.min()), code=INDEX
            )
        k = np.searchsorted(logical, offsets, side="right") - 1
        last = offsets + FRAME_SIZE + entries["length"].astype(np.int64) - 1
        k2 = np.searchsorted(logical, last, side="right") - 1
        out = np.empty(len(offsets), LOCATOR_DTYPE)
        out["logical"] = offsets
        out["physical"] = start[k]
        span = end[k2] - start[k]
        out["span"] = np.where(span >= SPAN_UNKNOWN, SPAN_UNKNOWN, span)
        out["position"] = offsets - logical[k]
        return out

    def _write_skippable(self, data: bytes) -> int:
        at = self.physical
        pwrite_all(self.fd, memoryview(data), at)
        self.physical += len(data)
        return at

    def end_commit(self, footer: bytes, sync: Any) -> None:
        """Close the frame holding the footer; write the run and map frames; make them
        durable (``sync``); then write the index block: the commit's marker. A block
        written in the same unsynced window as what it points at could outlive it."""
        self.marker = None
        self.flush()
        st = self.state
        fixed = FOOTER_FIXED.unpack_from(footer)
        count, meta_off, meta_len, n_seg = fixed[3], fixed[5], fixed[6], fixed[8]
        new = count - st.record_count
        runs = list(st.runs)
        if new > 0:
            seg = SEGMENT.unpack_from(footer, FOOTER_FIXED.size + (n_seg - 1) * SEGMENT.size)
            raw = self.read(seg[0] + (seg[1] - new) * ENTRY_SIZE, new * ENTRY_SIZE)
            locators = self._locators(np.frombuffer(raw, ENTRY_DTYPE))
            reader = FdReader(self.fd, self.physical)
            while runs and runs[-1].count <= len(locators):
                locators = np.concatenate((read_run(reader, runs.pop()), locators))
            first = runs[-1].first + runs[-1].count if runs else 0
            runs.append(Run(self._write_skippable(run_frame(locators)), first, len(locators)))
        group_frames = st.frames
        map_offset = self._write_skippable(
            encode_map([c for c, _ in group_frames], [d for _, d in group_frames])
        )
        sync()
        block = encode_block(
            dict(
                group_start=self._group_start,
                logical_start=self._group_logical,
                logical_end=self.pos,
                previous=st.previous,
                record_count=count,
                map_offset=map_offset,
                frame_count=len(group_frames),
                first_logical_size=st.first_logical_size,
                largest=st.largest,
                footer=self._extent(self.pos - len(footer), self.pos),
                metadata=self._extent(meta_off, meta_off + meta_len),
                first=st.first,
            ),
            runs,
        )
        self.marker = (self.physical, block)
        pwrite_all(self.fd, memoryview(block), self.physical)
        st.previous = self.physical
        self.physical += len(block)
        st.record_count, st.runs, st.frames = count, runs, []
        self._group_start, self._group_logical = self.physical, self.pos
        self._g0 = len(self._fstart)

    # ------------------------------------------------------------------ reading back

    def read(self, offset: int, n: int) -> bytes:
        """Logical bytes already in frames (the writer reads old index segments to merge):
        frames this sink wrote from its own list, older ones through the file's frame map."""
        self.flush()
        out = bytearray()
        while len(out) < n:
            at = offset + len(out)
            if self._flog and at >= self._flog[0]:
                k = bisect.bisect_right(self._flog, at) - 1
                phys, logical, size = self._fstart[k], self._flog[k], self._fsize[k]
            else:
                if self._old_map is None:
                    reader = FdReader(self.fd, self.state.old_block.end)
                    self._old_map = frame_map(reader, self.state.old_block, self.state.layout_end)
                p, lg, cs, _ = self._old_map
                k = int(np.searchsorted(lg, at, side="right")) - 1
                phys, logical, size = int(p[k]), int(lg[k]), int(cs[k])
            data = FdReader(self.fd, phys + size).pread(phys, size)
            try:
                _, declared = check_frame(data, MAX_FRAME_SIZE)
                buf = bytearray(declared)
                decompress_into(data, memoryview(buf), self.dctx)
            except FrameError as exc:
                raise FormatError(f"frame at {phys}: {exc}", phys, code=ZSTD_FRAME) from None
            out += buf[at - logical : at - logical + n - len(out)]
        return bytes(out)


class ZstdFile:
    """An existing layout-2 file opened for appending. A crash leaves frames after the last
    index block; the complete ones whose bytes are complete records are kept (they begin
    the next group), the rest goes to a side file."""

    def __init__(self, fd: int, size: int, path: str):
        source = ZstdSource(FdReader(fd, size), cache_bytes=1 << 20, max_frame_size=MAX_FRAME_SIZE)
        try:
            self.header, self.commit = open_container(source)
            self.dictionary = source.dictionary
            block = source.block
            self.found, self.keep, kept = salvage_frames(
                source.reader, source.dctx, self.header, block.end, source.size, MAX_FRAME_SIZE
            )
            self.state = GroupState(
                physical=self.keep,
                logical=source.size + sum(d for _, d, _ in kept),
                layout_end=source.layout_end,
                previous=block.offset,
                record_count=block.record_count,
                runs=list(block.runs),
                first=block.first,
                first_logical_size=block.first_logical_size,
                largest=max([block.largest] + [d for _, d, _ in kept]),
                frames=[(c, d) for c, d, _ in kept],
                old_block=block,
            )
            self.salvage = tail_salvage(
                path, fd, self.commit.record_count, self.found, block.end, self.keep, size
            )
        finally:
            source.close()

    def sink(self, fd: int, *, level: int, frame_size: int) -> ZstdSink:
        """The sink that goes on after the kept frames, with the file's own dictionary."""
        return ZstdSink(
            fd, self.state, dictionary=self.dictionary, level=level, frame_size=frame_size
        )
