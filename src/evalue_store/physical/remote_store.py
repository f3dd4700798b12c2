"""What is asked of a store besides ranged reads: an object's info.

Over HTTP the info comes from requests made here (``remote_http``): fsspec's turned a
server error into FileNotFoundError.
"""

from __future__ import annotations

from typing import Any

from . import remote_http


def info_now(fs: Any, path: str) -> dict:
    """The object's info. Over HTTP, from requests made here (``remote_http``): a server
    error is not a missing object."""
    if remote_http.is_http(fs):
        return remote_http.info(fs, path)
    return fs.info(path)
