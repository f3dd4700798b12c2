"""The plain physical variant: the file's bytes are the container's bytes (docs/FORMAT.md).

Readers get a source (the read side of the source protocol, below) over the bytes up to the
last commit: a mapping, or ``pread`` for filesystems where mapping is slow. Writers get a
sink that appends, and the state of an existing file opened for appending.

The source protocol, which the compressed variant (``zstd``) implements too:
``size`` (logical bytes readable), ``read(offset, n)``, ``frame(offset, n)`` (a buffer and
the position of ``offset`` in it), ``entry(at, i)`` (record ``i``'s index entry, stored at
logical offset ``at``), ``mapped`` (a view of all ``size`` bytes, or None),
``gather(offsets, sizes, index=False)`` (the bytes of a batch of ranges, read in one pass
into one buffer: that buffer and each range's position in it; ``index``: the ranges are
index entries), ``chunks()`` (the bytes in order), ``last_commit(header)``, ``set_alignment(a)``,
``verify_frames()`` (problems of the physical layer), ``physical_end`` (file bytes up to the
last commit), ``compressed``, ``checks_content`` (reads are already checked by the physical
layer) and ``close()``.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..buffers import close_map, map_file, read_only
from ..byteio import GATHER_GAP, Descriptor, Gather, let_go
from ..container import (
    ENTRY,
    ENTRY_SIZE,
    Commit,
    Header,
    align_up,
    find_last_commit,
    open_container,
)
from ..errors import TRUNCATED, FormatError
from ..files import start_writeback
from .salvage import Salvage, scan_tail, side_file

CHUNK = 1 << 20  # bytes per piece of a sequential pass


def aligned_buffer(size: int, alignment: int) -> np.ndarray:
    """A writable uint8 buffer of ``size`` bytes whose first byte is ``alignment``-aligned."""
    raw = np.empty(size + alignment, np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip : skip + size]


class _PlainSource:
    """What both plain sources share: no physical layer of their own to check."""

    compressed = False
    checks_content = False  # a record's CRC is the only check of its bytes
    size: int
    read: Any

    @property
    def physical_end(self) -> int:
        return self.size

    def set_alignment(self, alignment: int) -> None:
        """Buffers a plain source makes are aligned by construction or by the file."""

    def last_commit(self, header: Header) -> Commit:
        return find_last_commit(self.read, self.size, header)

    def chunks(self) -> Iterator[memoryview]:
        for start in range(0, self.size, CHUNK):
            yield self.read(start, min(CHUNK, self.size - start))

    def verify_frames(self) -> list[str]:
        return []

    def entry(self, at: int, i: int) -> tuple[int, int, int, int]:
        return ENTRY.unpack_from(*self.frame(at, ENTRY_SIZE))

    gap = GATHER_GAP  # ranges closer than this are read as one span
    alignment: int

    def gather(
        self, offsets: np.ndarray, sizes: np.ndarray, *, index: bool = False
    ) -> tuple[memoryview, np.ndarray]:
        plan = Gather(offsets, sizes, self.alignment, self.gap)
        buf = memoryview(aligned_buffer(plan.size, self.alignment))
        self._fill(plan, buf, index)
        return read_only(buf), plan.positions

    def _fill(self, plan: Gather, buf: memoryview, index: bool) -> None:
        """Read each span of ``plan`` into ``buf`` at its place."""
        for (start, n), place in zip(plan.spans, plan.places):
            buf[place : place + n] = self.read(start, n)


class MmapSource(_PlainSource):
    """The file through a private copy-on-write mapping, read through a read-only view.

    Every array handed out is a read-only view of it (see ``buffers``): a write into one
    would change later reads. The mapping is private (ACCESS_COPY) all the same, so that
    a write forced through anyway (``torch.from_numpy`` of a view, which warns) changes
    this process's pages, never the file, and does not crash the process.
    """

    def __init__(self, fd: int, size: int):
        self.size = size
        self.map = map_file(fd, size)
        # Reads slice this one view: each np.frombuffer / slice of the mmap itself would
        # first make a memoryview of it (half the cost of a small tensor view).
        self.view = memoryview(self.map).toreadonly()
        self.mapped: memoryview | None = self.view
        self.typed: dict = {}  # tensor spec -> its rows over all of view (Layout.decode's)

    def read(self, offset: int, n: int) -> memoryview:
        return self.view[offset : offset + n]

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        """(buffer, position) such that buffer[position:position + n] is file[offset:...]."""
        return self.view, offset

    def gather(
        self, offsets: np.ndarray, sizes: np.ndarray, *, index: bool = False
    ) -> tuple[memoryview, np.ndarray]:
        return self.view, offsets  # every range is in the mapping already

    def close(self) -> None:
        self.mapped = None
        self.typed.clear()  # its arrays hold the view; the tensors sliced from them stay valid
        try:
            self.view.release()  # tensors hold views of their own
        except BufferError:
            return  # views into it are still alive; the mapping goes when the last one does
        close_map(self.map)


class PreadSource(_PlainSource):
    """The file through os.pread: for filesystems where mmap is slow (NFS, FUSE).

    ``owns_fd``: the descriptor is closed once closed here and no read is under way
    (``byteio.Descriptor``; a probe that only finds the last commit does not own it)."""

    mapped = None

    def __init__(self, fd: int, size: int, alignment: int = 64, *, owns_fd: bool = True):
        self.held: Descriptor | None = Descriptor(fd, owns_fd)
        self.size = size
        self.alignment = alignment

    @property
    def fd(self) -> int:
        held = self.held
        return -1 if held is None else held.number

    def set_alignment(self, alignment: int) -> None:
        self.alignment = alignment

    def read(self, offset: int, n: int) -> memoryview:
        view = memoryview(aligned_buffer(n, self.alignment))
        self._read_into(view, offset)
        return read_only(view)  # arrays of it are read-only like a mapping's

    def _read_into(self, view: memoryview, offset: int) -> None:
        held = self.held  # (kept until the read is done; None once closed: an error)
        done, n = 0, len(view)
        while done < n:
            got = os.preadv(held.number, [view[done:]], offset + done)
            if got <= 0:
                raise FormatError(
                    f"file ends early: wanted {n} bytes", offset + done, code=TRUNCATED
                )
            done += got

    def _fill(self, plan: Gather, buf: memoryview, index: bool) -> None:
        for (start, n), place in zip(plan.spans, plan.places):
            self._read_into(buf[place : place + n], start)  # one preadv per span, no copy

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        return self.read(offset, n), 0

    def close(self) -> None:
        held, self.held = self.held, None
        let_go(held)


def open_plain(fd: int, size: int, backend: str) -> tuple[Any, Header, Commit]:
    """Open a plain container of ``size`` bytes at its last commit; the source takes ``fd``
    (it is closed on error). A writer may be cutting the tail after that commit, so the tail
    is searched with ``pread`` and only the committed bytes are mapped."""
    try:
        header, commit = open_container(PreadSource(fd, size, owns_fd=False))
        if backend == "mmap":
            source: Any = MmapSource(fd, commit.end)
            owned, fd = fd, -1  # forgotten first: an interrupt after close(2) never
            os.close(owned)  # leads to a second close of a number reused meanwhile
        else:
            source = PreadSource(fd, commit.end, header.alignment)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return source, header, commit


class PlainSink:
    """Writes the logical bytes straight to the file (the uncompressed container).

    Small writes wait in ``buf``, which holds the file's bytes from ``start`` (every byte
    before it has been written) to ``pos`` (the logical end). A signal handler's exception
    can land between any two statements, so each change of that state is one store made
    last: a buffered write copies its bytes past the end, then moves ``pos``; a flush
    writes the buffer out, then moves ``start``. ``pos < start`` only while a direct write
    is under way (or was cut short there): the bytes from ``pos`` on are then not the
    container's, as after any failed write, and the next write goes over them.

    ``writeback`` (set by a durable writer): every WRITEBACK_BYTES written, the kernel is
    asked to start writing them to the disk (``files.start_writeback``), so that the
    commit's fsync finds most of them there instead of writing them all while the
    caller waits."""

    compressed = False
    FLUSH_BYTES = 4 << 20  # buffer small writes up to this much before a write(2)
    DIRECT_BYTES = 1 << 20  # writes at least this large skip the buffer
    WRITEBACK_BYTES = 8 << 20

    def __init__(self, fd: int, pos: int):
        self.fd = fd
        self.pos = pos  # logical end, including the buffer
        self.start = pos  # file offset of buf[0]: the bytes before it are written
        self.buf = bytearray(self.FLUSH_BYTES)  # allocated once: [0, pos - start) waits
        self.marker: tuple[int, bytes] | None = None  # (file offset, bytes) of the last footer
        self.writeback = False
        self.written_back = pos  # writeback was started for the bytes before this

    def _wrote(self, end: int) -> None:
        """Bytes up to file offset ``end`` are written."""
        if self.writeback and end - self.written_back >= self.WRITEBACK_BYTES:
            start_writeback(self.fd, self.written_back, end - self.written_back)
            self.written_back = end

    def write(self, data: Any, size: int) -> None:
        if size >= self.DIRECT_BYTES:
            self.flush()
            pos = self.pos
            self.start = pos + size  # the bytes up to there are the file's (pos follows)
            pwrite_all(self.fd, memoryview(data).cast("B"), pos)
            self.pos = pos + size
            self._wrote(pos + size)
            return
        fill = self.pos - self.start
        if not 0 <= fill <= self.FLUSH_BYTES - size:
            self.flush()
            fill = 0
        if type(data) is not bytearray:  # records are; anything else is seen as bytes
            data = memoryview(data).cast("B")
        self.buf[fill : fill + size] = data
        self.pos += size  # the bytes are written: one store

    def begin_block(self, size: int, granule: int = 0) -> None:
        """Called before each block; only the frame layer cares where blocks start."""

    def write_blocks(self, data: Any, count: int, size: int, block: int = 0) -> None:
        """``count`` blocks of ``size`` bytes (``block`` of them before the padding) laid
        end to end in ``data``: one write, as no block start matters here (a sink without
        this method gets them one by one)."""
        self.write(data, count * size)

    def rewind(self, pos: int) -> bool:
        """Forget what was written from logical offset ``pos`` on (a record whose write
        failed part way): the next block goes there, and bytes of it already in the file are
        cut off, so no stray bytes stay between blocks or after the last one. True: done.
        ``pos`` is at or after the last commit's end, and so is what is cut."""
        # Cut at the written end too: a direct write that failed part way may have left
        # bytes after it (``start`` counts them, ``pos`` does not).
        os.ftruncate(self.fd, min(pos, self.start))
        self.pos = pos  # first: pos < start means "nothing buffered" until start follows
        self.start = min(self.start, pos)
        self.written_back = min(self.written_back, pos)
        return True

    def flush(self) -> None:
        start, pos = self.start, self.pos
        if pos != start:
            if pos > start:
                with memoryview(self.buf) as view:
                    pwrite_all(self.fd, view[: pos - start], start)
            self.start = pos  # written (a repeat before this store writes the same bytes)
            self._wrote(pos)

    def end_commit(self, footer: bytes, sync: Any) -> None:
        """Write the footer (the last ``len(footer)`` logical bytes): the commit's marker,
        whose presence in the file makes the commit visible."""
        self.marker = (self.pos - len(footer), footer)
        self.flush()

    @property
    def physical_end(self) -> int:
        """Bytes in the file once buffered writes are out."""
        return self.pos

    def read(self, offset: int, n: int) -> bytes:
        self.flush()
        data = os.pread(self.fd, n, offset)
        if len(data) != n:
            raise OSError(f"short read of {n} bytes at {offset}")
        return data


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    # pwrite: explicit offsets, so nothing depends on the descriptor's file position.
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


class PlainFile:
    """An existing plain container opened for appending: its state and a salvaged tail."""

    def __init__(self, fd: int, size: int, path: str):
        self.map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        try:
            self.header, self.commit = open_container(PreadSource(fd, size, owns_fd=False))
            start = align_up(self.commit.end, self.header.alignment)
            self.found, keep = [], self.commit.end
            if size > self.commit.end:
                self.found, keep = scan_tail(self.read, self.header, start, size, self.map, 0)
                keep = max(keep, self.commit.end) if self.found else self.commit.end
            self.keep = keep
            side = side_file(path, fd, keep, size) if size > keep else None
            self.salvage = (
                Salvage(
                    self.commit.record_count,
                    len(self.found),
                    size - self.commit.end,
                    size - keep,
                    side,
                )
                if size > self.commit.end
                else None
            )
        finally:
            try:
                self.map.close()
            except BufferError:
                pass  # an exception's traceback still holds views of the map; they free it

    def read(self, offset: int, n: int) -> memoryview:
        return memoryview(self.map)[offset : offset + n]

    def sink(self, fd: int, **compression: Any) -> PlainSink:
        """The sink that goes on after the kept bytes (compression settings do not apply)."""
        return PlainSink(fd, self.keep)
