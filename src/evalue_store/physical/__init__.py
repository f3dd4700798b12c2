"""The physical variants a container is stored as, told apart by the file's first bytes.

``plain``: the file is the container. ``zstd``: the container stored as zstd frames
(docs/FRAMES.md): ``zstd_source`` / ``zstd_sink`` / ``zstd_layout`` for layout 2,
``zstd_legacy`` and ``seekable`` for layout 1, ``zframe`` for one frame, ``zsalvage`` for a
crashed writer's frames. ``remote`` reads either variant from object storage
(``remote_cache``: whole local copies); ``salvage`` is the tail recovery both share. Every
variant gives readers a source (see ``plain`` for the protocol) and writers a sink; this
module picks one, and everything above it works the same on either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..container import Commit, Header
from .plain import PlainFile, PlainSink, open_plain
from .zstd import append_state, died_before_first_commit, is_compressed, new_zstd_sink, open_zstd


def open_source(
    fd: int, size: int, *, backend: str, cache_bytes: int, max_frame_size: int
) -> tuple[Any, Header, Commit]:
    """A source over the committed bytes of the file at ``fd`` (``size`` bytes), its header
    and last commit. The source takes the descriptor (it is closed on error)."""
    try:
        compressed = is_compressed(os.pread(fd, 8, 0))
    except BaseException:
        os.close(fd)
        raise
    if compressed:
        return open_zstd(fd, size, cache_bytes=cache_bytes, max_frame_size=max_frame_size)
    return open_plain(fd, size, backend)


@dataclass(frozen=True)
class Restart:
    """A compressed file whose writer died creating it: nothing was ever committed, so it
    is started afresh (its bytes saved first), keeping its dictionary."""

    dictionary: bytes | None


def open_for_append(fd: int, size: int, path: str) -> Any:
    """The state of an existing file opened for appending (its tail salvaged), whose
    ``sink(...)`` goes on writing it."""
    if not is_compressed(os.pread(fd, 8, 0)):
        return PlainFile(fd, size, path)
    dictionary = died_before_first_commit(fd, size)
    if dictionary is not None:
        return Restart(dictionary or None)
    return append_state(fd, size, path)


def new_sink(
    fd: int, compression: str | None, dictionary: bytes | None, *, level: int, frame_size: int
) -> Any:
    """A sink for a new, empty file (a compressed one starts with its dictionary frame)."""
    if compression != "zstd":
        return PlainSink(fd, 0)
    return new_zstd_sink(fd, dictionary, level=level, frame_size=frame_size)
