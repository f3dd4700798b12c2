"""Sharded datasets: many container files written by size limits, read as one indexed dataset.

``ShardWriter`` rolls to a new file at a record or byte limit and, when it closes, writes a
small JSON manifest next to its shards. ``open_shards`` reads one file, a glob, a directory,
a list or manifests as a ``ShardedDataset`` with one global record index.

Manifest (``format`` "evalue_store.shards", ``version`` 1)::

    {"format": "evalue_store.shards", "version": 1, "records": 250,
     "shards": [{"path": "train-00000.evs", "records": 100, "bytes": 123456,
                 "footer_sha256": "9f86d0..."}, ...]}

Shard paths are relative to the manifest's directory; ``read_manifest`` checks every field
(counts and their total are int64) and ``open_shards`` that every shard is a regular file.
``footer_sha256`` is the SHA-256 (hex) of the shard's last footer (bytes
``[commit.footer_offset, commit.end)``): it names the exact commit the manifest describes,
so a shard replaced or appended to since is caught without reading its records. (Not a
CRC-32: a footer ends with its own CRC, and the CRC-32 of data followed by its CRC is the
same constant for every footer.)

Several processes can write in parallel with distinct patterns (each gets its own manifest);
``merge_manifests`` combines them, or pass them all to ``open_shards``. No torch import here.
"""

from __future__ import annotations

import bisect
import glob
import hashlib
import json
import os
import re
import stat
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from . import batch, indexing, remote, remote_shards
from .batch import Batch, Out
from .bounded import open_regular
from .container import ENTRY_SIZE, encode_footer
from .errors import LIMIT, MANIFEST, ClosedError, FormatError
from .fields import FIELDS_KEY, Fields
from .files import fsync_dir, new_file_mode
from .indexing import Index
from .reader import Dataset, open_dataset
from .writer import Writer
from .zstd import DEFAULT_CACHE_BYTES, MAX_FRAME_SIZE

MANIFEST_FORMAT = "evalue_store.shards"
MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"
DIRECTORY_MANIFEST = "manifest.json"  # what open_shards(directory) prefers, and merge writes

PathLike = Union[str, os.PathLike]
Source = Union[PathLike, Sequence[PathLike]]


@dataclass(frozen=True)
class ShardInfo:
    """One shard as a manifest lists it; ``path`` is absolute once loaded."""

    path: str
    records: int
    nbytes: int
    footer_sha256: str


def footer_checksum(dataset: Dataset) -> str:
    """SHA-256 (hex) of the footer of the commit ``dataset`` sees: names that exact commit.

    The footer is re-encoded from the parsed commit (encoding is deterministic, and the
    parse checked its checksum, by the shard's own function), which also covers compressed
    files, whose footer bytes are logical rather than at a file offset.
    """
    commit, header = dataset.commit, dataset.header
    footer = encode_footer(commit.footer_offset, header.file_id, commit, header.checksum)
    return hashlib.sha256(footer).hexdigest()


def describe_shard(path: PathLike) -> ShardInfo:
    """Open a shard briefly and describe its last commit (what a manifest records)."""
    with open_dataset(path, verify=False) as ds:
        return ShardInfo(os.path.abspath(ds.path), len(ds), ds.commit.end, footer_checksum(ds))


# ---------------------------------------------------------------------------- manifests


