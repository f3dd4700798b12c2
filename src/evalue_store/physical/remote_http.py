"""Requests to an HTTP(S) server made here, over the aiohttp session of fsspec's
HTTPFileSystem, rather than through its ``info`` and ``cat_file``.

Those two cannot carry a ranged reader's guarantees. Its ``info`` turns every failure (a 503
as much as a 404) into FileNotFoundError, after trying an unranged GET of the whole object;
its ``cat_file`` takes any 2xx body as the bytes asked, whatever the Content-Range says, so a
server (or a proxy) answering another range is believed. Here a missing object (404, 410) is
FileNotFoundError, 401 and 403 PermissionError, and any other failure aiohttp's
ClientResponseError (with its status), which the caller retries. A 206 must name exactly the
range asked, of an object of the size opened, and carry that many bytes; a 200 is accepted
only where the whole object was asked.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
from collections.abc import Callable
from typing import Any

from ..errors import CHANGED, FormatError, RemoteError

Ranges = list[tuple[int, int]]
CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")
# A request fails (and is retried, as a dropped connection is) when connecting takes longer,
# or when the server then sends nothing for READ_TIMEOUT_S: a server that accepts a request
# and never answers held a reader forever. The same bounds are given to botocore for S3.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 20.0
# A HEAD refused with these may still be a GET served (a presigned URL signs one method; some
# servers implement GET alone): the object's info then comes from a ranged GET.
HEAD_REFUSED = (403, 405, 501)


def is_http(fs: Any) -> bool:
    """True for fsspec's HTTPFileSystem (protocols http and https)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "http" in protocols and hasattr(fs, "set_session")


def _request(fs: Any, extra: dict[str, str]) -> tuple[dict, dict]:
    """(headers, other aiohttp arguments) for a request: the filesystem's own (its
    ``storage_options``: headers, auth...) with ``extra`` headers added."""
    import aiohttp

    kwargs = dict(getattr(fs, "kwargs", {}) or {})
    headers = {**(kwargs.pop("headers", None) or {}), "Accept-Encoding": "identity", **extra}
    kwargs.setdefault("allow_redirects", True)
    if "timeout" not in (getattr(fs, "client_kwargs", None) or {}):  # else the user's
        kwargs.setdefault(
            "timeout",
            aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S),
        )
    return headers, kwargs


def _check(response: Any, url: str) -> None:
    """Raise for a response that is not a success: what the status means, not one guess."""
    status = response.status
    if status in (404, 410):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), url)
    if status in (401, 403):
        raise PermissionError(errno.EACCES, f"{os.strerror(errno.EACCES)} (HTTP {status})", url)
    response.raise_for_status()  # aiohttp's ClientResponseError: 412, 5xx... (retried or judged)


def info(fs: Any, path: str) -> dict:
    """The object's info (size, ETag, Last-Modified) from a HEAD; where the HEAD tells no
    size, from the Content-Range of a ranged GET of its first byte (never the whole)."""
    from fsspec.asyn import sync

    return sync(fs.loop, _info, fs, path)


async def _info(fs: Any, path: str) -> dict:
    session = await fs.set_session()
    url = fs.encode_url(path)
    headers, kwargs = _request(fs, {})
    out: dict[str, Any] = {"name": path, "size": None, "type": "file"}
    async with session.head(url, headers=headers, **kwargs) as r:
        if r.status not in HEAD_REFUSED:  # else the GET below tells
            _check(r, path)
            if r.headers.get("Content-Encoding", "identity") in ("identity", ""):
                length = r.headers.get("Content-Length")
                out["size"] = int(length) if length and length.isdigit() else None
            _identity(r, out)
    if out["size"] is None:
        headers["Range"] = "bytes=0-0"
        async with session.get(url, headers=headers, **kwargs) as r:
            _check(r, path)
            parsed = CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            if r.status == 206 and parsed and parsed.group(3) != "*":
                out["size"] = int(parsed.group(3))
            _identity(r, out)
    return out


def _identity(response: Any, out: dict) -> None:
    """The ETag and Last-Modified of ``response`` into ``out``, unless a HEAD gave them."""
    for name in ("ETag", "Last-Modified"):
        if response.headers.get(name):
            out.setdefault(name, response.headers[name])


def getter(fs: Any, path: str, url: str, size: int, etag: str | None) -> Callable:
    """The function fetching ranges [start, end) of the object (``size`` bytes at open),
    each GET conditional on ``etag`` (If-Match) when there is one; a range's result is its
    bytes or the exception that stopped it (retried by the caller unless it is one of
    evalue_store's own, which are verdicts)."""
    from fsspec.asyn import sync

    headers, kwargs = _request(fs, {"If-Match": etag} if etag else {})

    async def one(start: int, end: int) -> bytes:
        if start >= end:
            return b""
        session = await fs.set_session()
        asked = {**headers, "Range": f"bytes={start}-{end - 1}"}
        async with session.get(fs.encode_url(path), headers=asked, **kwargs) as r:
            _check(r, path)
            if r.status == 206:
                _check_range(r.headers.get("Content-Range"), start, end, size, url)
                body = await r.read()
                if len(body) != end - start:
                    raise RemoteError(
                        f"{url}: the server sent {len(body)} bytes for bytes {start}-{end - 1} "
                        "(its Content-Range says otherwise)"
                    )
                return body
            if r.status != 200:
                raise RemoteError(f"{url}: bytes {start}-{end - 1}: unexpected HTTP {r.status}")
            length = r.content_length
            if length is not None and length != size:
                raise FormatError(
                    f"object changed since it was opened ({size} bytes, now {length})",
                    start,
                    url,
                    code=CHANGED,
                )
            if (start, end) != (0, size):
                raise RemoteError(
                    f"{url}: the server ignores Range (it sent all {size} bytes for bytes "
                    f"{start}-{end - 1}); ranged reads need one that honours it"
                )
            body = await r.read()
            if len(body) != size:
                raise FormatError(
                    f"object changed since it was opened: {len(body)} bytes where {size} "
                    "were asked",
                    len(body),
                    url,
                    code=CHANGED,
                )
            return body

    async def many(ranges: Ranges) -> list[Any]:
        return await asyncio.gather(*(one(s, e) for s, e in ranges), return_exceptions=True)

    return lambda ranges: sync(fs.loop, many, ranges)


def _check_range(header: str | None, start: int, end: int, size: int, url: str) -> None:
    """A 206's Content-Range must be the range asked, of an object of the size opened: one
    of another size changed since (a shorter one clips the range); any other range is the
    server's error, never taken as the bytes asked."""
    parsed = CONTENT_RANGE.match(header or "")
    if parsed is None:
        raise RemoteError(
            f"{url}: bytes {start}-{end - 1}: a 206 answer without a usable Content-Range "
            f"({header!r})"
        )
    first, last, total = int(parsed.group(1)), int(parsed.group(2)), parsed.group(3)
    if total != "*" and int(total) != size:
        raise FormatError(
            f"object changed since it was opened ({size} bytes, now {total})",
            start,
            url,
            code=CHANGED,
        )
    if (first, last) != (start, end - 1):
        raise RemoteError(
            f"{url}: the server answered bytes {first}-{last} to a request for bytes "
            f"{start}-{end - 1}"
        )
