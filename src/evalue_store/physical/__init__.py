"""The physical variants a container is stored as, told apart by the file's first bytes.

``plain``: the file is the container. ``zstd``: the container stored as zstd frames
(docs/FRAMES.md): ``zstd_source`` (with ``zstd_pass``) / ``zstd_sink`` / ``zstd_layout`` for
layout 2, ``zstd_legacy`` and ``seekable`` for layout 1, ``zframe`` for one frame,
``zsalvage`` for a crashed writer's frames. ``remote`` reads either variant from object storage
(``remote_cache``: whole local copies); ``salvage`` is the tail recovery both share. Every
variant gives readers a source (see ``plain`` for the protocol) and writers a sink; this
module opens a file by its name or URL (``open_file``) and picks the variant, so that
everything above it works the same on any of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..bounded import open_regular
from ..container import Commit, Header
from ..errors import FormatError
from . import remote, remote_cache, remote_source
from .plain import PlainFile, PlainSink, open_plain
from .zstd import append_state, died_before_first_commit, is_compressed, new_zstd_sink, open_zstd

OPEN_ATTEMPTS = 5  # opens retried while a writer changes the file's tail underneath


@dataclass(frozen=True)
class Opened:
    """A container opened for reading at its last commit."""

    source: Any  # the committed bytes (see ``plain`` for the protocol); the caller closes it
    header: Header
    commit: Commit
    identity: tuple  # tells the file or object opened from one that later took its name
    tail: int  # bytes after the last commit (a crashed or running writer's)


def reopen_name(path: str, filesystem: Any = None) -> str:
    """The name to open ``path`` by now and on every later reopen: a local path is made
    absolute (a later chdir changes nothing); a URL, or a path in ``filesystem``, is kept."""
    if filesystem is None and not remote.is_url(path):
        return os.path.abspath(path)
    return path


def open_file(
    path: str,
    *,
    backend: str,
    cache_bytes: int,
    max_frame_size: int,
    filesystem: Any = None,
    storage_options: dict | None = None,
    cache_dir: str | None = None,
) -> Opened:
    """Open the container at ``path`` (a local file, an fsspec URL, or a path within
    ``filesystem``; with ``cache_dir``, a checked local copy of a remote object) at its
    last commit, whatever variant stores it.

    A writer may be cutting off an uncommitted tail (abort, recovery) while the tail is
    searched: a FormatError from a file whose size changed meanwhile is that race, and the
    open is tried again."""
    if filesystem is not None or remote.is_url(path):
        fs, inner, url = remote.resolve(path, filesystem, storage_options)
        if cache_dir is None:
            source, header, commit, identity = remote_source.open_remote(
                fs, inner, url, cache_bytes=cache_bytes, max_frame_size=max_frame_size
            )
            return Opened(source, header, commit, identity, identity[0] - source.physical_end)
        path = remote_cache.local_copy(fs, inner, url, cache_dir)
    attempts = 0
    while True:
        attempts += 1
        fd = open_regular(path)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        try:
            source, header, commit = open_source(
                fd,
                st.st_size,
                backend=backend,
                cache_bytes=cache_bytes,
                max_frame_size=max_frame_size,
            )  # closes fd
        except FormatError:
            now = os.stat(path)
            same = (now.st_size, now.st_mtime_ns, now.st_ino) == (
                st.st_size,
                st.st_mtime_ns,
                st.st_ino,
            )
            if same or attempts == OPEN_ATTEMPTS:
                raise
        else:
            tail = st.st_size - source.physical_end
            return Opened(source, header, commit, (st.st_dev, st.st_ino), tail)


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
        return open_zstd(
            fd, size, cache_bytes=cache_bytes, max_frame_size=max_frame_size, backend=backend
        )
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
