"""What is asked of a store besides ranged reads: an object's info and a directory's
listing as they are now, through a filesystem instance of this process.

fsspec filesystems keep the listings and infos they saw (``dircache``) for as long as the
instance lives, and ``url_to_fs`` hands every open the same cached instance: one listing
made by ``open_shards`` then answered every later info and listing of that prefix, so a
shard added later was invisible, and a replaced object's stale ETag made every fresh open of
it fail as "changed since it was opened". Opening, listing and existence checks therefore
drop what the instance remembers of the path first. An async filesystem (s3fs, gcsfs,
HTTP) is also bound to the process that made it (its event loop, its connections): a
forked child, such as a DataLoader worker, gets an instance of its own.
"""

from __future__ import annotations

import os
from typing import Any

from . import remote_http


def forget(fs: Any, path: str) -> None:
    """Drop what ``fs`` remembers of ``path``: its own entry, its parents' listings (which
    answer its info) and the listings of everything under it (which a glob walks)."""
    path = fs._strip_protocol(path).rstrip("/")
    fs.invalidate_cache(path)
    cache = getattr(fs, "dircache", None)
    if cache is None:
        return
    prefix = path + "/"
    for key in [k for k in list(cache) if isinstance(k, str) and k.startswith(prefix)]:
        cache.pop(key, None)


def info_now(fs: Any, path: str) -> dict:
    """The object's info as the store has it now (never a cached listing's). Over HTTP,
    from requests made here (``remote_http``): a server error is not a missing object."""
    forget(fs, path)
    if remote_http.is_http(fs):
        return remote_http.info(fs, path)
    return fs.info(path)


def own(fs: Any) -> Any:
    """``fs``, or in a process forked after it was made, a new instance of the same class
    and arguments (fsspec's ``skip_instance_cache``): an async filesystem's event loop and
    connections belong to its process and refuse use from another ("not fork-safe")."""
    made_in = vars(fs).get("_pid")  # AsyncFileSystem records its process; others need none
    if made_in is None or made_in == os.getpid():
        return fs
    return type(fs)(*fs.storage_args, **fs.storage_options, skip_instance_cache=True)