def _atomic_write_json(path: str, value: Any, durable: bool = True, replace: bool = True) -> None:
    """Write JSON so readers see the old file or the new one, never a torn one; without
    ``replace``, an existing ``path`` is never replaced (FileExistsError)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, new_file_mode())  # as readable as the shards, not mkstemp's 0o600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1)
            f.write("\n")
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path exists
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path)


def write_manifest(
    path: PathLike, shards: Sequence[ShardInfo], durable: bool = True, replace: bool = True
) -> str:
    """Write a manifest listing ``shards`` (paths stored relative to the manifest); without
    ``replace`` an existing manifest is never replaced (FileExistsError)."""
    path = os.path.abspath(os.fspath(path))
    base = os.path.dirname(path)
    doc = manifest_doc(shards, lambda p: os.path.relpath(p, base))
    _atomic_write_json(path, doc, durable, replace)
    return path


def manifest_doc(shards: Sequence[ShardInfo], name: Any) -> dict:
    """A manifest's JSON; ``name(path)`` is how a shard's path is written."""
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "records": sum(s.records for s in shards),
        "shards": [
            {
                "path": name(s.path),
                "records": s.records,
                "bytes": s.nbytes,
                "footer_sha256": s.footer_sha256,
            }
            for s in shards
        ],
    }


def read_manifest(path: PathLike) -> list[ShardInfo]:
    """Parse a manifest; shard paths come back absolute. Raises FormatError if malformed,
    naming the manifest and the field: every count must be an int64, as must their total."""
    path = os.path.abspath(os.fspath(path))
    fd = open_regular(path)  # a FIFO would block: FormatError instead
    try:
        with os.fdopen(fd, encoding="utf-8") as f:
            doc = json.load(f)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # RecursionError: nesting deeper than json can parse
        raise FormatError(f"manifest is not JSON: {exc}", None, path, code=MANIFEST) from None
    base = os.path.dirname(path)
    return parse_manifest(doc, path, lambda name: os.path.normpath(os.path.join(base, name)))


def parse_manifest(doc: Any, path: str, join: Any) -> list[ShardInfo]:
    """The shards of a manifest's parsed JSON; ``join(name)`` places a listed name."""
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"not an {MANIFEST_FORMAT} manifest", None, path, code=MANIFEST)
    if doc.get("version") != MANIFEST_VERSION:
        raise FormatError(
            f"unsupported manifest version {doc.get('version')!r}", None, path, code=MANIFEST
        )
    items = doc.get("shards")
    if not isinstance(items, list):
        raise FormatError("'shards' is not a list", None, path, code=MANIFEST)
    shards = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise FormatError(f"shards[{k}] is not an object", None, path, code=MANIFEST)
        name = item.get("path")
        if not isinstance(name, str) or not name or "\0" in name:
            raise FormatError(
                f"shards[{k}].path is not a file name: {name!r:.80}", None, path, code=MANIFEST
            )
        records, nbytes = (_count(item.get(key), f"shards[{k}].{key}", path) for key in _COUNTS)
        digest = item.get("footer_sha256")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise FormatError(
                f"shards[{k}].footer_sha256 is not a SHA-256 in hex", None, path, code=MANIFEST
            )
        shards.append(ShardInfo(join(name), records, nbytes, digest))
    total = _count(doc.get("records"), "records", path)
    if total != sum(s.records for s in shards):
        raise FormatError(
            "records: the record total disagrees with the shard list", None, path, code=MANIFEST
        )
    return shards


_COUNTS = ("records", "bytes")
_SHA256 = re.compile("[0-9a-f]{64}")
MAX_COUNT = (1 << 63) - 1  # counts are int64 in a ShardedDataset's index


