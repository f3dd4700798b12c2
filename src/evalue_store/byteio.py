"""The byte reader: how a physical variant reads the bytes of a stored file.

A physical variant (plain, zstd) reads the file it is stored in only through an object with
``name`` (the path or URL that errors name), ``size`` (bytes in the file when it was opened),
``pread(offset, n)`` (exactly ``n`` bytes, fewer only where the file ends), ``pread_many``
(several ranges at once: a remote reader coalesces them and issues the requests
concurrently) and ``close()``. A local file is read with ``os.pread``; a remote object
(``remote``) with ranged requests, so the same variant code serves both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class ByteReader(Protocol):
    name: str
    size: int

    def pread(self, offset: int, n: int) -> bytes | memoryview: ...

    def pread_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | memoryview]: ...

    def close(self) -> None: ...


class FdReader:
    """A local file through ``os.pread``: no shared file position, so forked workers and
    threads may share the descriptor. ``owns_fd``: ``close()`` closes it."""

    def __init__(self, fd: int, size: int, name: str = "", *, owns_fd: bool = False):
        self.fd = fd
        self.size = size
        self.name = name
        self.owns_fd = owns_fd

    def pread(self, offset: int, n: int) -> bytes:
        parts = []
        while n > 0:
            got = os.pread(self.fd, n, offset)
            if not got:
                break  # the file ends here
            parts.append(got)
            offset += len(got)
            n -= len(got)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def pread_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return [self.pread(offset, n) for offset, n in ranges]

    def close(self) -> None:
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
