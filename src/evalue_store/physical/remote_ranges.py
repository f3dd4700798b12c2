"""How the byte ranges of one remote object are requested: concurrently, and each on the
condition that the object is still the one opened.

Checking each response against the index is not enough: once an object is replaced by
another of the same size, a record's index entry and frame may both come from the new
object and agree with each other, while entries cached earlier still come from the old
one. So every ranged GET carries the identity captured at open, and a store that holds
another object under the name by now refuses it (412 Precondition Failed) instead of
serving its bytes: over HTTP an ``If-Match`` header with the object's strong ETag (those
requests are made by ``remote_http``, which also checks each answer's Content-Range), on
S3 (s3fs) ``get_object(IfMatch=ETag)``. Where neither is possible (no strong ETag, another
filesystem) reads are unconditional and a warning at open says
what is then left unchecked.
"""

from __future__ import annotations

import asyncio
import errno
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import remote_http

Ranges = list[tuple[int, int]]
Getter = Callable[[Ranges], list[Any]]  # bytes [start, end) of each range, or its exception


def getter(fs: Any, path: str, url: str, info: dict, threads: int, warn: bool = True) -> Getter:
    """The function fetching ranges of the object ``info`` describes (``warn``: say at
    open when they cannot be conditional; a forked child's reader, rebuilt, does not)."""
    etag = info.get("ETag") or info.get("etag")
    strong = isinstance(etag, str) and etag.startswith('"')  # If-Match never matches W/"..."
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if strong and hasattr(fs, "_call_s3") and "s3" in protocols:
        return _s3_getter(fs, path, etag)
    http = remote_http.is_http(fs)  # Content-Range checked, with or without an ETag
    if strong and http:
        return remote_http.getter(fs, path, url, int(info["size"]), etag)
    why = "the server gives no strong ETag" if not strong else f"{type(fs).__name__} reads"
    if warn:
        warnings.warn(
            f"{url}: {why}, so ranged reads cannot be made conditional on the object opened; "
            "if it is replaced by another of the same size, records of both may be returned",
            stacklevel=2,
        )
    if http:
        return remote_http.getter(fs, path, url, int(info["size"]), None)
    return _fsspec_getter(fs, path, threads, {})


def refused(exc: BaseException) -> bool:
    """True for a store's refusal of a conditional request: the object is another one."""
    if getattr(exc, "status", None) == 412:  # aiohttp's ClientResponseError
        return True
    # s3fs turns S3's PreconditionFailed into OSError(EINVAL, "...pre-conditions...")
    return isinstance(exc, OSError) and exc.errno == errno.EINVAL and "pre-condition" in str(exc)


def _fsspec_getter(fs: Any, path: str, threads: int, kwargs: dict) -> Getter:
    def one(start: int, end: int) -> Any:
        try:
            return fs.cat_file(path, start=start, end=end, **kwargs)
        except Exception as exc:
            return exc

    def get(ranges: Ranges) -> list[Any]:
        if len(ranges) == 1:
            return [one(*ranges[0])]
        if not getattr(fs, "async_impl", False):
            with ThreadPoolExecutor(min(threads, len(ranges))) as pool:
                return list(pool.map(lambda r: one(*r), ranges))
        return fs.cat_ranges(
            [path] * len(ranges),
            [start for start, _ in ranges],
            [end for _, end in ranges],
            on_error="return",
            **kwargs,
        )

    return get


def _s3_getter(fs: Any, path: str, etag: str) -> Getter:
    """s3fs's cat_file takes no IfMatch: its own get_object call, as its S3File makes."""
    from fsspec.asyn import sync

    bucket, key, version = fs.split_path(path)
    extra = {"IfMatch": etag, **({"VersionId": version} if version else {})}

    async def one(start: int, end: int) -> bytes:
        if start >= end:
            return b""
        resp = await fs._call_s3(
            "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
        )
        try:
            return await resp["Body"].read()
        finally:
            resp["Body"].close()

    async def many(ranges: Ranges) -> list[Any]:
        return await asyncio.gather(*(one(s, e) for s, e in ranges), return_exceptions=True)

    return lambda ranges: sync(fs.loop, many, ranges)
