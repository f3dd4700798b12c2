"""Whole-object local copies of remote containers (``cache_dir=``), for data read many times.

A copy is named after the URL and the object's identity (size and ETag where the store
gives one), downloaded into a temporary file in the same directory, fsynced, renamed into
place and the directory fsynced: a partial download never has the final name. Before a
copy is used, its size and its last bytes (the trailer, which carries the last footer's
CRC) must match the remote object's.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from typing import Any

from ..errors import CHANGED, FormatError
from ..files import atomic_file
from .remote import RemoteReader, identity, stat

PIECE = 8 << 20  # bytes per ranged GET of a download
PIECES_AT_ONCE = 4  # GETs in flight
TAIL_CHECK = 64  # trailing bytes compared between the copy and the object


def copy_name(url: str, info: dict) -> str:
    """The file name of the copy of this version of the object."""
    key = hashlib.sha256(repr((url, identity(info))).encode()).hexdigest()[:32]
    return f"{key}-{posixpath.basename(url.rstrip('/')) or 'object'}"


def local_copy(fs: Any, path: str, url: str, cache_dir: str) -> str:
    """The path of a checked local copy of the object at ``url``, downloaded if needed."""
    info = stat(fs, path, url)
    size = int(info["size"])
    os.makedirs(cache_dir, exist_ok=True)
    dest = os.path.join(cache_dir, copy_name(url, info))
    reader = RemoteReader(fs, path, url, info, cache_bytes=0)
    tail = (max(0, size - TAIL_CHECK), size)
    if os.path.exists(dest) and _matches(dest, size, tail, reader):
        return dest
    _download(reader, dest)
    if not _matches(dest, size, tail, reader):
        os.unlink(dest)
        raise FormatError("object changed while it was being copied", None, url, code=CHANGED)
    return dest


def _matches(local: str, size: int, tail: tuple[int, int], reader: RemoteReader) -> bool:
    if os.path.getsize(local) != size:
        return False
    with open(local, "rb") as f:
        f.seek(tail[0])
        mine = f.read(tail[1] - tail[0])
    return mine == reader.fetch([tail])[0]


def _download(reader: RemoteReader, dest: str) -> None:
    with atomic_file(dest, mode=0o600) as f:  # private, as the copies have always been
        starts = list(range(0, reader.size, PIECE))
        for k in range(0, len(starts), PIECES_AT_ONCE):
            group = [(s, min(reader.size, s + PIECE)) for s in starts[k : k + PIECES_AT_ONCE]]
            for data in reader.fetch(group):
                f.write(data)
