"""Sharded datasets: many container files written by size limits, read as one indexed dataset.

``ShardWriter`` rolls to a new file at a record or byte limit and, when it closes, writes a
small JSON manifest (``manifest``) next to its shards. ``open_shards`` reads one file, a
glob, a directory, a list or manifests as a ``ShardedDataset`` with one global record index.

Several processes can write in parallel with distinct patterns (each gets its own manifest);
``merge_manifests`` combines them, or pass them all to ``open_shards``. No torch import here.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..dataset import indexing
from ..dataset.batch import Batch, Out
from ..dataset.indexing import Index
from ..dataset.reader import Dataset, open_dataset
from ..errors import CHANGED, MANIFEST, ClosedError, FormatError, UsageError
from ..physical import remote
from ..physical.zstd import DEFAULT_CACHE_BYTES, MAX_FRAME_SIZE
from .batching import sharded_batch
from .manifest import (  # noqa: F401  (re-exported: the manifest API is this module's too)
    DIRECTORY_MANIFEST,
    MANIFEST_FORMAT,
    MANIFEST_SUFFIX,
    MANIFEST_VERSION,
    MAX_COUNT,
    SHARD_SUFFIXES,
    PathLike,
    ShardInfo,
    Source,
    _check_unique,
    _expand,
    check_shard_files,
    commit_checksum,
    describe_shard,
    directory_members,
    footer_checksum,
    manifest_doc,
    merge_manifests,
    parse_manifest,
    read_manifest,
    write_manifest,
)
from .sources import resolve_shards
from .writer import (  # noqa: F401  (re-exported)
    ShardWriter,
    check_limits,
    shard_full,
    shared_dictionary,
)

# ---------------------------------------------------------------------------- reading


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every ShardedDataset, for _after_fork


def _after_fork() -> None:
    """In a forked child (a DataLoader worker) each dataset gets a new table lock (the
    copy may be held by a parent's thread the child lacks) and drops that thread's pins."""
    for sds in list(_LIVE):
        sds._lock = threading.Lock()
        sds._pins = {}


os.register_at_fork(after_in_child=_after_fork)


class ShardedDataset:
    """Many shard files as one map-style dataset with a global record index.

    Memory is O(shards): per shard a path, a record count and the footer checksum; a lookup
    is a binary search over cumulative counts. Shards open lazily on first use (at most
    ``max_open`` stay open, least recently used first out), and each is checked on opening:
    its record count and footer checksum must match what the index was built from, else
    FormatError (the shard was replaced or appended to). A shard described by opening it
    (``ShardInfo.by_path``: no manifest) may have grown since: its commit described must
    then be one of its commits (the same file), and the dataset reads that commit's records.
    Pickling sends only this table, so DataLoader workers start cheaply and open their own
    shards.
    """

    def __init__(
        self,
        shards: Sequence[ShardInfo],
        *,
        backend: str = "mmap",
        verify: bool = True,
        max_open: int = 256,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_record_bytes: int | None = None,
        as_dict: bool = False,
        filesystem: Any = None,
        storage_options: dict | None = None,
        cache_dir: PathLike | None = None,
    ):
        if max_open < 1:
            raise UsageError("max_open must be at least 1")
        self.shards = list(shards)
        self.backend = backend
        self.verify = verify
        self.max_open = max_open
        # What each shard is opened with (as for evalue_store.open).
        self.open_options = {
            "backend": backend,
            "verify": verify,
            "cache_bytes": cache_bytes,
            "max_frame_size": max_frame_size,
            "max_record_bytes": max_record_bytes,
            "as_dict": as_dict,
            "filesystem": filesystem,
            "storage_options": storage_options,
            "cache_dir": cache_dir,
        }
        counts = np.array([s.records for s in self.shards], dtype=np.int64)
        self.counts = counts
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.counts.setflags(write=False)
        self.offsets.setflags(write=False)
        self._ends = self.offsets[1:].tolist()  # bisect on a list is fastest for one index
        self._starts = self.offsets[:-1].tolist()
        self._len = int(self.offsets[-1])
        self._open: OrderedDict[int, Dataset] = OrderedDict()
        # Threads share the table (changed under the lock); shards with reads under way
        # (pins: shard -> their number) are never closed to make room.
        self._lock = threading.Lock()
        self._pins: dict[int, int] = {}
        self._closed = False
        _LIVE.add(self)

    # ------------------------------------------------------------------ shards

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.shards]

    def shard(self, k: int) -> Dataset:
        """The opened, checked Dataset of shard ``k``. Opening others may close it later
        (``max_open``): a thread reading it while others read other shards uses ``using``."""
        with self.using(k) as ds:
            return ds

    @contextmanager
    def using(self, k: int) -> Iterator[Dataset]:
        """Shard ``k`` (as ``shard``), which no read of another thread closes to keep within
        ``max_open`` until the block ends (``close()`` still closes it)."""
        ds = self._acquire(k)
        try:
            yield ds
        finally:
            self._release(k)

    def _acquire(self, k: int) -> Dataset:
        """Shard ``k``, open and pinned (one more read under way in it): ``_release`` after."""
        with self._lock:
            self._check_open()
            ds = self._open.get(k)
            if ds is not None:
                self._open.move_to_end(k)
                self._pins[k] = self._pins.get(k, 0) + 1
                return ds
        info = self.shards[k]
        ds = open_dataset(info.path, **self.open_options)  # (not under the lock: slow)
        try:
            self._check(ds, info)
        except BaseException:
            ds.close()
            raise
        with self._lock:
            if self._closed:  # closed meanwhile: this shard goes too
                ds.close()
                self._check_open()
            other = self._open.get(k)  # another thread opened it meanwhile: theirs is kept
            if other is None:
                self._open[k] = ds
            else:
                self._open.move_to_end(k)
                ds, other = other, ds
            self._pins[k] = self._pins.get(k, 0) + 1
            closing = self._evict()
        for spare in (other, *closing):
            if spare is not None:
                spare.close()  # views handed out stay valid
        return ds

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("open_shards dataset is closed")

    def _release(self, k: int) -> None:
        with self._lock:
            left = self._pins.pop(k) - 1
            if left:
                self._pins[k] = left
            closing = self._evict() if len(self._open) > self.max_open else ()
        for ds in closing:
            ds.close()

    def _evict(self) -> list[Dataset]:
        """Under the lock: the least recently used shards no read holds, taken out of the
        table until at most ``max_open`` are open (fewer taken if too many are held)."""
        excess = len(self._open) - self.max_open
        if excess <= 0:
            return []
        idle = (k for k in self._open if k not in self._pins)  # least recently used first
        return [self._open.pop(k) for k in list(itertools.islice(idle, excess))]

    @staticmethod
    def _check(ds: Dataset, info: ShardInfo) -> None:
        if info.by_path:
            ShardedDataset._check_grown(ds, info)
            return
        if len(ds) != info.records:
            raise FormatError(
                f"shard has {len(ds)} records, the index says {info.records}",
                None,
                ds.path,
                code=MANIFEST,
            )
        if footer_checksum(ds) != info.footer_sha256:
            raise FormatError(
                "footer checksum differs from the index's (the shard was rewritten or appended to)",
                ds.commit.footer_offset,
                ds.path,
                code=MANIFEST,
            )

    @staticmethod
    def _check_grown(ds: Dataset, info: ShardInfo) -> None:
        """A shard opened by path must still hold the commit it was described at: as its
        last commit, or followed by later ones (a live writer's). Its first ``info.records``
        records are then the ones described (committed records never change), and only
        those are read. Fewer records, or no such commit (another file: its id differs,
        and the footer names it), is a FormatError (``changed``)."""
        n = len(ds)
        if n == info.records and footer_checksum(ds) == info.footer_sha256:
            return
        if n < info.records:
            reason = f"holds {n} records, fewer than the {info.records} it had when opened"
            raise FormatError(reason, None, ds.path, code=CHANGED)
        snapshot = ds.commit_at(info.nbytes) if info.nbytes < ds.commit.end else None
        if snapshot is None or commit_checksum(snapshot, ds.header) != info.footer_sha256:
            reason = (
                f"replaced since it was opened: its commit of {info.records} records "
                "is not there (another file?)"
            )
            raise FormatError(reason, None, ds.path, code=CHANGED)

    def validate(self) -> None:
        """Open and check every shard now (FormatError on the first mismatch)."""
        for k in range(len(self.shards)):
            self.shard(k)

    @property
    def metadata(self) -> dict:
        """The first shard's metadata (ShardWriter gives every shard the same)."""
        if not self.shards:
            return {}
        with self.using(0) as ds:
            return ds.metadata

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The first shard's field names (ShardWriter gives every shard the same)."""
        if not self.shards:
            return None
        with self.using(0) as ds:
            return ds.fields

    # ------------------------------------------------------------------ records

    def __len__(self) -> int:
        return self._len

    def locate(self, i: int) -> tuple[int, int]:
        """(shard, record within the shard) of global record ``i``."""
        j = indexing.scalar(i, self._len)
        k = bisect.bisect_right(self._ends, j)
        return k, j - int(self.offsets[k])

    def __getitem__(self, index: Index) -> Any:
        """One record for an integer; a list of records for a slice, an integer array or a
        boolean mask (numpy's rules, as for ``Dataset``)."""
        where = indexing.normalize(index, self._len)
        if isinstance(where, int):
            k = bisect.bisect_right(self._ends, where)
            with self._lock:  # _acquire's common case, inline: ds[i] is the hot path
                ds = self._open.get(k)
                if ds is not None:
                    self._open.move_to_end(k)
                    self._pins[k] = self._pins.get(k, 0) + 1
            if ds is None:
                ds = self._acquire(k)
            try:
                return ds[where - self._starts[k]]
            finally:
                self._release(k)
        return self._get_positions(
            np.arange(where.start, where.stop, where.step) if isinstance(where, range) else where
        )

    def get_batch(self, indices: Sequence[int] | np.ndarray, *, out: Out = None) -> Batch:
        """Records ``indices`` as one batch, as ``Dataset.get_batch`` gives it."""
        return sharded_batch(self, indices, out)

    def get_many(self, indices: Sequence[int] | np.ndarray) -> list[list]:
        """Records for a list of global indices (or a boolean mask), in the order given;
        reads grouped by shard."""
        return self._get_positions(indexing.many(indices, self._len))

    def _get_positions(self, idx: np.ndarray) -> list[list]:
        shard_of = np.searchsorted(self.offsets, idx, side="right") - 1
        out: list[Any] = [None] * len(idx)
        order = np.argsort(shard_of, kind="stable")
        groups = np.flatnonzero(np.diff(shard_of[order])) + 1
        parts = np.split(order, groups) if len(order) else []
        keys = [int(shard_of[p[0]]) for p in parts]

        def read(k: int, positions: np.ndarray, ds: Dataset | None = None) -> list[list]:
            if ds is not None:
                return ds.get_many(idx[positions] - self.offsets[k])
            with self.using(k) as ds:
                return ds.get_many(idx[positions] - self.offsets[k])

        if 1 < len(parts) <= self.max_open and remote.is_url(self.shards[0].path):
            # Shards in object storage: their rounds of requests at the same time, each
            # shard open (held) until all are read.
            opened: list[Dataset] = []
            try:
                for k in keys:
                    opened.append(self._acquire(k))
                with ThreadPoolExecutor(min(len(parts), 16)) as pool:
                    batches = list(pool.map(read, keys, parts, opened))
            finally:
                for k in keys[: len(opened)]:
                    self._release(k)
        else:
            batches = (read(k, positions) for k, positions in zip(keys, parts))
        for positions, records in zip(parts, batches):
            for p, record in zip(positions.tolist(), records):
                out[p] = record
        return out

    def __iter__(self) -> Iterator[list]:
        for k in range(len(self.shards)):  # (a shard opened by path may hold more)
            with self.using(k) as ds:
                yield from itertools.islice(ds, int(self.counts[k]))

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close the dataset and its open shards: reads under way in them, and any later
        read, raise ClosedError; tensor views handed out stay valid."""
        with self._lock:
            self._closed = True
            opened, self._open = list(self._open.values()), OrderedDict()
        for ds in opened:
            ds.close()

    def __enter__(self) -> ShardedDataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # Compact, for thousands of shards: names relative to their common directory, raw
        # digests. No open files: the receiver opens shards itself.
        paths = self.paths
        base = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname("".join(paths))
        if paths and remote.is_url(paths[0]):
            base = ""  # URLs as they are (commonpath would fold their "//")
        return {
            "base": base,
            "shards": [
                (
                    os.path.relpath(s.path, base) if base else s.path,
                    s.records,
                    s.nbytes,
                    bytes.fromhex(s.footer_sha256),
                    s.by_path,
                )
                for s in self.shards
            ],
            "max_open": self.max_open,
            "open_options": self.open_options,
        }

    def __setstate__(self, state: dict) -> None:
        base = state["base"]
        shards = [
            ShardInfo(os.path.join(base, name), records, nbytes, digest.hex(), *by_path)
            for name, records, nbytes, digest, *by_path in state["shards"]
        ]
        self.__init__(shards, max_open=state["max_open"], **state["open_options"])

    def __repr__(self) -> str:
        return f"ShardedDataset({len(self.shards)} shards, {self._len} records)"


def open_shards(
    source: Source,
    *,
    backend: str = "mmap",
    verify: bool = True,
    validate: bool = False,
    max_open: int = 256,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    max_frame_size: int = MAX_FRAME_SIZE,
    max_record_bytes: int | None = None,
    as_dict: bool = False,
    filesystem: Any = None,
    storage_options: dict | None = None,
    cache_dir: PathLike | None = None,
) -> ShardedDataset:
    """Open shards as one dataset. ``source`` is a container file, a manifest (``*.json``),
    a glob (sorted), a directory (``manifest.directory_members``: its manifest.json, else
    its ``*.manifest.json``, else its ``*.evs`` and ``*.evs.zst`` files by name), or a list
    of any of these, concatenated in order.

    With manifests, opening reads only the manifests: shards open on first use and are
    checked then. Without, each shard is opened once to count its records. ``validate``
    checks every shard now instead. ``backend``, ``verify``, ``cache_bytes``,
    ``max_frame_size``, ``max_record_bytes`` and ``as_dict`` are as for ``evalue_store.open``,
    and so are ``filesystem``, ``storage_options`` and ``cache_dir`` for shards in object
    storage (URLs, a remote glob, directory or manifest).
    """
    ds = ShardedDataset(
        resolve_shards(source, filesystem, storage_options),
        backend=backend,
        verify=verify,
        max_open=max_open,
        cache_bytes=cache_bytes,
        max_frame_size=max_frame_size,
        max_record_bytes=max_record_bytes,
        as_dict=as_dict,
        filesystem=filesystem,
        storage_options=storage_options,
        cache_dir=cache_dir,
    )
    if validate:
        ds.validate()
    return ds
