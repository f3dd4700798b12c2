"""Reader: random access to committed records, tensors as zero-copy views.

This module opens a container at its last commit (local, remote or a cached copy of a
remote one) and owns the dataset's lifecycle: refresh, close, pickling into workers. The
reads themselves (index, records, batches, the scan) are ``records.Records``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from typing import Any

from .. import _native
from ..checksums import NAMES
from ..container import FRAME_SIZE, Commit, Header, parse_footer_at
from ..errors import CHANGED, CHECKSUM, FIELDS, ClosedError, FormatError, UsageError
from ..metadata import parse_metadata
from ..physical import open_file, reopen_name
from ..physical.zstd import DEFAULT_CACHE_BYTES, MAX_FRAME_SIZE
from .closing import reports_close
from .fields import stored_names, to_dict
from .records import Records
from .verify import VerifyReport, verify_dataset


class Dataset(Records):
    """Read-only view of a container's last commit. Build it with ``evalue_store.open``.

    Pickling sends only the path and options; the copy reopens lazily on first use, which is
    what DataLoader workers need. ``refresh()`` picks up commits made since opening.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        backend: str = "mmap",
        verify: bool = True,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_record_bytes: int | None = None,
        as_dict: bool = False,
        filesystem: Any = None,
        storage_options: dict | None = None,
        cache_dir: str | os.PathLike | None = None,
    ):
        if backend not in ("mmap", "pread"):
            raise UsageError(f"backend must be 'mmap' or 'pread', not {backend!r}")
        self.path = os.fspath(path)
        self.backend = backend
        self.verify_reads = verify
        self.cache_bytes = cache_bytes
        self.max_frame_size = max_frame_size
        self.max_record_bytes = max_record_bytes
        self.as_dict = as_dict
        self.filesystem = filesystem
        self._file = reopen_name(self.path, filesystem)  # refresh() ignores a chdir
        self.storage_options = storage_options
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self._source: Any = None
        self._closed_by_pickle = False  # a copy opens on first use...
        self._pinned: tuple[bytes, int] | None = None  # ...and must find this there
        self._load()
        if as_dict:
            try:
                self._dict_names()  # an unnamed file is an error now, not at the first read
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ opening

    def _load(self) -> None:
        """Open the file at its last commit (again, for ``refresh``)."""
        opened = open_file(
            self._file,
            backend=self.backend,
            cache_bytes=self.cache_bytes,
            max_frame_size=self.max_frame_size,
            filesystem=self.filesystem,
            storage_options=self.storage_options,
            cache_dir=self.cache_dir,
        )
        self._identity = opened.identity
        self._install(opened.source, opened.header, opened.commit, opened.tail)

    @property
    def compressed(self) -> bool:
        """True when the file is stored as zstd frames (docs/FRAMES.md)."""
        self._ensure_open()
        return self._source.compressed

    def _install(self, source: Any, header: Header, commit: Commit, tail: int) -> None:
        self._close_source()
        self._source = source
        # A dataset dropped without close() closes its source when it is collected: a
        # compressed file's source holds a descriptor (a loop opening one per epoch and
        # dropping it ran out of them).
        self._closer = weakref.finalize(self, source.close)
        self.header = header
        self.commit = commit
        self._checksum = header.checksum  # bound once: the per-record and batch paths call it
        self.uncommitted_bytes = tail
        # A compressed record was checked by its frame's content checksum when the frame
        # was decompressed; checking its CRC on every read would check the same bytes again.
        self._crc_on_read = self.verify_reads and not source.checks_content
        # Offsets in a record's errors count bytes of the container: of the file itself only
        # when it is plain.
        self._offsets_in = "container" if source.compressed else "file"
        self._starts = []
        total = 0
        for seg in commit.segments:
            self._starts.append(total)
            total += seg.count
        self._segments = commit.segments
        self._len = commit.record_count
        self._metadata: dict | None = None
        self._layouts: dict[int, Any] = {}  # payload length -> Layout (or None: not compiled)
        self._lengths_seen: set[int] = set()
        self._names: tuple[str, ...] | None = None  # field names, once as_dict needed them
        # What ``ds[i]`` reads a plain mapped file with, bound once (records.Records): the
        # mapping, its arrays by dtype, where the index starts (-1: in several segments),
        # the entry checks, the checksum and the layouts. None for any other source.
        self._mapped = None
        # A compressed source's one-frame lookup for ``ds[i]`` (None: it has none).
        self._located = getattr(source, "record_frame", None)
        if source.mapped is not None and not source.compressed:
            self._mapped = (
                source.mapped,
                getattr(source, "typed", None),
                commit.segments[0].offset if len(commit.segments) == 1 else -1,
                header.alignment - 1,
                header.data_start,
                commit.end - FRAME_SIZE,  # a frame at offset o has at most this - o bytes
                self._crc_on_read,
                self._checksum,
                self._layouts,
                self._len,
            )
        self._bind_fast()

    def _bind_fast(self) -> None:
        """The compiled record readers (``_native.Mapped``), knowing every layout learned so
        far (``Records._teach`` teaches them the later ones): ``_fast``, ``ds[i]`` of a
        plain mapped file; ``_fast_frames``, a record in a compressed file's decompressed
        frame (its ``ds[i]``). None for the sources they do not read."""
        self._fast = self._fast_frames = self._fast_get = None
        source = self._source
        checksum = NAMES.get(self._checksum) if self._crc_on_read else None
        if self._crc_on_read and checksum is None:
            return  # not a function _native computes (a test's wrapper): Python calls it
        checks = (
            self.header.alignment,
            self.header.data_start,
            self.commit.end - FRAME_SIZE,
            self._max_record_bytes,
            checksum,
        )
        if source.mapped is not None and getattr(source, "typed", None) is not None:
            starts, offsets = list(self._starts), [seg.offset for seg in self._segments]
            self._fast = _native.Mapped(source.mapped, starts, offsets, self._len, *checks)
        elif self._located is not None:
            self._fast_frames = _native.Mapped(source._native, [], [], self._len, *checks)
        fast = self._fast if self._fast is not None else self._fast_frames
        self._fast_get = None if fast is None else fast.get
        for length, layout in self._layouts.items():
            self._teach(length, layout)

    @property
    def max_record_bytes(self) -> int | None:
        """Reading a record of more payload bytes raises FormatError (None: no limit)."""
        return self._max_record_bytes

    @max_record_bytes.setter
    def max_record_bytes(self, value: int | None) -> None:
        self._max_record_bytes = value
        if getattr(self, "_source", None) is not None:
            self._bind_fast()  # they hold a copy of the limit

    def _close_source(self) -> None:
        # The source is forgotten first: a read another thread has under way that fails
        # on what follows finds it gone, and says the dataset was closed (closing.py).
        source, self._source = self._source, None
        self._mapped = None
        self._located = None
        # Before the source: their layouts hold arrays viewing the mapping.
        self._fast = self._fast_frames = self._fast_get = None
        if source is not None:
            self._closer()  # source.close(), once

    def refresh(self) -> bool:
        """Pick up commits made since opening; returns True if the dataset changed."""
        self._ensure_open()
        old = (self._identity, self.header.file_id, self.commit.number, self.commit.end)
        self._load()  # a file replaced by another (rename) may have the same size
        return (self._identity, self.header.file_id, self.commit.number, self.commit.end) != old

    def commit_at(self, end: int) -> Commit | None:
        """The commit of this file whose footer ends at ``end`` (an earlier one: files are
        append-only), or None if no valid footer of this file ends there."""
        self._ensure_open()
        if not self.header.data_start < end <= self.commit.end:
            return None
        return parse_footer_at(self._source.read, end, self.header)

    def close(self) -> None:
        """Release the file. Tensor views handed out earlier stay valid."""
        self._close_source()

    def _ensure_open(self) -> None:
        if self._source is None:
            if self._closed_by_pickle:
                self._closed_by_pickle = False
                self._load()
                self._check_pinned()
            else:
                raise ClosedError(f"{self.path}: dataset is closed")

    def _check_pinned(self) -> None:
        """A copy (a DataLoader worker's) reads the file its original read, or fails: the
        same file, by its id, with at least the original's records (appends are fine: the
        records before them are the same). A file or object replaced meanwhile is an
        error every time, never its records."""
        if self._pinned is None:
            return
        file_id, count = self._pinned
        if self.header.file_id == file_id and self.commit.record_count >= count:
            self._pinned = None
            return
        self._close_source()
        self._closed_by_pickle = True
        self._len = None
        reason = (
            "replaced since the dataset was pickled: another file is there now"
            if self.header.file_id != file_id
            else f"holds {self.commit.record_count} records, fewer than the {count} it had"
        )
        raise FormatError(reason, None, self.path, code=CHANGED)

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {
            "path": self._file,  # the file this one reads, wherever the copy runs from
            "backend": self.backend,
            "verify": self.verify_reads,
            "cache_bytes": self.cache_bytes,
            "max_frame_size": self.max_frame_size,
            "max_record_bytes": self.max_record_bytes,
            "as_dict": self.as_dict,
            "filesystem": self.filesystem,
            "storage_options": self.storage_options,
            "cache_dir": self.cache_dir,
            # what the copy must find there: this file (its id), with at least these records
            "pinned": self._pinned
            if self._source is None and self._closed_by_pickle
            else (self.header.file_id, self.commit.record_count),
        }

    def __setstate__(self, state: dict) -> None:
        # Reopen lazily: a DataLoader pickles the dataset into every worker before use.
        self.path = self._file = state["path"]
        self.backend = state["backend"]
        self.verify_reads = state["verify"]
        self.cache_bytes = state["cache_bytes"]
        self.max_frame_size = state["max_frame_size"]
        self.max_record_bytes = state["max_record_bytes"]
        self.as_dict = state.get("as_dict", False)
        self.filesystem = state.get("filesystem")
        self.storage_options = state.get("storage_options")
        self.cache_dir = state.get("cache_dir")
        self._source = self._mapped = self._located = None
        self._fast = self._fast_frames = self._fast_get = None
        self._closed_by_pickle = True
        self._pinned = state.get("pinned")
        self._len = None

    # ------------------------------------------------------------------ properties

    @property
    @reports_close
    def metadata(self) -> dict:
        """The user metadata (a dict; empty if the writer gave none)."""
        self._ensure_open()
        if self._metadata is None:
            c = self.commit
            if not c.metadata_length:
                self._metadata = {}
            else:
                raw = bytes(self._source.read(c.metadata_offset, c.metadata_length))
                if self._checksum(raw) != c.metadata_crc:
                    raise FormatError(
                        "metadata checksum mismatch", c.metadata_offset, self.path, code=CHECKSUM
                    )
                try:
                    self._metadata = parse_metadata(raw, c.metadata_offset)
                except FormatError as exc:
                    raise exc.at(path=self.path) from None
        return self._metadata

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The names of the record fields (``evalue_store.fields``), None if unnamed."""
        return stored_names(self.metadata)

    def _dict_names(self) -> tuple[str, ...]:
        if self._names is None:
            names = self.fields
            if names is None:
                reason = "as_dict needs field names; its records have none"
                raise FormatError(reason, None, self.path, code=FIELDS)
            self._names = names
        return self._names

    def _named(self, records: list[list]) -> list:
        names = self._dict_names()
        return [to_dict(r, names) for r in records]

    @property
    def logical_size(self) -> int:
        """Bytes of the container up to its last commit (of the decompressed stream, if
        the file is compressed)."""
        self._ensure_open()
        return self.commit.end

    @reports_close
    def logical_chunks(self) -> Iterator[memoryview]:
        """The container's bytes up to its last commit, in order: for a compressed file,
        exactly what ``zstd -d`` writes."""
        self._ensure_open()
        yield from self._source.chunks()

    @property
    def alignment(self) -> int:
        self._ensure_open()
        return self.header.alignment

    def __len__(self) -> int:
        if self._len is None:
            self._ensure_open()
        return self._len

    # ------------------------------------------------------------------ checking

    @reports_close
    def verify(self, progress: Any = None) -> VerifyReport:
        """Check every checksum and every record's structure; never raises for bad data.

        ``progress`` (optional) is called with the number of records checked so far.
        Closing the dataset from another thread meanwhile makes it raise ClosedError (the
        records it could not read then are not bad).
        """
        self._ensure_open()
        report = verify_dataset(self, progress)
        if self._source is None:
            raise ClosedError(f"{self.path}: dataset was closed during verify()")
        return report

    def __repr__(self) -> str:
        state = "closed" if self._source is None else f"{self._len} records"
        return f"<evalue_store.Dataset {self.path!r} {state}>"


def open_dataset(
    path: str | os.PathLike,
    *,
    backend: str = "mmap",
    verify: bool = True,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    max_frame_size: int = MAX_FRAME_SIZE,
    max_record_bytes: int | None = None,
    as_dict: bool = False,
    filesystem: Any = None,
    storage_options: dict | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Dataset:
    """Open a container for reading at its last commit.

    ``backend``: "mmap" (default; zero-copy views) or "pread" (plain reads, for network
    filesystems). ``verify``: check each record's CRC32 when it is read (default True);
    False skips that check so that big tensors are handed out without touching their pages.
    Compressed files are recognized from their bytes; ``cache_bytes`` bounds the cache of
    decompressed frames; their frames are read from a mapping of the committed bytes, or
    with ``pread`` under ``backend="pread"``.

    Limits for untrusted files: ``max_frame_size`` refuses, at open, a compressed file with a
    frame that decompresses to more (the default is the largest frame a Writer makes);
    ``max_record_bytes`` makes reading a bigger record raise FormatError instead of mapping,
    or for a compressed file decompressing, that much (``verify()`` lists such records as
    bad records, with that reason).

    ``as_dict``: records come back as dicts keyed by the file's field names (``fields``;
    ValueError here if it has none) instead of lists.

    ``path`` may be an fsspec URL (``s3://bucket/train.evs``, ``https://...``), or a path
    within ``filesystem`` (an ``fsspec.AbstractFileSystem``); ``storage_options`` go to
    fsspec (credentials, ``endpoint_url``...). Remote records are fetched by ranged
    requests (``evalue_store.remote``); ``cache_dir`` instead keeps a checked local copy of
    the whole object there and reads that.
    """
    return Dataset(
        path,
        backend=backend,
        verify=verify,
        cache_bytes=cache_bytes,
        max_frame_size=max_frame_size,
        max_record_bytes=max_record_bytes,
        as_dict=as_dict,
        filesystem=filesystem,
        storage_options=storage_options,
        cache_dir=cache_dir,
    )
