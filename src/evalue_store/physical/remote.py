"""Containers read straight from object storage (S3, GCS, Azure, HTTP...) through fsspec.

Only explicit byte ranges are requested, never an open-ended read: opening costs the
object's size (one metadata request), then one round of two ranged GETs (the head and the
tail) and, rarely, one more for a footer larger than the tail; a record costs the block of
the index holding its entry and the bytes of its frame. Bytes come through ``RemoteReader``
(the byte-reader protocol of ``byteio``), which caches fixed-size blocks up to a byte
limit, coalesces the ranges of a batch and fetches them concurrently; ``remote_source``
opens a container over it. Needs the ``remote`` extra (fsspec, and s3fs, gcsfs or adlfs...).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from ..errors import CHANGED, Error, FormatError, RemoteError, UsageError
from . import remote_http, remote_ranges
from .remote_store import info_now, own

BLOCK_SIZE = 64 << 10  # bytes per cached block: an index block holds 4096 entries
SMALL_READ = 1 << 10  # a random read smaller than this fetches its block; larger, itself
HEAD_BYTES = 64 << 10  # bytes of the head and of the tail fetched at open
MERGE_GAP = 16 << 10  # ranges of a batch this close together are fetched as one
MAX_REQUEST = 16 << 20  # no coalesced request grows beyond this
MAX_READAHEAD = 2 << 20  # a scan's fetches double up to this...
RUNS = 4  # ...for each of this many recent fetches, held besides the cache
RETRIES = 4  # a failed range is tried this many more times, with backoff
BACKOFF_S = 0.2  # first wait; doubles per retry
THREADS = 16  # concurrent requests for filesystems without an async implementation
# Errors that retrying cannot cure.
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_ERRNO = dict(zip(PERMANENT, (errno.ENOENT, errno.EACCES, errno.EISDIR, errno.ENOTDIR)))


def named(exc: OSError, url: str) -> OSError:
    """A permanent error of the store as the local one would be: its kind, a reason and
    the URL as its filename (fsspec's often hold only the URL, or nothing)."""
    kind = next(k for k in PERMANENT if isinstance(exc, k))
    code = exc.errno or _ERRNO[kind]
    return kind(code, exc.strerror or os.strerror(code), url)


def is_url(path: Any) -> bool:
    """True for an fsspec URL (``s3://...``, ``https://...``); a local path is not one."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def resolve(
    path: str | os.PathLike, filesystem: Any = None, storage_options: dict | None = None
) -> tuple[Any, str, str]:
    """(filesystem, path within it, URL for messages) for ``path``; ``storage_options`` go
    to fsspec when it picks the filesystem from the URL, as in pandas or HF datasets."""
    try:
        import fsspec.core
    except ImportError:
        raise ImportError(
            "reading or writing URLs needs the remote extra: pip install 'evalue_store[remote]'"
        ) from None
    text = os.fspath(path)
    if filesystem is not None:
        if storage_options:
            raise UsageError("give storage_options or a filesystem, not both")
        filesystem = own(filesystem)  # one made before a fork is the parent's
        inner = filesystem._strip_protocol(text)
        return filesystem, inner, filesystem.unstrip_protocol(inner)
    options = dict(storage_options or {})
    if text.split("://", 1)[0] in ("s3", "s3a"):
        # One attempt a request from botocore unless told otherwise: the retries are ours
        # (RETRIES, with backoff). Its own under ours made a dead endpoint take 80 s to
        # report instead of about 3.
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        config.setdefault("connect_timeout", remote_http.CONNECT_TIMEOUT_S)
        config.setdefault("read_timeout", remote_http.READ_TIMEOUT_S)
        options["config_kwargs"] = config
    fs, inner = fsspec.core.url_to_fs(text, **options)
    return fs, inner, text


def identity(info: dict) -> tuple:
    """What tells one version of an object from another: its size and, where the store
    gives them, its ETag or modification time."""
    tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime")
    return (int(info["size"]), str(tag) if tag is not None else None)


def stat(fs: Any, path: str, url: str) -> dict:
    """The object's info (size, ETag...) as the store has it now, with retries;
    FileNotFoundError names the URL."""
    info = _retrying(lambda: info_now(fs, path), url, "info")
    if info.get("type") == "directory":
        raise IsADirectoryError(f"{url}: is a directory")
    if not isinstance(info.get("size"), int):
        raise Error(f"{url}: the server does not tell the object's size (ranged reads need it)")
    return info


def why(exc: BaseException) -> str:
    """A failure in a few words: an HTTP status as such (aiohttp's repr holds every
    header of the request and the answer), anything else as its repr."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"HTTP {status} {getattr(exc, 'message', '')}".rstrip()
    return repr(exc)


def _retrying(call: Any, url: str, what: str) -> Any:
    for attempt in range(RETRIES + 1):
        try:
            return call()
        except PERMANENT as exc:
            raise named(exc, url) from None
        except Exception as exc:  # network and server errors: every library has its own
            if attempt == RETRIES:
                reason = f"{url}: {what} failed after {RETRIES + 1} tries: {why(exc)}"
                raise RemoteError(reason) from exc
            time.sleep(BACKOFF_S * 2**attempt)
    raise AssertionError("unreachable")


class RemoteReader:
    """A remote object read by ranged GETs, through a cache of ``block_size`` blocks
    holding at most ``cache_bytes``. ``requests`` and ``fetched`` count what was asked of
    the server (for tests and benchmarks)."""

    def __init__(
        self,
        fs: Any,
        path: str,
        url: str,
        info: dict,
        *,
        block_size: int = BLOCK_SIZE,
        cache_bytes: int = 32 << 20,
    ):
        self.fs, self.path, self.name = fs, path, url
        self.info = info
        self.size = int(info["size"])
        self.block_size = block_size
        self.cache_bytes = max(cache_bytes, block_size)
        # block number -> its bytes; (offset, n) -> the bytes of an exact read
        self._blocks: OrderedDict[Any, bytes] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self._runs: list[tuple[int, bytes, int]] = []  # recent fetches: start, bytes, read-ahead
        self.requests = 0
        self.fetched = 0
        self._pid = os.getpid()
        self._ranges = remote_ranges.getter(fs, path, url, info, THREADS)  # conditional GETs

    def _forked(self) -> None:
        """In a forked child (a DataLoader worker under fork): a lock the parent held at
        the fork would never be released here, and the parent's filesystem (its event
        loop, its connections) refuses use from here, so the child starts with its own
        of each; the same conditions on the same object opened."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.fs = own(self.fs)
        self._ranges = remote_ranges.getter(
            self.fs, self.path, self.name, self.info, THREADS, warn=False
        )

    # -------------------------------------------------------------- fetching

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Bytes [start, end) of each range, all requested at once, each on the condition
        that the object is the one opened (``remote_ranges``); a range the server refuses
        that way or answers short means the object changed since it was opened:
        FormatError."""
        if self._pid != os.getpid():
            self._forked()
        ranges = list(ranges)
        out: list[Any] = [None] * len(ranges)
        pending = list(range(len(ranges)))
        for attempt in range(RETRIES + 1):
            got = self._cat([ranges[k] for k in pending])
            failed = []
            for k, data in zip(pending, got):
                if isinstance(data, Error):  # a verdict on the answer (remote_http): final
                    raise data
                if isinstance(data, BaseException):
                    if isinstance(data, PERMANENT) or attempt == RETRIES or not failed:
                        self._fail(ranges[k], data, attempt + 1, final=attempt == RETRIES)
                    failed.append(k)
                    continue
                start, end = ranges[k]
                if len(data) != end - start:
                    if len(data) == self.size:  # a 200 with the whole body: no ranges here
                        raise RemoteError(
                            f"{self.name}: the server ignores Range (it sent all {self.size} "
                            f"bytes for bytes {start}-{end - 1}); ranged reads need one that "
                            "honours it"
                        )
                    self._changed(start, end, len(data))
                out[k] = data
            if not failed:
                return out
            pending = failed
            time.sleep(BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    def _cat(self, ranges: list[tuple[int, int]]) -> list[Any]:
        with self._lock:
            self.requests += len(ranges)
            self.fetched += sum(end - start for start, end in ranges)
        return self._ranges(ranges)

    def _changed(self, start: int, end: int, got: int) -> None:
        raise FormatError(
            f"object changed since it was opened: {got} bytes where {end - start} were asked",
            start + got,
            self.name,
            code=CHANGED,
        )

    def _fail(
        self, rng: tuple[int, int], exc: BaseException, tries: int, final: bool = True
    ) -> None:
        """Raise for a range that could not be read: a FormatError if the object is no
        longer the one opened (a shorter one makes the server refuse the range), checked
        at the first failure of a round so that no retries are spent on it; else, unless
        ``final`` (or the error is permanent), return and let the range be retried."""
        if remote_ranges.refused(exc):
            etag = self.info.get("ETag") or self.info.get("etag")
            raise FormatError(
                f"object changed since it was opened: the store refuses reads of the "
                f"version opened (ETag {etag})",
                rng[0],
                self.name,
                code=CHANGED,
            ) from exc
        try:
            now: dict | None = info_now(self.fs, self.path)
        except FileNotFoundError:
            now = None
        except Exception:  # the server is still failing: say so below
            now = self.info
        if now is None or identity(now) != identity(self.info):
            size = "gone" if now is None else f"now {now['size']} bytes"
            raise FormatError(
                f"object changed since it was opened ({self.size} bytes, {size})",
                rng[0],
                self.name,
                code=CHANGED,
            ) from exc
        if isinstance(exc, PERMANENT):
            raise named(exc, self.name) from exc
        if not final:
            return
        raise RemoteError(
            f"{self.name}: bytes {rng[0]}-{rng[1] - 1} failed after {tries} tries: {why(exc)}"
        ) from exc

    # -------------------------------------------------------------- the cache

    def _put(self, first: int, data: bytes) -> None:
        """Cache the whole blocks of ``data``, which starts at block ``first``."""
        b = self.block_size
        with self._lock:
            for k in range(0, len(data), b):
                block = data[k : k + b]
                if len(block) < b and first * b + k + len(block) != self.size:
                    break  # a partial block mid-object: not cached
                old = self._blocks.pop(first + k // b, None)
                self._cached += len(block) - (len(old) if old is not None else 0)
                self._blocks[first + k // b] = block
            while self._cached > self.cache_bytes and self._blocks:
                self._cached -= len(self._blocks.popitem(last=False)[1])

    def _put_range(self, offset: int, data: bytes) -> None:
        """Cache the bytes of one exact read (a record bigger than SMALL_READ)."""
        with self._lock:
            key = (offset, len(data))
            old = self._blocks.pop(key, None)  # type: ignore[call-overload]
            self._cached += len(data) - (len(old) if old is not None else 0)
            self._blocks[key] = data  # type: ignore[index]
            while self._cached > self.cache_bytes and self._blocks:
                self._cached -= len(self._blocks.popitem(last=False)[1])

    def _get(self, k: Any) -> bytes | None:
        with self._lock:
            block = self._blocks.get(k)
            if block is not None:
                self._blocks.move_to_end(k)
            return block

    def _blocks_of(self, offset: int, n: int) -> range:
        return range(offset // self.block_size, (offset + n - 1) // self.block_size + 1)

    # -------------------------------------------------------------- the protocol

    def pread(self, offset: int, n: int) -> bytes:
        """Bytes [offset, offset + n) (fewer where the object ends), from the cache or
        else: a read at or just after one of the last few fetches (a scan; index and
        records interleave) fetches ahead, doubling up to MAX_READAHEAD; otherwise a small
        read (an index entry, a tiny record) fetches its block, whose neighbours are likely
        next, and a larger one is fetched exactly."""
        if self._pid != os.getpid():
            self._forked()
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        exact = self._get((offset, n))
        if exact is not None:
            return exact
        runs = self._runs
        for start, data, _ in runs:
            if start <= offset and offset + n <= start + len(data):
                return data[offset - start : offset - start + n]
        blocks = self._blocks_of(offset, n)
        cached = [self._get(k) for k in blocks]
        if all(block is not None for block in cached):
            joined = cached[0] if len(cached) == 1 else b"".join(cached)  # type: ignore[arg-type]
            skip = offset - blocks[0] * self.block_size
            return joined[skip : skip + n]
        near = [r for r in runs if r[0] <= offset <= r[0] + len(r[1]) + self.block_size]
        if near:
            ahead = min(2 * near[0][2], MAX_READAHEAD)
            start, end = offset, min(self.size, offset + max(n, ahead))
        elif n < SMALL_READ and len(blocks) == 1:
            ahead = self.block_size // 2  # doubled to one block if a scan goes on from here
            start = blocks[0] * self.block_size
            end = min(self.size, start + self.block_size)
        else:
            ahead = self.block_size // 2
            start, end = offset, offset + n
        data = self.fetch([(start, end)])[0]
        first = -(-start // self.block_size)
        if first * self.block_size - start < len(data):
            self._put(first, data[first * self.block_size - start :])
        if not near and end - start == n:  # a record fetched exactly: cached as it is
            self._put_range(offset, data)
        kept = [r for r in runs if not near or r is not near[0]]
        self._runs = [(start, data, ahead), *kept][:RUNS]
        return data[offset - start : offset - start + n]

    def pread_many(
        self, ranges: Sequence[tuple[int, int]], *, whole_blocks: bool = False
    ) -> list[bytes]:
        """Several ranges in one round of concurrent requests. What the cache lacks is
        fetched exactly (``whole_blocks``: as the blocks holding it, for ranges whose
        neighbours are read soon, such as index entries), ranges closer than MERGE_GAP
        coalesced into one request."""
        if self._pid != os.getpid():
            self._forked()
        spans = []
        for offset, n in ranges:
            n = max(0, min(n, self.size - offset))
            blocks = self._blocks_of(offset, n) if n else range(0)
            if n and any(self._get(k) is None for k in blocks):
                if whole_blocks:
                    start = blocks[0] * self.block_size
                    spans.append((start, min(self.size, (blocks[-1] + 1) * self.block_size)))
                else:
                    spans.append((offset, offset + n))
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start - merged[-1][1] <= MERGE_GAP and end - merged[-1][0] <= MAX_REQUEST:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        got = self.fetch([(s, e) for s, e in merged]) if merged else []
        pieces = list(zip([s for s, _ in merged], got))
        for start, data in pieces:
            first = -(-start // self.block_size)
            skip = first * self.block_size - start
            if skip < len(data):
                self._put(first, data[skip:])
        out = []
        for offset, n in ranges:
            n = max(0, min(n, self.size - offset))
            out.append(self._from(pieces, offset, n))
        return out

    def _from(self, pieces: list[tuple[int, bytes]], offset: int, n: int) -> bytes:
        """The bytes of one range, from this round's responses or else the cache."""
        for start, data in pieces:
            if start <= offset and offset + n <= start + len(data):
                return data[offset - start : offset - start + n]
        return self.pread(offset, n)

    def close(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._cached = 0
            self._runs = []
