"""Passes in file order over the data frames of a layout-2 (indexed) compressed file
(docs/FRAMES.md): the frames holding a span of logical bytes (a scan's records), every
frame in turn, and the check of the frame layer as a whole. ``ZstdSource`` inherits them;
they find the frames through the frame map, built once from the chain of index blocks.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from ..buffers import read_only
from ..container import ENTRY, ENTRY_DTYPE, FRAME
from ..errors import OUT_OF_BOUNDS, TRUNCATED, ZSTD_FRAME, FormatError
from .zframe import (
    SMALL_FRAME,
    FrameError,
    aligned_empty,
    check_frame,
    decompress_into,
    decompress_small,
)
from .zstd_layout import SPAN_UNKNOWN, chain, read_run


class FramePasses:
    """The passes in order of ``ZstdSource`` (a mixin: the state is the source's)."""

    block: Any  # the last index block
    layout_end: int
    _last: tuple[int, memoryview] | None  # a span's last frame (file offset, bytes)
    _checked: np.ndarray | None = None  # per frame-map entry: checked by a span (track_checks)
    size: int  # logical bytes
    cap: int  # the largest frame content read
    alignment: int
    reader: Any
    dctx: Any
    commit: Any
    _runs: Any
    _decode: Any
    _frame_map: Any
    read: Any

    def span(self, offset: int, n: int) -> tuple[Any, int]:
        """(buffer, position) of logical bytes [offset, offset + n), for a pass in file order
        (a scan asks for its records a span at a time): the frames holding them, found with
        one frame-map lookup, read with one pread per run of adjacent frames, each checked
        as ``chunks`` checks it and decompressed into one buffer. Lookups per span, not per
        record; the frames are not cached, but for the last one, where the next span of a
        pass usually starts."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise FormatError(
                f"read of {n} bytes runs past the logical end {self.size}",
                offset,
                code=OUT_OF_BOUNDS,
            )
        phys, logi, csizes, lsizes = self._frame_map()
        k = int(np.searchsorted(logi, offset, side="right")) - 1
        k2 = int(np.searchsorted(logi, offset + max(n, 1) - 1, side="right")) - 1
        if k < 0 or int(logi[k2] + lsizes[k2]) < offset + n:
            reason = f"no data frames hold logical bytes {offset}..{offset + n}"
            raise FormatError(reason, offset, code=ZSTD_FRAME)
        largest = int(lsizes[k : k2 + 1].max())
        if largest > self.cap:  # (allocated before any frame is checked: refused first)
            reason = f"the frame map lists a frame of {largest} bytes, over the cap {self.cap}"
            raise FormatError(reason, offset, code=ZSTD_FRAME)
        ends = phys[k : k2 + 1] + csizes[k : k2 + 1]
        last_of_run = np.flatnonzero(phys[k + 1 : k2 + 1] != ends[:-1]).tolist() + [k2 - k]
        run_ends = ends[last_of_run].tolist()  # where each run of adjacent frames ends
        base = int(logi[k])
        out = aligned_empty(int(logi[k2] + lsizes[k2]) - base, base, self.alignment)
        view = memoryview(out)
        last, dctx = self._last, self.dctx
        data, data_at, data_end = b"", 0, 0
        for at, logical, csize, size in zip(
            phys[k : k2 + 1].tolist(),
            logi[k : k2 + 1].tolist(),
            csizes[k : k2 + 1].tolist(),
            lsizes[k : k2 + 1].tolist(),
        ):
            place = logical - base
            if last is not None and last[0] == at:
                view[place : place + size] = last[1]  # checked by the span before
                continue
            if at + csize > data_end:  # the next run of adjacent frames: one read
                data_end = run_ends[bisect.bisect_left(run_ends, at + csize)]
                data, data_at = memoryview(self.reader.pread(at, data_end - at)), at
                if len(data) != data_end - at:
                    raise FormatError("file ends inside a frame", at, code=TRUNCATED)
            frame = data[at - data_at : at - data_at + csize]
            try:
                content = check_frame(frame, self.cap)[1]  # it fills its listed size
                if content != size:
                    raise FrameError(f"declares {content} bytes, the frame map {size}")
                if size <= SMALL_FRAME:
                    view[place : place + size] = decompress_small(frame, size, dctx)
                else:
                    decompress_into(frame, view[place : place + size], dctx)
            except FrameError as exc:
                raise FormatError(f"frame at {at}: {exc}", at, code=ZSTD_FRAME) from None
        sealed = read_only(out)
        self._last = (at, sealed[place : place + size])
        if self._checked is not None:
            self._checked[k : k2 + 1] = True
        return sealed, offset - base

    def track_checks(self) -> None:
        """Until the next ``verify_frames``, remember the frames ``span`` checks, so that
        verify's frame pass decompresses (and, remote, downloads) only the frames its
        record pass did not: every frame is checked once."""
        try:
            self._checked = np.zeros(len(self._frame_map()[0]), bool)
        except FormatError:  # the frame pass reports it
            self._checked = None

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

    def verify_frames(self) -> list[str]:
        """Problems of the frame layer: the chain of index blocks and maps, every data
        frame (but those a span checked since ``track_checks``), every locator against
        the frame map and the container's index."""
        checked, self._checked = self._checked, None
        try:
            phys, logi, csizes, lsizes = self._frame_map()
            unchecked = range(len(phys)) if checked is None else np.flatnonzero(~checked)
            for k in unchecked:
                self._whole_frame(int(phys[k]), int(logi[k]), int(csizes[k]), int(lsizes[k]))
        except FormatError as exc:
            return [f"frame layer: {exc}"]
        problems = self._superseded_runs()
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
                | np.where(
                    loc["span"] == SPAN_UNKNOWN,  # (4 GiB or more)
                    ends[k2] - loc["physical"] < SPAN_UNKNOWN,
                    ends[k2] - loc["physical"] != loc["span"],
                )
            )
            if bad.any():
                first = run.first + int(np.flatnonzero(bad)[0])
                problems.append(f"locator of record {first} disagrees with the index and frames")
        return problems

    def _superseded_runs(self) -> list[str]:
        """Problems of the run frames that later commits merged into others (their bytes
        stay below the last commit, and no lookup reads them): each earlier block's own run
        frame, the one in its group, must still be a run frame whose group checksums hold."""
        problems = []
        current = {run.offset for run in self._runs}  # checked against the index below
        try:
            for block in chain(self.reader, self.block, self.layout_end):
                for run in block.runs:
                    mine = block.group_start <= run.offset < block.offset
                    if mine and run.offset not in current:
                        try:
                            read_run(self.reader, run)
                        except FormatError as exc:
                            problems.append(f"superseded {exc}")
        except FormatError as exc:  # (frame_map walked the same chain: not expected)
            problems.append(f"frame layer: {exc}")
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
