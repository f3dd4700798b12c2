"""Reader: random access to committed records, tensors as zero-copy views."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from . import batch, bounded, indexing, remote, remote_cache
from .batch import Batch, Out
from .bounded import SHADOWED
from .codec import compile_layout, decode_payload
from .container import (
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    FRAME_SIZE,
    Commit,
    Header,
    check_frame,
    parse_metadata,
)
from .errors import CHECKSUM, LIMIT, OUT_OF_BOUNDS, ClosedError, FormatError
from .fields import stored_names, to_dict
from .indexing import Index
from .physical import open_source
from .verify import VerifyReport, verify_dataset
from .zstd import DEFAULT_CACHE_BYTES, MAX_FRAME_SIZE

MAX_LAYOUTS = 1024  # record structures remembered per reader (bounded: lengths may all differ)
SCAN_CHUNK = 512  # index entries a scan decodes at a time
OPEN_ATTEMPTS = 5  # opens retried while a writer changes the file's tail underneath


class Dataset:
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
            raise ValueError(f"backend must be 'mmap' or 'pread', not {backend!r}")
        self.path = os.fspath(path)
        self.backend = backend
        self.verify_reads = verify
        self.cache_bytes = cache_bytes
        self.max_frame_size = max_frame_size
        self.max_record_bytes = max_record_bytes
        self.as_dict = as_dict
        self.filesystem = filesystem
        self._file = self.path  # a local path resolved now: refresh() ignores a chdir
        if filesystem is None and not remote.is_url(self.path):
            self._file = os.path.abspath(self.path)
        self.storage_options = storage_options
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self._source: Any = None
        self._load()
        if as_dict:
            try:
                self._dict_names()  # an unnamed file is an error now, not at the first read
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ opening

    def _load(self) -> None:
        """Open the file at its last commit. A writer may be cutting off an uncommitted tail
        (abort, recovery) while the tail is searched: a FormatError from a file whose size
        changed meanwhile is that race, and the open is tried again."""
        path = self._file
        if self.filesystem is not None or remote.is_url(path):
            fs, inner, url = remote.resolve(path, self.filesystem, self.storage_options)
            if self.cache_dir is None:
                source, header, commit, self._identity = remote.open_remote(
                    fs,
                    inner,
                    url,
                    cache_bytes=self.cache_bytes,
                    max_frame_size=self.max_frame_size,
                )
                self._install(source, header, commit, self._identity[0] - source.physical_end)
                return
            path = remote_cache.local_copy(fs, inner, url, self.cache_dir)
        for attempt in range(OPEN_ATTEMPTS):
            fd = bounded.open_regular(path)
            try:
                st = os.fstat(fd)
            except BaseException:
                os.close(fd)
                raise
            try:
                self._load_from(fd, st.st_size)  # closes fd
            except FormatError:
                now = os.stat(path)
                same = (now.st_size, now.st_mtime_ns, now.st_ino) == (
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_ino,
                )
                if same or attempt + 1 == OPEN_ATTEMPTS:
                    raise
            else:
                self._identity = (st.st_dev, st.st_ino)
                return

    def _load_from(self, fd: int, size: int) -> None:
        source, header, commit = open_source(
            fd,
            size,
            backend=self.backend,
            cache_bytes=self.cache_bytes,
            max_frame_size=self.max_frame_size,
        )
        self._install(source, header, commit, size - source.physical_end)

    @property
    def compressed(self) -> bool:
        """True when the file is stored as zstd frames (docs/FRAMES.md)."""
        self._ensure_open()
        return self._source.compressed

    def _install(self, source: Any, header: Header, commit: Commit, tail: int) -> None:
        self._close_source()
        self._source = source
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

    def _close_source(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def refresh(self) -> bool:
        """Pick up commits made since opening; returns True if the dataset changed."""
        self._ensure_open()
        old = (self._identity, self.header.file_id, self.commit.number, self.commit.end)
        self._load()  # a file replaced by another (rename) may have the same size
        return (self._identity, self.header.file_id, self.commit.number, self.commit.end) != old

    def close(self) -> None:
        """Release the file. Tensor views handed out earlier stay valid."""
        self._close_source()

    def _ensure_open(self) -> None:
        if self._source is None:
            if getattr(self, "_closed_by_pickle", False):
                self._closed_by_pickle = False
                self._load()
            else:
                raise ClosedError(f"{self.path}: dataset is closed")

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
        self._source = None
        self._closed_by_pickle = True
        self._len = None

    # ------------------------------------------------------------------ properties

    @property
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
                    raise FormatError("metadata checksum mismatch", c.metadata_offset, self.path)
                try:
                    self._metadata = parse_metadata(raw, c.metadata_offset)
                except FormatError as exc:
                    raise FormatError(exc.reason, exc.offset, self.path) from None
        return self._metadata

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The names of the record fields (``evalue_store.fields``), None if unnamed."""
        return stored_names(self.metadata)

    def _dict_names(self) -> tuple[str, ...]:
        if self._names is None:
            names = self.fields
            if names is None:
                raise ValueError(f"{self.path}: as_dict needs field names; its records have none")
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

    # ------------------------------------------------------------------ index

    def _entry_at(self, i: int) -> int:
        k = 0 if len(self._starts) == 1 else bisect.bisect_right(self._starts, i) - 1
        return self._segments[k].offset + (i - self._starts[k]) * ENTRY_SIZE

    def _entry_of(self, i: int) -> tuple[int, int, int, int]:
        """Record ``i``'s index entry as stored (the source may find it without reading the
        index: a compressed file's locators)."""
        return self._source.entry(self._entry_at(i), i)

    def _entry(self, i: int) -> tuple[int, int, int]:
        offset, length, crc, reserved = self._entry_of(i)
        if reserved:
            at = self._entry_at(i)
            raise FormatError(f"index entry of record {i} has reserved bits set", at, self.path)
        return offset, length, crc

    def entries(self) -> np.ndarray:
        """The whole index as one structured array (offset, length, crc, reserved).

        Each segment is a zero-copy view; with several segments they are concatenated.
        """
        self._ensure_open()
        parts = [self._segment_array(seg) for seg in self._segments]
        if not parts:
            return np.zeros(0, ENTRY_DTYPE)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def iter_entries(self) -> Iterator[np.ndarray]:
        """``entries()`` in pieces of at most 1 MiB (a compressed index can exceed memory)."""
        self._ensure_open()
        for seg in self._segments:
            for _, entries in bounded.index_chunks(self._source.read, seg):
                yield entries

    def _segment_array(self, seg: Any) -> np.ndarray:
        raw = self._source.read(seg.offset, seg.count * ENTRY_SIZE)
        return np.frombuffer(raw, ENTRY_DTYPE, seg.count)

    # ------------------------------------------------------------------ records

    def _record(self, i: int) -> list:
        return self._read(i, *self._entry(i))

    def _check_entry(self, i: int, offset: int, length: int) -> None:
        place = dict(path=self.path, record=i, offset_in=self._offsets_in)
        if offset % self.header.alignment or offset < self.header.data_start:
            raise FormatError(f"bad offset {offset}", offset, code=OUT_OF_BOUNDS, **place)
        if length > self.commit.end - offset - FRAME_SIZE:
            raise FormatError("runs past the committed end", offset, code=OUT_OF_BOUNDS, **place)
        if self.max_record_bytes is not None and length > self.max_record_bytes:
            reason = f"{length} bytes, over max_record_bytes={self.max_record_bytes}"
            raise FormatError(reason, offset, code=LIMIT, **place)

    def raw(self, index: int) -> memoryview:
        """Record ``index`` as stored: its payload bytes (docs/FORMAT.md section 4), as a
        read-only view valid while the dataset is open.

        Checked: the frame header must match the index entry and, with ``verify``, the
        checksum the payload (the values are not decoded; ``Writer.append_raw`` checks
        them). ``Writer.append_raw(ds.raw(i), ds.alignment)`` copies a record exactly,
        which decoding and re-encoding cannot always do.
        """
        self._ensure_open()
        i = indexing.scalar(index, self._len)
        offset, length, crc = self._entry(i)
        self._check_entry(i, offset, length)
        buf, pos = self._source.frame(offset, FRAME_SIZE + length)
        try:
            check_frame(bytes(buf[pos : pos + FRAME_SIZE]), offset, self.commit.end, length, crc)
            payload = memoryview(buf).cast("B")[pos + FRAME_SIZE : pos + FRAME_SIZE + length]
            if self._crc_on_read and self._checksum(payload) != crc:
                raise FormatError("record checksum mismatch", offset, code=CHECKSUM)
        except FormatError as exc:
            raise exc.at(path=self.path, record=i, offset_in=self._offsets_in) from None
        return payload.toreadonly()

    def _read(self, i: int, offset: int, length: int, crc: int) -> list:
        """Record ``i`` given its index entry."""
        align = self.header.alignment
        limit = self.max_record_bytes
        if (
            offset % align
            or offset < self.header.data_start
            or length > self.commit.end - offset - FRAME_SIZE
            or (limit is not None and length > limit)
        ):
            self._check_entry(i, offset, length)  # raises, saying which rule failed
        buf, pos = self._source.frame(offset, FRAME_SIZE + length)
        try:
            if self._crc_on_read:
                payload = memoryview(buf)[pos + FRAME_SIZE : pos + FRAME_SIZE + length]
                if self._checksum(payload) != crc:  # first: does the frame disagree with its entry?
                    head = bytes(buf[pos : pos + FRAME_SIZE])
                    check_frame(head, offset, self.commit.end, length, crc)
                    raise FormatError("record checksum mismatch", offset, code=CHECKSUM)
            layout = self._layouts.get(length)
            if layout is not None:
                values = layout.decode(buf, pos, crc)  # checks the frame header too
                if values is not None:
                    return values
            check_frame(bytes(buf[pos : pos + FRAME_SIZE]), offset, self.commit.end, length, crc)
            try:
                values = decode_payload(buf, pos, length, align)
            except FormatError as exc:  # its offsets are positions in buf: make them the file's
                raise exc.at(shift=offset - pos) from None
        except FormatError as exc:
            raise exc.at(path=self.path, record=i, offset_in=self._offsets_in) from None
        self._learn_layout(buf, pos, length)
        return values

    def _learn_layout(self, buf: Any, pos: int, length: int) -> None:
        """Compile a Layout for a record length seen twice (a repeating structure)."""
        if length in self._layouts or length not in self._lengths_seen:
            if len(self._lengths_seen) > MAX_LAYOUTS:
                self._lengths_seen.clear()
            self._lengths_seen.add(length)
            return
        self._remember_layout(length, compile_layout(buf, pos, length, self.header.alignment))

    def _remember_layout(self, length: int, layout: Any) -> None:
        if len(self._layouts) > MAX_LAYOUTS:
            self._layouts.clear()
        self._layouts[length] = layout

    def __getitem__(self, index: Index) -> Any:
        """One record for an integer; a list of records for a slice, an integer array or a
        boolean mask (numpy's rules, see ``evalue_store.indexing``)."""
        self._ensure_open()
        where = indexing.normalize(index, self._len)
        if isinstance(where, int):
            record = self._record(where)
            return to_dict(record, self._dict_names()) if self.as_dict else record
        if isinstance(where, range):
            records = [self._record(i) for i in where]
        else:
            records = self._get_positions(where.tolist())
        return self._named(records) if self.as_dict else records

    def get_batch(self, indices: Sequence[int] | np.ndarray, *, out: Out = None) -> Batch:
        """Records ``indices`` (as ``get_many`` takes them) as one batch: a dict by field
        name when the file names its fields, else a list by position, of one value per
        field. A Tensor field of one dtype and shape across the batch is one stacked
        array [B, *shape]; an Int / Double / Bool field a 1-D int64 / float64 / bool array;
        any other field a list of B values.

        ``out`` maps field names (or positions) to C-contiguous numpy arrays or CPU torch
        tensors (pinned or shared memory is fine) of exactly [B, *shape] and the field's
        dtype: those fields are decoded straight into them, and they are what the batch
        holds. Every record is checked as ``ds[i]`` checks it. Stacked arrays are copies,
        never views of the file. See ``evalue_store.batch``.
        """
        return batch.get_batch(self, indices, out)

    def get_many(self, indices: Sequence[int] | np.ndarray) -> list[list]:
        """Records for a list of indices (or a boolean mask), in the order given.

        They are read in file order, so a compressed file decompresses each frame once
        per batch and a plain one reads forward.
        """
        self._ensure_open()
        records = self._get_positions(indexing.many(indices, self._len).tolist())
        return self._named(records) if self.as_dict else records

    def _get_positions(self, positions: list[int]) -> list[list]:
        wanted = sorted(zip(positions, range(len(positions))))
        pin = getattr(self._source, "pin", None)  # a remote source fetches a batch at once
        if pin is not None:
            pin([(self._entry_at(i), ENTRY_SIZE) for i, _ in wanted], index=True)
        entries = [self._entry(i) for i, _ in wanted]  # all index lookups, then all records
        if pin is not None:
            pin([(o, FRAME_SIZE + n) for o, n, _ in entries if self._plausible(o, n)])
        result: list = [None] * len(wanted)
        try:
            for (i, k), entry in zip(wanted, entries):
                result[k] = self._read(i, *entry)
        finally:
            if pin is not None:
                self._source.unpin()
        return result

    def _plausible(self, offset: int, length: int) -> bool:
        """An entry whose frame lies within the commit and the record limit (worth fetching
        ahead; ``_read`` reports any other)."""
        limit = self.max_record_bytes
        return (
            offset >= self.header.data_start
            and length <= self.commit.end - offset - FRAME_SIZE
            and (limit is None or length <= limit)
        )

    def __iter__(self) -> Iterator[list]:
        self._ensure_open()
        if self._source.mapped is not None:
            records = self._scan_mapped()
        else:
            records = self._scan_by_chunks()
        if self.as_dict:
            names = self._dict_names()
            records = (to_dict(r, names) for r in records)
        for record in records:
            yield record
            if self._source is None:  # closed during the scan: records handed out stay valid
                raise ClosedError(f"{self.path}: dataset is closed")

    def _shadow_check(self, chunk: np.ndarray, reach: int) -> tuple[int, int]:
        """(records of ``chunk`` before the first that overlaps an earlier one, new reach)."""
        masked, reach = bounded.shadowed(chunk, reach, self.header.data_start, self.commit.end)
        return (int(masked.argmax()) if masked.any() else len(chunk)), reach

    def _scan_mapped(self) -> Iterator[list]:
        first = reach = 0
        for seg in self._segments:
            entries = self._segment_array(seg)
            for lo in range(0, seg.count, SCAN_CHUNK):
                chunk = entries[lo : lo + SCAN_CHUNK]
                good, reach = self._shadow_check(chunk, reach)
                if good < len(chunk):
                    yield from (self._record(i) for i in range(first + lo, first + lo + good))
                    at = int(chunk[good]["offset"])
                    raise FormatError(SHADOWED, at, self.path, record=first + lo + good)
                # Runs: records of one payload length, each frame right after the one before
                # (as a writer appends them), so their frames are ``step`` bytes apart.
                lengths, offsets = chunk["length"], chunk["offset"]
                step = lengths + (FRAME_SIZE + self.header.alignment - 1)
                step -= step % self.header.alignment
                joined = (lengths[1:] == lengths[:-1]) & (offsets[1:] == offsets[:-1] + step[:-1])
                bounds = [0, *(np.flatnonzero(~joined) + 1).tolist(), len(chunk)]
                for a, b in zip(bounds[:-1], bounds[1:]):
                    yield from self._scan_run(first + lo + a, chunk[a:b])
            first += seg.count

    def _scan_by_chunks(self) -> Iterator[list]:
        """Every record in order, for a compressed or pread source: index entries are read
        SCAN_CHUNK at a time instead of one lookup per record. A chunk that cannot be read,
        or an entry with reserved bits, is read record by record by ``_record``, so that
        errors name their record and the records before them are still yielded."""
        first = reach = 0
        for seg in self._segments:
            for lo in range(0, seg.count, SCAN_CHUNK):
                count = min(SCAN_CHUNK, seg.count - lo)
                try:
                    raw = self._source.read(seg.offset + lo * ENTRY_SIZE, count * ENTRY_SIZE)
                except FormatError:
                    for i in range(first + lo, first + lo + count):
                        yield self._record(i)
                    continue
                good, reach = self._shadow_check(np.frombuffer(raw, ENTRY_DTYPE), reach)
                for i, (offset, length, crc, reserved) in enumerate(
                    ENTRY.iter_unpack(raw), first + lo
                ):
                    if i - first - lo == good:
                        raise FormatError(SHADOWED, offset, self.path, record=i)
                    yield self._record(i) if reserved else self._read(i, offset, length, crc)
            first += seg.count

    def _scan_run(self, first: int, entries: np.ndarray) -> Iterator[list]:
        """Records ``first``, ``first + 1``... of a run: the same payload length, and frames
        laid end to end from the first entry's offset (unless the index is damaged: any
        record the run decoder cannot vouch for is read by ``_record``, which reports it)."""
        offset, length, _, _ = entries[0].tolist()
        count = len(entries)
        k = 0
        while k < count and length not in self._layouts:  # how a layout is learned
            yield self._record(first + k)
            k += 1
        if k == count:
            return
        layout = self._layouts.get(length)
        align = self.header.alignment
        stride = (FRAME_SIZE + length + align - 1) // align * align
        start = offset + k * stride
        if (
            layout is None
            or entries["reserved"].any()
            or offset % align
            or offset < self.header.data_start
            or start + (count - 1 - k) * stride + FRAME_SIZE + length > self.commit.end
        ):
            for j in range(k, count):
                yield self._record(first + j)
            return
        buf = self._source.mapped
        crcs = entries["crc"][k:]
        records, _ = layout.decode_run(buf, start, stride, count - k, crcs)
        if self._crc_on_read:
            at = start + FRAME_SIZE
            checksum = self._checksum
            for j, crc in enumerate(crcs.tolist()):
                if checksum(buf[at : at + length]) != crc:
                    records[j] = None
                at += stride
        for j, values in enumerate(records, k):
            yield values if values is not None else self._record(first + j)

    # ------------------------------------------------------------------ checking

    def verify(self, progress: Any = None) -> VerifyReport:
        """Check every checksum and every record's structure; never raises for bad data.

        ``progress`` (optional) is called with the number of records checked so far.
        """
        self._ensure_open()
        return verify_dataset(self, progress)

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
    decompressed frames. (They are always read through a mapping of the compressed bytes:
    ``backend`` applies to plain files only.)

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
