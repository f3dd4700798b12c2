"""What is asked of a store besides ranged reads: an object's info and a directory's
listing, as they are now.

fsspec filesystems keep the listings and infos they saw (``dircache``) for as long as the
instance lives, and ``url_to_fs`` hands every open the same cached instance: one listing
made by ``open_shards`` then answered every later info and listing of that prefix, so a
shard added later was invisible, and a replaced object's stale ETag made every fresh open of
it fail as "changed since it was opened". Opening, listing and existence checks therefore
drop what the instance remembers of the path first.
"""

from __future__ import annotations

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