def _count(value: Any, field: str, path: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise FormatError(
            f"{field} is not an integer in [0, 2^63): {value!r:.40}", None, path, code=MANIFEST
        )
    return value


def check_shard_files(shards: Sequence[ShardInfo], manifest: str) -> None:
    """Each shard a manifest lists must be a regular file now (one stat each), so that a
    missing shard fails at open, not at its first read."""
    for k, info in enumerate(shards):
        try:
            mode = os.stat(info.path).st_mode
        except OSError as exc:
            reason = f"shards[{k}].path {info.path}: {exc.strerror}"
            raise FormatError(reason, None, manifest, code=MANIFEST) from None
        if not stat.S_ISREG(mode):
            raise FormatError(
                f"shards[{k}].path {info.path} is not a regular file", None, manifest, code=MANIFEST
            )


def merge_manifests(inputs: Source, out: PathLike) -> str:
    """Combine manifests (paths, a glob or a list) into one at ``out``, in the order given.

    This is how shards from parallel ShardWriters become one dataset: each writer uses its
    own pattern and manifest, and one process merges them when all are done. A shard listed
    twice is an error. The shards are not opened; ``open_shards(out, validate=True)`` checks
    them. Returns the absolute path written.
    """
    manifests = _expand(inputs)
    if not manifests:
        raise FileNotFoundError(f"no manifests match {inputs!r}")
    shards = [s for m in manifests for s in read_manifest(m)]
    _check_unique(shards)
    return write_manifest(out, shards)


def _check_unique(shards: Sequence[ShardInfo]) -> None:
    seen: set[str] = set()
    for s in shards:
        key = os.path.realpath(s.path)
        if key in seen:
            raise ValueError(f"shard {s.path} is listed more than once")
        seen.add(key)


# ---------------------------------------------------------------------------- writing


def _default_manifest(pattern: str) -> str:
    """``data/train-{:05d}.evs`` -> ``data/train.manifest.json``; no prefix -> manifest.json.
    What follows the placeholder, but the shard suffix, is kept, so that distinct patterns
    get distinct manifests: ``train-{:05d}-part1.evs`` -> ``train-part1.manifest.json``."""
    directory, name = os.path.split(pattern)
    before, after = name.split("{", 1)[0], name.rsplit("}", 1)[-1]
    for suffix in (*SHARD_SUFFIXES, os.path.splitext(after)[1]):
        if after.endswith(suffix):
            after = after[: len(after) - len(suffix)]
            break
    stem = before.rstrip("-_.") + after if after else before.rstrip("-_.")
    return os.path.join(directory, stem + MANIFEST_SUFFIX if stem else DIRECTORY_MANIFEST)


def shard_full(writer: Writer, max_records: int | None, max_bytes: int | None) -> bool:
    """Whether a shard being written has reached a limit, so the next record starts a new one."""
    n = len(writer)
    if max_records is not None and n >= max_records:
        return True
    # tell() is the logical end, buffer included; each record adds an index entry at commit.
    size = writer.tell() + ENTRY_SIZE * n
    return max_bytes is not None and size >= max_bytes


class ShardWriter:
    """Writes records across shard files named ``pattern.format(n)`` for n = 0, 1, ...

    A new shard starts before a record once the current one holds ``max_records`` records
    or ``max_bytes`` bytes (data plus index; the footer adds ~100 bytes). The byte limit is
    soft, as in WebDataset: a shard ends after the record that reaches the limit, so it
    exceeds ``max_bytes`` by less than one record. Each shard gets ``metadata`` and, for dict
    records, the same field names (``fields``, fixed by the first one, as for ``Writer``).

    ``close()`` (or leaving the ``with`` block normally) commits the last shard and writes the
    manifest atomically (default: the pattern's prefix + ".manifest.json"). Leaving the block
    by an exception keeps the finished shards, discards the records of the shard in progress
    (as ``with Writer`` does) and writes no manifest, so a half-done job does not look done.

    Shards are created with mode "x" unless ``overwrite``: rerunning a job into the same
    place must not mix old and new shards silently. ``resume`` continues an earlier run
    that died instead: its shards are kept, the last one is reopened for appending (a
    crashed writer's tail salvaged first, as with ``Writer(path, "a")``, and reported in
    ``salvage``), and ``len()`` says how many records are already stored, i.e. where the
    input should resume. Other keywords (``alignment``, ``compression``...) go to each
    ``Writer``; ``max_bytes`` counts uncompressed bytes.

    For parallel writers give each process its own pattern, e.g.
    ``f"data/train-{rank:02d}-{{:05d}}.evs"``, then ``merge_manifests``.
    """

    def __init__(
        self,
        pattern: PathLike,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        metadata: dict | None = None,
        manifest: PathLike | None = None,
        durable: bool = True,
        overwrite: bool = False,
        resume: bool = False,
        filesystem: Any = None,
        storage_options: dict | None = None,
        **writer_options: Any,
    ):
        self.pattern = os.fspath(pattern)
        self._staging: remote_shards.Staging | None = None
        try:
            one_placeholder = self.pattern.format(0) != self.pattern.format(1)
        except (IndexError, KeyError, ValueError) as exc:
            raise ValueError(
                f"pattern {self.pattern!r} must have one placeholder such as {{:05d}} ({exc})"
            ) from None
        if filesystem is None and not remote.is_url(self.pattern):
            self.pattern = os.path.abspath(self.pattern)  # a later chdir changes nothing
        if not one_placeholder:
            raise ValueError(f"pattern {self.pattern!r} needs a placeholder such as {{:05d}}")
        for name, limit in (("max_records", max_records), ("max_bytes", max_bytes)):
            if limit is not None and limit < 1:
                raise ValueError(f"{name} must be positive, not {limit}")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.metadata = metadata
        self.manifest_path = os.path.abspath(
            os.fspath(manifest) if manifest is not None else _default_manifest(self.pattern)
        )
        if filesystem is not None or remote.is_url(self.pattern):
            if resume:
                raise ValueError("resume needs a local pattern (an object has no append)")
            self._staging = remote_shards.Staging(
                self.pattern,
                None if manifest is None else os.fspath(manifest),
                _default_manifest(self.pattern),
                filesystem,
                storage_options,
                overwrite,
            )
            self.pattern = self._staging.local_pattern
            self.manifest_path = self._staging.manifest_url
        self.writer_options = writer_options
        self.durable = durable
        self.mode = "w" if overwrite else "x"
        if self.mode == "x" and not resume and os.path.exists(self.manifest_path):
            raise FileExistsError(
                f"{self.manifest_path}: a finished job's manifest is there; rerunning into the "
                "same place needs overwrite=True (or another pattern or manifest)"
            )
        self.shards: list[ShardInfo] = []
        self._writer: Writer | None = None
        self._fields = Fields()  # the same field names in every shard
        self._count = 0
        self._closed = False
        self.salvage = None  # with resume: what reopening the last shard salvaged, if anything
        self._resumed = resume
        if resume:
            if overwrite:
                raise ValueError("resume and overwrite exclude each other")
            self._resume()

    def _resume(self) -> None:
        """Take over shards 0, 1, ... of an earlier run: all but the last as they are, the
        last reopened for appending."""
        paths: list[str] = []
        while os.path.exists(self.pattern.format(len(paths))):
            paths.append(self.pattern.format(len(paths)))
        if not paths:
            return
        self.shards = [describe_shard(path) for path in paths[:-1]]
        # metadata again: the last shard may have died before its first commit stored it
        self._writer = Writer(
            paths[-1], "a", metadata=self.metadata, durable=self.durable, **self.writer_options
        )
        self.salvage = self._writer.salvage
        self._count = sum(s.records for s in self.shards) + len(self._writer)
        self._fields = Fields(self._writer.fields, self._writer.fields is None and self._count > 0)

    def _full(self, writer: Writer) -> bool:
        return shard_full(writer, self.max_records, self.max_bytes)

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The names of the record fields, fixed by the first dict record (as for Writer)."""
        return self._fields.names

    def append(self, record: Sequence[Any] | Mapping[str, Any]) -> int:
        """Append one record (a list, or a dict naming its values as for ``Writer``);
        returns its global index across all shards."""
        if self._closed:
            raise ClosedError("ShardWriter is closed")
        _, fixed = self._fields.values(record)  # the same names across shards
        if self._writer is not None and self._full(self._writer):
            self._finish_shard()
        if self._writer is None:
            path = self.pattern.format(len(self.shards))
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            metadata = self.metadata
            if self._fields.names is not None:  # so that a shard of list records names them
                metadata = {**(metadata or {}), FIELDS_KEY: list(self._fields.names)}
            self._writer = Writer(
                path,
                self.mode,
                metadata=metadata,
                durable=self.durable,
                **self.writer_options,
            )
        self._writer.append(record)
        self._fields.accept(fixed)
        self._count += 1
        return self._count - 1

    def extend(self, records: Iterable[Sequence[Any]]) -> None:
        for record in records:
            self.append(record)

    def _finish_shard(self) -> None:
        assert self._writer is not None
        self._writer.close()
        info = describe_shard(self._writer.path)
        if self._staging is not None:
            url = self._staging.upload_shard(len(self.shards), info.path)
            info = ShardInfo(url, info.records, info.nbytes, info.footer_sha256)
        self.shards.append(info)
        self._writer = None

    def __len__(self) -> int:
        return self._count

    def close(self) -> str:
        """Commit the last shard and write the manifest; returns the manifest's path."""
        self._finish(manifest=True)
        return self.manifest_path

    def _finish(self, manifest: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._writer is not None and not manifest:
                self._writer.abort()  # as ``with Writer`` does when an exception leaves it
            elif self._writer is not None:
                self._finish_shard()
            if manifest and self._staging is not None:
                self._staging.upload_manifest(manifest_doc(self.shards, lambda p: p))
            elif manifest:
                replace = self.mode == "w" or self._resumed
                write_manifest(self.manifest_path, self.shards, self.durable, replace)
                if self.mode == "w":  # an earlier run's later shards must not be read with ours
                    k = len(self.shards)
                    while os.path.lexists(self.pattern.format(k)):
                        os.unlink(self.pattern.format(k))
                        k += 1
        finally:
            if self._staging is not None:
                self._staging.cleanup()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._finish(manifest=exc_type is None)


# ---------------------------------------------------------------------------- reading


def _is_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def _expand(source: Source) -> list[str]:
    """Paths named by a path, a glob, or a list of either (globs sorted)."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    out: list[str] = []
    for item in items:
        text = os.fspath(item)
        if not os.path.exists(text) and _is_glob(text):
            matches = sorted(glob.glob(text))
            if not matches:
                raise FileNotFoundError(f"no files match {text!r}")
            out.extend(matches)
        else:
            out.append(text)
    return out


SHARD_SUFFIXES = (".evs", ".evs.zst")  # what a directory without a manifest holds


def _directory_members(directory: str) -> list[str]:
    """A directory's manifest.json if present, else its *.evs and *.evs.zst files in name
    order (plain and compressed shards mixed)."""
    manifest = os.path.join(directory, DIRECTORY_MANIFEST)
    if os.path.isfile(manifest):
        return [manifest]
    pattern = os.path.join(glob.escape(directory), "*")
    files = sorted(path for path in glob.glob(pattern) if path.endswith(SHARD_SUFFIXES))
    if not files:
        raise FileNotFoundError(
            f"{directory}: no {DIRECTORY_MANIFEST} and no *.evs or *.evs.zst files"
        )
    return files


def resolve_shards(
    source: Source, filesystem: Any = None, storage_options: dict | None = None
) -> list[ShardInfo]:
    """The shards a source names, in order. See ``open_shards`` for the accepted forms."""
    first = source if isinstance(source, (str, os.PathLike)) else next(iter(source), "")
    if filesystem is not None or remote.is_url(first):
        return _resolve_remote(source, filesystem, storage_options)
    shards: list[ShardInfo] = []
    for path in _expand(source):
        members = _directory_members(path) if os.path.isdir(path) else [path]
        for member in members:
            if member.endswith(".json"):
                listed = read_manifest(member)
                check_shard_files(listed, os.path.abspath(member))
                shards.extend(listed)
            else:
                shards.append(describe_shard(member))
    _check_unique(shards)
    if sum(s.records for s in shards) > MAX_COUNT:
        raise FormatError(
            f"the shards of {source!r:.200} hold more than 2^63-1 records in all", code=LIMIT
        )
    return shards


def _resolve_remote(source: Source, filesystem: Any, options: dict | None) -> list[ShardInfo]:
    shards: list[ShardInfo] = []
    for fs, inner, url in remote_shards.expand_remote(source, filesystem, options, SHARD_SUFFIXES):
        if inner.endswith(".json"):
            listed = remote_shards.read_remote_manifest(fs, inner, url, parse_manifest)
            remote_shards.check_listed(fs, listed, url)
            shards.extend(listed)
        else:
            with open_dataset(inner, verify=False, filesystem=fs) as ds:
                shards.append(ShardInfo(url, len(ds), ds.commit.end, footer_checksum(ds)))
    _check_unique(shards)
    return shards


class ShardedDataset:
    """Many shard files as one map-style dataset with a global record index.

    Memory is O(shards): per shard a path, a record count and the footer checksum; a lookup
    is a binary search over cumulative counts. Shards open lazily on first use (at most
    ``max_open`` stay open, least recently used first out), and each is checked on opening:
    its record count and footer checksum must match what the index was built from, else
    FormatError (the shard was replaced or appended to). Pickling sends only this table, so
    DataLoader workers start cheaply and open their own shards.
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
            raise ValueError("max_open must be at least 1")
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
        self._len = int(self.offsets[-1])
        self._open: OrderedDict[int, Dataset] = OrderedDict()

    # ------------------------------------------------------------------ shards

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.shards]

    def shard(self, k: int) -> Dataset:
        """The opened, checked Dataset of shard ``k``."""
        ds = self._open.get(k)
        if ds is not None:
            self._open.move_to_end(k)
            return ds
        info = self.shards[k]
        ds = open_dataset(info.path, **self.open_options)
        try:
            self._check(ds, info)
        except BaseException:
            ds.close()
            raise
        self._open[k] = ds
        if len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()  # views handed out stay valid
        return ds

    @staticmethod
    def _check(ds: Dataset, info: ShardInfo) -> None:
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

    def validate(self) -> None:
        """Open and check every shard now (FormatError on the first mismatch)."""
        for k in range(len(self.shards)):
            self.shard(k)

    @property
    def metadata(self) -> dict:
        """The first shard's metadata (ShardWriter gives every shard the same)."""
        return self.shard(0).metadata if self.shards else {}

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The first shard's field names (ShardWriter gives every shard the same)."""
        return self.shard(0).fields if self.shards else None

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
            k, j = self.locate(where)
            return self.shard(k)[j]
        return self._get_positions(
            np.arange(where.start, where.stop, where.step) if isinstance(where, range) else where
        )

    def get_batch(self, indices: Sequence[int] | np.ndarray, *, out: Out = None) -> Batch:
        """Records ``indices`` as one batch, as ``Dataset.get_batch`` gives it."""
        return batch.sharded_batch(self, indices, out)

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
            return (ds or self.shard(k)).get_many(idx[positions] - self.offsets[k])

        if 1 < len(parts) <= self.max_open and remote.is_url(self.shards[0].path):
            # Shards in object storage: their rounds of requests at the same time. Opening
            # is not thread-safe (the open-shard table), reading distinct shards is.
            opened = [self.shard(k) for k in keys]
            with ThreadPoolExecutor(min(len(parts), 16)) as pool:
                batches = list(pool.map(read, keys, parts, opened))
        else:
            batches = (read(k, positions) for k, positions in zip(keys, parts))
        for positions, records in zip(parts, batches):
            for p, record in zip(positions.tolist(), records):
                out[p] = record
        return out

    def __iter__(self) -> Iterator[list]:
        for k in range(len(self.shards)):
            yield from self.shard(k)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close open shards; tensor views handed out stay valid."""
        while self._open:
            self._open.popitem()[1].close()

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
                )
                for s in self.shards
            ],
            "max_open": self.max_open,
            "open_options": self.open_options,
        }

    def __setstate__(self, state: dict) -> None:
        base = state["base"]
        shards = [
            ShardInfo(os.path.join(base, name), records, nbytes, digest.hex())
            for name, records, nbytes, digest in state["shards"]
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
    a glob (sorted), a directory (its manifest.json, else its ``*.evs`` and ``*.evs.zst``
    files by name), or a list of any of these, concatenated in order.

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
