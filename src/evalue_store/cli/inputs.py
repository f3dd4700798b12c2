"""Opening `pack`'s input files: only regular files are read.

A device (``z.bin`` a link to /dev/zero) would be read without end, and a FIFO could
wait forever for a writer; a socket cannot be opened at all. The check is made on the
opened descriptor, so a file swapped for one of these after the folder walk is refused too.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from .render import CliError


def special_kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file (None when it is)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a special file"


def kind_of(path: str) -> str:
    """What ``path`` names, for a note on a file the folder walk leaves out."""
    try:
        return special_kind(os.stat(path).st_mode) or "a regular file"
    except OSError:
        return "a dangling link" if os.path.islink(path) else "gone"


def not_regular(path: str, kind: str) -> CliError:
    """The refusal of the input ``path``, which is ``kind`` ("a FIFO"...)."""
    return CliError(path, f"cannot read: not a regular file ({kind}); pack reads files only")


@contextmanager
def open_input(path: str) -> Iterator[BinaryIO]:
    """``path`` opened for binary reading, refused unless the open file is a regular one.
    The open does not wait (O_NONBLOCK: a FIFO without a writer would block in open(2));
    the flag is cleared once the file is known to be regular."""
    nonblock = getattr(os, "O_NONBLOCK", 0)
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | nonblock
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise not_regular(path, "a socket, or a device without a driver") from None
        raise
    try:
        kind = special_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise not_regular(path, kind)
        if nonblock:
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f
