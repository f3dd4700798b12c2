"""A container opened through a ``RemoteReader`` (``remote``): ``open_remote`` and
``RemoteSource``, the plain source (the protocol in ``plain``) over the reader, whose reads
make every check a local read makes, the same way. A compressed object is read by the zstd
source through the same reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..buffers import read_only
from ..container import Commit, Header, open_container
from ..errors import TRUNCATED, FormatError
from .plain import CHUNK, _PlainSource, aligned_buffer
from .remote import BLOCK_SIZE, HEAD_BYTES, RemoteReader, identity, stat
from .zstd import is_compressed, open_reader


class RemoteSource(_PlainSource):
    """A plain container read through a RemoteReader (``mapped`` is None, as for
    PreadSource). ``pin`` holds the ranges of a batch, fetched in one round, until the
    next batch."""

    mapped = None

    def __init__(self, reader: RemoteReader, size: int, alignment: int = 64):
        self.reader = reader
        self.name = reader.name
        self.size = size
        self.alignment = alignment
        self._pinned: dict[tuple[int, int], bytes] = {}

    def set_alignment(self, alignment: int) -> None:
        self.alignment = alignment

    def read(self, offset: int, n: int) -> memoryview:
        data = self._pinned.get((offset, n))
        if data is None:
            if offset < 0 or n < 0 or offset + n > self.size:
                raise FormatError(
                    f"file ends early: wanted {n} bytes", offset, self.name, code=TRUNCATED
                )
            data = self.reader.pread(offset, n)
        return self._aligned(data, offset, n)

    def _aligned(self, data: bytes, offset: int, n: int) -> memoryview:
        if len(data) != n:
            raise FormatError(
                f"file ends early: wanted {n} bytes", offset + len(data), self.name, code=TRUNCATED
            )
        view = memoryview(aligned_buffer(n, self.alignment))
        view[:] = data
        return read_only(view)  # arrays of it are read-only like a mapping's

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        return self.read(offset, n), 0

    def pin(self, ranges: Sequence[tuple[int, int]], *, index: bool = False) -> None:
        """Fetch ``(offset, n)`` ranges in one round; reads of exactly them need no request
        until ``unpin``. ``index``: they are index entries, fetched and cached by block."""
        wanted = [(o, n) for o, n in ranges if 0 <= o and 0 <= n and o + n <= self.size]
        got = self.reader.pread_many(wanted, whole_blocks=index)
        self._pinned = dict(zip(wanted, got))

    def unpin(self) -> None:
        self._pinned = {}

    gap = 0  # the reader coalesces a round's requests itself (MERGE_GAP)

    def _fill(self, plan: Any, buf: memoryview, index: bool) -> None:
        """All spans in one round of ``pread_many`` (``index``: fetched by block)."""
        got = self.reader.pread_many(plan.spans, whole_blocks=index)
        for data, (start, n), place in zip(got, plan.spans, plan.places):
            if len(data) != n:
                reason = f"file ends early: wanted {n} bytes"
                raise FormatError(reason, start + len(data), self.name, code=TRUNCATED)
            buf[place : place + n] = data

    def chunks(self) -> Any:
        for start in range(0, self.size, CHUNK):
            yield self.read(start, min(CHUNK, self.size - start))

    def close(self) -> None:
        self._pinned = {}
        self.reader.close()


def open_remote(
    fs: Any,
    path: str,
    url: str,
    *,
    cache_bytes: int,
    max_frame_size: int,
    block_size: int = BLOCK_SIZE,
) -> tuple[Any, Header, Commit, tuple]:
    """Open the container at ``url`` at its last commit: its source, header, commit and
    identity. Costs an info request and one round for head and tail (the footer, and what
    a header longer than HEAD_BYTES needs, come from the cache or one more request). A
    compressed file is read by the zstd source through the same reader: a record costs
    the frame(s) holding it."""
    info = stat(fs, path, url)
    reader = RemoteReader(fs, path, url, info, block_size=block_size, cache_bytes=cache_bytes)
    size = reader.size
    head = (0, min(size, HEAD_BYTES))
    tail = (max(0, size - HEAD_BYTES), size - max(0, size - HEAD_BYTES))
    try:
        if size:
            reader.pread_many([head, tail] if tail[0] > head[1] else [(0, size)])
        with _placed(url):
            if is_compressed(reader.pread(0, 8)):
                source, header, commit = open_reader(
                    reader, cache_bytes=cache_bytes, max_frame_size=max_frame_size
                )
                return source, header, commit, identity(info)
            header, commit = open_container(RemoteSource(reader, size))
    except BaseException:
        reader.close()
        raise
    return RemoteSource(reader, commit.end, header.alignment), header, commit, identity(info)


class _placed:
    """Put the URL into FormatErrors raised by the layers below, which know no path."""

    def __init__(self, url: str):
        self.url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if isinstance(exc, FormatError) and exc.path is None:
            raise exc.at(path=self.url) from None
        return False
