"""The byte reader: how a physical variant reads the bytes of a stored file.

A physical variant (plain, zstd) reads the file it is stored in only through an object with
``name`` (the path or URL that errors name), ``size`` (bytes in the file when it was opened),
``pread(offset, n)`` (exactly ``n`` bytes, fewer only where the file ends), ``pread_many``
(several ranges at once: a remote reader coalesces them and issues the requests
concurrently) and ``close()``. A local file is read with ``os.pread``; a remote object
(``remote``) with ranged requests, so the same variant code serves both. ``MapReader``
serves a local file's committed bytes from a mapping: no system call per read.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import sys
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class ByteReader(Protocol):
    name: str
    size: int

    def pread(self, offset: int, n: int) -> bytes | memoryview: ...

    def pread_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | memoryview]: ...

    def close(self) -> None: ...


class Descriptor:
    """A file descriptor that ``owned`` closes when its last holder lets go of it (CPython
    frees an object as its last reference goes). A reader's ``close()`` drops its own hold;
    a ``pread`` another thread has under way (without the GIL) holds it too, so the number
    is neither closed nor reused by a file opened meanwhile until that read is done: a
    plain int closed under it could make the read return another file's bytes."""

    __slots__ = ("number", "owned")

    def __init__(self, number: int, owned: bool):
        self.number, self.owned = number, owned

    def close(self) -> None:
        if self.owned:
            self.owned = False  # (first: never closed twice)
            os.close(self.number)

    def __del__(self) -> None:
        if self.owned:  # a read under way held it when its reader was closed
            with contextlib.suppress(OSError):
                os.close(self.number)


def let_go(held: Descriptor | None) -> None:
    """A reader's ``close()``, which has just dropped its hold on ``held``: the descriptor
    is closed now (an error or an interrupt is the caller's) unless a read under way holds
    it too, which closes it when done (CPython counts the holders: the caller's name, this
    function's and getrefcount's argument are three)."""
    if held is not None and sys.getrefcount(held) <= 3:
        held.close()


class FdReader:
    """A local file through ``os.pread``: no shared file position, so forked workers and
    threads may share the descriptor. ``owns_fd``: it is closed once closed here and no
    read is under way (``Descriptor``)."""

    def __init__(self, fd: int, size: int, name: str = "", *, owns_fd: bool = False):
        self.held: Descriptor | None = Descriptor(fd, owns_fd)
        self.size = size
        self.name = name

    @property
    def fd(self) -> int:
        held = self.held
        return -1 if held is None else held.number

    def pread(self, offset: int, n: int) -> bytes:
        held = self.held  # (kept until the read is done; None once closed: an error)
        parts = []
        while n > 0:
            got = os.pread(held.number, n, offset)
            if not got:
                break  # the file ends here
            parts.append(got)
            offset += len(got)
            n -= len(got)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def pread_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.pread(offset, n) for offset, n in ranges]

    def close(self) -> None:
        held, self.held = self.held, None
        let_go(held)


class MapReader:
    """The first ``size`` bytes of a local file through a read-only mapping: a read is a
    copy out of it, without the system call a ``pread`` costs (a random compressed read
    makes two). Only committed bytes are mapped: a writer cuts only what lies after them.
    ``owns_fd``: ``close()`` closes the descriptor too."""

    def __init__(self, fd: int, size: int, name: str = "", *, owns_fd: bool = False):
        self.fd = fd
        self.size = size
        self.name = name
        self.owns_fd = owns_fd
        self.map = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None

    def pread(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0:  # as os.pread: a slice would count from the end
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if self.map is None:
            return b""
        return self.map[offset : offset + n]  # a copy: no buffer of the map is ever exported

    def pread_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.pread(offset, n) for offset, n in ranges]

    def close(self) -> None:
        m, self.map = self.map, None
        if m is not None:
            m.close()
        fd, self.fd = self.fd, -1
        if self.owns_fd and fd >= 0:
            os.close(fd)


GATHER_GAP = 4 << 10  # ranges of a batch this close together are read as one span


class Gather:
    """How a batch of byte ranges (``offsets``, ``sizes``: int64 arrays) is read in one
    pass: as ``spans`` (start, n), sorted, each merging ranges closer than ``gap``, placed
    in one buffer of ``size`` bytes at ``places``, each congruent to its start modulo
    ``alignment`` (so aligned data stays aligned); range k is then at ``positions[k]``.
    The buffer ends with 8 bytes to spare: a reader of 8-byte words never runs off it."""

    def __init__(self, offsets: np.ndarray, sizes: np.ndarray, alignment: int, gap: int):
        order = np.argsort(offsets, kind="stable")
        starts = offsets[order]
        ends = starts + sizes[order]
        reach = np.maximum.accumulate(ends)
        new = np.ones(len(starts), bool)
        new[1:] = starts[1:] > reach[:-1] + gap
        firsts = np.flatnonzero(new)
        span_starts = starts[firsts]
        span_sizes = np.maximum.reduceat(ends, firsts) - span_starts
        slack = alignment - 1  # each span may need this much to reach its congruent place
        places = np.cumsum(span_sizes + slack) - (span_sizes + slack)
        places += (span_starts - places) % alignment
        self.size = (int(places[-1] + span_sizes[-1]) if len(places) else 0) + 8
        self.spans = list(zip(span_starts.tolist(), span_sizes.tolist()))
        self.places = places.tolist()
        span_of = np.empty(len(offsets), np.int64)
        span_of[order] = np.cumsum(new) - 1
        self.positions = places[span_of] + offsets - span_starts[span_of]
