"""Writing a layout-2 (indexed) compressed file, and reopening one to append.

A commit costs what it adds: its data frames, one run frame with the locators of its new
records (merged with the newest earlier runs while those are no longer, so each locator is
rewritten O(log n) times and a file has O(log n) runs), a map frame of its data frames, and
an index block of fixed size plus one descriptor per run. See docs/FRAMES.md.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

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
    layout_frame,
    read_run,
    run_frame,
)
from .zstd_source import ZstdSource
from .zstd_train import TRAIN_BYTES, choose_dictionary

MAX_FRAME_SIZE = 64 << 20
NO_EXTENT = Extent(0, 0, 0)
FILE_STATE = (  # what a sink knows of its file, as opposed to the logical stream's state
    "fd",
    "state",
    "physical",
    "dictionary",
    "cctx",
    "dctx",
    "marker",
    "_group_start",
    "_group_logical",
    "_fstart",
    "_flog",
    "_fsize",
    "_g0",
    "_old_map",
)


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
    run, map and index block.

    A new file's sink may first hold its frames back (``hold``) to train the file's
    dictionary on them (``zstd_train``): the writer then has the file rebuilt with the
    dictionary chosen (``rebuilt``), renames it over the old one and goes on in it (``take``)."""

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
        self.level = level
        self.dictionary = dictionary or None
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
        # Holding (a new file's first frames, kept back to train on): the frames, their
        # bytes, the logical offset of the first, and what to call with a dictionary.
        self.held: list[bytes] | None = None
        self._held_bytes = 0
        self._held_from = 0
        self._use_dictionary: Callable[[bytes], None] | None = None
        self.offered: bytes | None = None  # tried instead of training (choose_dictionary)

    @classmethod
    def create(cls, fd: int, dictionary: bytes | None, *, level: int, frame_size: int) -> ZstdSink:
        """A sink for a new, empty file: it starts with the layout frame."""
        head = layout_frame(dictionary)
        pwrite_all(fd, memoryview(head), 0)
        state = GroupState(physical=len(head), logical=0, layout_end=len(head))
        return cls(fd, state, dictionary=dictionary, level=level, frame_size=frame_size)

    def _add(self, phys: int, logical: int, csize: int) -> None:
        self._fstart.append(phys)
        self._flog.append(logical)
        self._fsize.append(csize)

    def _emit(self) -> None:
        if self.held is not None:
            self._torn = True
            self.held.append(bytes(self.pending))
            self._held_bytes += len(self.pending)
            self.pending = bytearray()
            self._torn = False
            if self._held_bytes >= TRAIN_BYTES:
                self.settle(at_commit=False)
            return
        self._write_frame(self.pending, self.pos - len(self.pending))
        self.pending = bytearray()
        self._torn = False

    def _emit_frames(self, data: memoryview, length: int) -> None:
        """As FrameCutter's, written with one system call and their bookkeeping in bulk
        (columnar writes of records a frame each make a frame per record)."""
        if self.held is not None or not self.state.first.span:
            super()._emit_frames(data, length)
            return
        compress = self.cctx.compress
        frames = [compress(data[at : at + length]) for at in range(0, len(data), length)]
        pwrite_all(self.fd, memoryview(b"".join(frames)), self.physical)
        self._torn = True
        sizes = [len(frame) for frame in frames]
        self._fstart.extend(itertools.accumulate(sizes[:-1], initial=self.physical))
        self._flog.extend(range(self.pos, self.pos + len(data), length))
        self._fsize.extend(sizes)
        self.state.frames.extend(zip(sizes, itertools.repeat(length)))
        self.state.largest = max(self.state.largest, length)
        self.physical += sum(sizes)
        self.pos += len(data)
        self._torn = False

    def _write_frame(self, data: Any, logical: int) -> None:
        """Compress ``data``, the logical bytes from ``logical`` on, into the next frame."""
        frame = self.cctx.compress(data)
        pwrite_all(self.fd, memoryview(frame), self.physical)
        self._torn = True  # (the caller lets go of ``data``, then clears it)
        if not self.state.first.span:
            self.state.first = Extent(self.physical, 0, len(frame))
            self.state.first_logical_size = len(data)
        self.physical += len(frame)
        self._add(self.physical - len(frame), logical, len(frame))
        self.state.frames.append((len(frame), len(data)))
        self.state.largest = max(self.state.largest, len(data))

    def flush(self) -> None:
        """Compress and write every frame so far: the held ones too (a commit needs them),
        the dictionary question settled first."""
        if self.pending:
            self._emit()
        if self.held is not None:
            self.settle(at_commit=True)

    # ------------------------------------------------------------------ dictionary

    def hold(self, use_dictionary: Callable[[bytes], None]) -> None:
        """Keep the frames from now on back, in memory, until TRAIN_BYTES of them are held
        or ``flush`` (a commit) needs them; then ``settle``. Only for a new file, whose
        only commit so far (its first) holds no record."""
        self.held = []
        self._held_bytes = 0
        self._held_from = self.pos - len(self.pending)
        self._use_dictionary = use_dictionary

    def settle(self, at_commit: bool) -> None:
        """Choose a dictionary for the held frames (``at_commit``: a commit needs them before
        TRAIN_BYTES were held, and may be the file's last: ``zstd_train.smallest_file``).
        With one, ``use_dictionary`` has the file rebuilt with it (``rebuilt``, ``take``);
        without, the held frames are written as they are. Either way nothing held is dropped
        before it is in a frame of the file the writer keeps: if this raises, the frames not
        yet written are still held."""
        use = self._use_dictionary
        if use is not None:  # not decided yet
            dictionary = choose_dictionary(self.held, self.level, at_commit, self.offered)
            if dictionary is not None:
                use(dictionary)  # the rebuilt file holds them all
            # Decided: an interrupt while the held frames are written out below must not
            # let a later settle choose again, and rebuild without the frames written
            # (attacker's B04). A failed rebuild (it raises) is tried again.
            self._use_dictionary = None
        while self.held:
            self._write_frame(self.held[0], self._held_from)
            self._held_from += len(self.held.pop(0))
            self._torn = False
        self.held = None

    def rebuilt(
        self, fd: int, dictionary: bytes, committed: bytes, footer_size: int, sync: Any
    ) -> ZstdSink:
        """A sink on the empty file ``fd`` holding this file rebuilt with ``dictionary``: its
        only commit (``committed``, the logical bytes up to its end, the last
        ``footer_size`` of them its footer), made durable with ``sync``, then the held
        frames. This sink is unchanged until it ``take``s the new one (once the new file
        has the old one's name); if this raises, ``fd`` is the caller's to discard."""
        new = ZstdSink.create(fd, dictionary, level=self.level, frame_size=self.frame_size)
        bounds = [*self._flog, len(committed)]
        for lo, hi in zip(bounds[:-1], bounds[1:]):  # the same frames, with the dictionary
            new._write_frame(committed[lo:hi], lo)
        new.pos = len(committed)
        new.end_commit(committed[len(committed) - footer_size :], sync)
        sync()
        logical = self._held_from
        for frame in self.held or ():
            new._write_frame(frame, logical)
            logical += len(frame)
        return new

    def rewind(self, pos: int) -> bool:
        """As FrameCutter.rewind; frames held back (not in the file) can be taken back too.
        (``_torn`` covers a frame's bookkeeping here too: from its first step until the
        bytes it took are let go of.)"""
        if self._torn:
            return False
        while self.held and pos < self.pos - len(self.pending):
            frame = self.held.pop()
            self._held_bytes -= len(frame)
            self.pending = bytearray(frame) + self.pending
        return super().rewind(pos)

    def take(self, new: ZstdSink) -> None:
        """Go on in the file of ``new`` (see ``rebuilt``), which holds the held frames."""
        for name in FILE_STATE:
            setattr(self, name, getattr(new, name))
        self.held = []

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
        """Logical bytes (the writer reads old index segments to merge): frames this sink
        wrote from its own list, older ones through the file's frame map, held ones from
        memory (a read does not settle the dictionary)."""
        if self.held is None:
            self.flush()
        elif offset + n > self._held_from:
            head = self.read(offset, self._held_from - offset) if offset < self._held_from else b""
            start = max(offset, self._held_from) - self._held_from
            return head + b"".join([*self.held, self.pending])[start : start + n - len(head)]
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
