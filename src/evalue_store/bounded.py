"""Bounded work on untrusted files: opening only regular files, and bounded-memory passes
over a container's logical bytes for ``Dataset.verify``.

A compressed file's logical size can be up to 32768 times its size (docs/FRAMES.md
§12), so nothing here reads a block, a gap or an index segment in one piece: each pass reads
at most CHUNK bytes at a time, whatever the file claims.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from .container import ENTRY_DTYPE, ENTRY_SIZE, FRAME_SIZE, Checksum, Segment
from .errors import NOT_A_CONTAINER, FormatError
from .files import open_path

CHUNK = 1 << 20  # bytes read at a time
BAD_LISTED = 10  # gaps verify names (it counts the others)
SHADOWED = "starts before an earlier record's frame ends (frames must be in file order)"

Read = Callable[[int, int], Any]


def open_regular(path: str) -> int:
    """A read-only descriptor of ``path``, refused unless it is a regular file: reading a
    FIFO would wait for a writer forever, and a device or socket has no size to trust.
    The open itself does not block (O_NONBLOCK, cleared once the file is known regular)."""
    nonblock = getattr(os, "O_NONBLOCK", 0)
    fd = open_path(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | nonblock)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device, socket or other special file"
            raise FormatError(f"not a regular file ({kind})", None, path, code=NOT_A_CONTAINER)
        if nonblock:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def crc_range(read: Read, offset: int, length: int, checksum: Checksum) -> int:
    """The checksum (the file's function) of logical bytes [offset, offset + length)."""
    value = 0
    for at in range(offset, offset + length, CHUNK):
        value = checksum(read(at, min(CHUNK, offset + length - at)), value)
    return value


def intact(read: Read, offset: int, length: int, crc: int, checksum: Checksum) -> bool:
    """True when a block's bytes can be read and match their checksum."""
    try:
        return crc_range(read, offset, length, checksum) == crc
    except FormatError:
        return False


def all_zero(read: Read, start: int, end: int) -> bool:
    """True when logical bytes [start, end) are all zero."""
    for at in range(start, end, CHUNK):
        n = min(CHUNK, end - at)
        if bytes(read(at, n)).count(0) != n:
            return False
    return True


def index_chunks(read: Read, seg: Segment) -> Iterator[tuple[int, np.ndarray]]:
    """(number of the first entry, entries) of an index segment, CHUNK bytes at a time."""
    step = CHUNK // ENTRY_SIZE
    for lo in range(0, seg.count, step):
        count = min(step, seg.count - lo)
        raw = read(seg.offset + lo * ENTRY_SIZE, count * ENTRY_SIZE)
        yield lo, np.frombuffer(raw, ENTRY_DTYPE, count)


def shadowed(entries: np.ndarray, reach: int, start: int, end: int) -> tuple[np.ndarray, int]:
    """Which records start before an earlier record's frame ends, and the new ``reach`` (the
    furthest frame end so far). A valid file has none (docs/FORMAT.md section 6); a scan
    refuses them, since an index of n entries all pointing at one big record would
    otherwise cost n times the file. Only frames inside [start, end) count: a record with an
    impossible extent is bad for its own reason and shadows nothing."""
    ext = extents(entries)
    inside = (ext[:, 0] >= start) & (ext[:, 1] <= end) & (ext[:, 1] > ext[:, 0])
    before = np.maximum.accumulate(np.concatenate([[reach], np.where(inside, ext[:, 1], 0)]))
    return inside & (ext[:, 0] < before[:-1]), int(before[-1])


def extents(entries: np.ndarray) -> np.ndarray:
    """[[start, end], ...] of the record frames index entries point to (int64)."""
    starts = entries["offset"].astype(np.int64)
    return np.stack([starts, starts + FRAME_SIZE + entries["length"].astype(np.int64)], axis=1)


def gaps(
    fixed: Iterable[tuple[int, int]], records: Iterable[np.ndarray], overlaps: list[int]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(starts, ends) of the ranges covered by no block, a batch per record chunk (and one
    after the last) in file order: the blocks are ``fixed`` (any order; one named twice
    counts once) and record extents given chunk by chunk in file order (as a sound index
    holds them). The start of every block that begins inside an earlier one is added to
    ``overlaps`` (a valid file has none: docs/FORMAT.md §2).

    Each record chunk is merged with the fixed blocks that start before its last record, so
    memory is one chunk plus the fixed blocks, not the whole index.
    """
    table = np.array(sorted(set(fixed)), np.int64).reshape(-1, 2)
    reach, taken = 0, 0
    for chunk in itertools.chain(records, [None]):
        upto = len(table) if chunk is None else int(np.searchsorted(table[:, 0], chunk[-1, 0]))
        items = table[taken:upto] if chunk is None else np.concatenate([table[taken:upto], chunk])
        taken = upto
        if not len(items):
            yield items[:, 0], items[:, 1]  # (none: a batch per chunk all the same)
            continue
        items = items[np.argsort(items[:, 0], kind="stable")]
        ends = np.maximum.accumulate(np.concatenate([[reach], items[:, 1]]))
        overlaps += items[items[:, 0] < ends[:-1], 0].tolist()
        k = np.flatnonzero(items[:, 0] > ends[:-1])
        yield ends[k], items[k, 0]
        reach = int(ends[-1])


SMALL_GAP = 1 << 12  # gaps up to this size are checked together (padding: under the alignment)
GATHER_BYTES = 1 << 20  # bytes of small gaps gathered at a time


def nonzero_gaps(mapped: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which of the non-empty ranges [starts, ends) of ``mapped`` (their bytes, GATHER_BYTES
    at most in all) hold a byte other than zero."""
    lengths = ends - starts
    first = np.cumsum(lengths) - lengths  # where each range starts among the gathered bytes
    at = np.repeat(starts - first, lengths) + np.arange(int(lengths.sum()))
    return np.logical_or.reduceat(mapped[at] != 0, first)


class Layout:
    """Verify's check of the layout of ``blocks`` and of the record frames of the index
    entries given to it (``add_records``, a piece at a time, in file order as a sound index
    holds them): blocks that overlap, and gaps between them that are not all zero. Gaps are
    checked as the caller's pass over those records reaches them (``check_before``), so
    that a pass reading a compressed file in order reads the padding from the spans it
    decompresses anyway, and the index is read once, by that pass; ``problems`` checks the
    rest and says what is wrong. Gaps are read with ``read_gaps``, or, small ones, many at
    a time from ``mapped`` (the logical bytes as a uint8 array, a plain file's mapping);
    memory is a piece of the index plus the blocks, whatever the file holds."""

    def __init__(self, blocks: list[tuple[int, int]], read_gaps: Read, mapped: Any = None):
        self._given: list[np.ndarray | None] = []  # pieces given, not yet merged
        self.overlaps: list[int] = []
        self._gaps = gaps(blocks, self._records(), self.overlaps)
        self._read = read_gaps
        self._mapped = mapped
        self.bad: list[int] = []  # the first BAD_LISTED gaps that are not all zero
        self.bad_count = 0
        self._starts = self._ends = np.zeros(0, np.int64)  # the batch of gaps at hand
        self._listed: list[int] = []  # its starts, as ints (a lookup a record costs little)
        self._k = 0  # the first of them not checked yet

    def add_records(self, entries: np.ndarray | None) -> None:
        """The next piece of the index (None: there are no more)."""
        if entries is None or len(entries):
            self._given.append(entries)

    def _records(self) -> Iterator[np.ndarray]:
        """The pieces given, as extents; ``gaps`` takes one per batch it yields, and
        ``check_before`` asks for a batch only once its piece is given."""
        while True:
            entries = self._given.pop(0)
            if entries is None:
                return
            yield extents(entries)

    def check_before(self, offset: float) -> None:
        """Check every gap that starts before logical offset ``offset``."""
        while True:
            if self._k == len(self._listed):
                if not self._given:  # its piece is not given yet
                    return
                try:
                    self._starts, self._ends = next(self._gaps)
                except StopIteration:
                    return
                self._listed, self._k = self._starts.tolist(), 0
                continue  # (a batch may hold no gap)
            if self._listed[self._k] >= offset:
                return
            stop = bisect.bisect_left(self._listed, offset, self._k)
            self._check(self._k, stop)
            self._k = stop

    def _check(self, lo: int, hi: int) -> None:
        """Check gaps [lo, hi) of the batch at hand: one by one (a pass that reads records
        in order comes here at each record), or many together from the mapping."""
        if self._mapped is None or hi - lo < 16:
            ends_listed = self._ends[lo:hi].tolist()
            for start, end in zip(self._listed[lo:hi], ends_listed):
                if self._nonzero(start, end):
                    self._found([start])
            return
        starts, ends = self._starts[lo:hi], self._ends[lo:hi]
        bad = np.zeros(hi - lo, bool)
        small = bad.copy()
        if self._mapped is not None:  # (a hostile index makes gaps outside the file: read)
            small = (ends - starts <= SMALL_GAP) & (starts >= 0) & (ends <= len(self._mapped))
        picked = np.flatnonzero(small)
        room = np.cumsum(ends[picked] - starts[picked])  # their bytes so far
        first = 0
        while first < len(picked):  # GATHER_BYTES of small gaps at a time
            before = int(room[first - 1]) if first else 0
            last = max(first + 1, int(np.searchsorted(room, before + GATHER_BYTES, side="right")))
            batch = picked[first:last]
            bad[batch] = nonzero_gaps(self._mapped, starts[batch], ends[batch])
            first = last
        for k in np.flatnonzero(~small).tolist():
            bad[k] = self._nonzero(int(starts[k]), int(ends[k]))
        self._found(starts[bad].tolist())

    def _nonzero(self, start: int, end: int) -> bool:
        try:
            return not all_zero(self._read, start, end)
        except FormatError:  # unreadable (the frame pass says why): not known zero
            return True

    def _found(self, starts: list[int]) -> None:
        self.bad_count += len(starts)
        self.bad += starts[: BAD_LISTED - len(self.bad)]

    def problems(self) -> list[str]:
        """What is wrong, once every gap is checked."""
        self.check_before(float("inf"))
        problems = [
            f"blocks overlap at {at}: a block starts inside another" for at in self.overlaps[:10]
        ]
        if self.bad_count:
            more = " ..." if self.bad_count > len(self.bad) else ""
            problems.append(
                f"non-zero bytes in the padding between blocks at {self.bad_count} places "
                f"(offsets {', '.join(map(str, self.bad))}{more}): no read uses them, but the "
                "file was changed there"
            )
        return problems
