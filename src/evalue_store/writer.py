"""Writer: appends records to a container and commits them (docs/FORMAT.md, "Commit protocol")."""

from __future__ import annotations

import json
import mmap
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import __version__
from .codec import decode_payload, encode_record
from .container import (
    DEFAULT_ALIGNMENT,
    ENTRY,
    ENTRY_SIZE,
    MAX_ALIGNMENT,
    MAX_METADATA,
    MIN_ALIGNMENT,
    Commit,
    Segment,
    align_up,
    crc32,
    empty_commit,
    encode_footer,
    encode_header,
    find_last_commit,
    new_file_id,
    parse_header,
    scan_frames,
)
from .errors import EncodeError, WriterLockedError

FLUSH_BYTES = 4 << 20  # buffer small writes up to this much before a write(2)
DIRECT_BYTES = 1 << 20  # parts at least this large skip the buffer
MERGE_FANOUT = 4  # merge the newest index segments when this many share a level


def _lock(fd: int, path: str) -> None:
    """Take the file's exclusive writer lock without waiting (flock on POSIX)."""
    try:
        import fcntl
    except ImportError:  # Windows: lock the first byte instead
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            raise WriterLockedError(f"{path}: another writer has this file open") from None
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise WriterLockedError(f"{path}: another writer has this file open") from None


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return  # not possible on every platform; the file's own fsync still happened
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _encode_metadata(metadata: dict | None) -> bytes:
    if metadata is None:
        return b""
    if not isinstance(metadata, dict):
        raise EncodeError("metadata must be a dict of JSON values")
    try:
        data = json.dumps(metadata, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"metadata is not JSON-serializable: {exc}") from None
    if len(data) > MAX_METADATA:
        raise EncodeError(f"metadata is {len(data)} bytes; the limit is {MAX_METADATA}")
    return data


@dataclass(frozen=True)
class Salvage:
    """What opening a file with an uncommitted tail found after its last commit."""

    committed_records: int
    salvaged_records: int
    tail_bytes: int  # bytes after the last commit
    damaged_bytes: int  # bytes that were not complete records, moved to ``side_file``
    side_file: str | None


class _FileState:
    """The parsed state of an existing file: header and last commit, plus a read function."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
        self.header = parse_header(self.read, size)
        self.commit = find_last_commit(self.read, size, self.header, self.map.rfind)

    def read(self, offset: int, n: int) -> memoryview:
        return memoryview(self.map)[offset : offset + n]

    def close(self) -> None:
        if self.map is not None:
            self.map.close()


def _salvage_tail(state: _FileState, path: str) -> tuple[list[tuple[int, int, int]], int, Salvage]:
    """Find complete, checksum-valid records after the last commit; keep the rest aside."""
    commit, header = state.commit, state.header
    start = commit.end if commit.number else header.data_start
    start = align_up(start, header.alignment)

    def validate(offset: int, length: int) -> None:
        decode_payload(state.map, offset, length, header.alignment)

    found, good_end = scan_frames(state.read, start, state.size, header.alignment, validate)
    keep = good_end if found else commit.end
    padded = min(align_up(keep, header.alignment), state.size)
    if found and not any(state.read(keep, padded - keep)):  # the record's own zero padding
        keep = padded
    side = None
    if state.size > keep:
        side = f"{path}.tail-{keep}"
        counter = 0
        while os.path.exists(side):
            counter += 1
            side = f"{path}.tail-{keep}.{counter}"
        with open(side, "xb") as out:
            out.write(state.read(keep, state.size - keep))
            out.flush()
            os.fsync(out.fileno())
    report = Salvage(
        commit.record_count, len(found), state.size - commit.end, state.size - keep, side
    )
    return found, keep, report


class Writer:
    """Appends records to a container file; ``commit()`` makes them durable and visible.

    ``mode``: "w" creates or truncates, "x" creates and fails if the file exists, "a" appends
    (creating the file if needed; a tail left by a crashed writer is salvaged first, see
    ``salvage``). Leaving the ``with`` block, or ``close()``, commits. One writer per file:
    a second one raises WriterLockedError. Not thread-safe.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        mode: str = "w",
        *,
        metadata: dict | None = None,
        alignment: int = DEFAULT_ALIGNMENT,
        durable: bool = True,
    ):
        if mode not in ("w", "x", "a"):
            raise ValueError(f"mode must be 'w', 'x' or 'a', not {mode!r}")
        if alignment & (alignment - 1) or not MIN_ALIGNMENT <= alignment <= MAX_ALIGNMENT:
            raise ValueError(f"alignment must be a power of two in [8, 65536], not {alignment}")
        self.path = os.fspath(path)
        self.durable = durable
        self.salvage: Salvage | None = None
        self._metadata_bytes = _encode_metadata(metadata)
        self._buf = bytearray()
        self._pending = bytearray()
        self._fd = -1
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0)
        if mode == "x":
            flags |= os.O_EXCL
        self._fd = os.open(self.path, flags, 0o644)
        try:
            _lock(self._fd, self.path)
            size = os.fstat(self._fd).st_size
            if mode == "a" and size:
                self._open_existing(size, metadata is not None)
            else:
                self._create(alignment, size)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    # ------------------------------------------------------------------ setup

    def _create(self, alignment: int, size: int) -> None:
        if size:
            os.ftruncate(self._fd, 0)
        self.alignment = alignment
        self.file_id = new_file_id()
        writer_info = f"evalue_store {__version__}"
        header = encode_header(alignment, self.file_id, time.time_ns(), writer_info)
        self._pos = 0
        self._commit = empty_commit(len(header))
        self._write(header)
        self._metadata_dirty = True
        self.commit(force=True)
        _fsync_dir(self.path)

    def _open_existing(self, size: int, new_metadata: bool) -> None:
        state = _FileState(self._fd, size)
        try:
            self.alignment = state.header.alignment
            self.file_id = state.header.file_id
            self._commit = state.commit
            self._metadata_dirty = new_metadata
            if state.commit.end < size or state.commit.number == 0:
                found, keep, self.salvage = _salvage_tail(state, self.path)
            else:
                found, keep = [], size
        finally:
            state.close()
        if keep < size:
            os.ftruncate(self._fd, keep)
        self._pos = keep
        for offset, length, crc in found:
            self._pending += ENTRY.pack(offset, length, crc, 0)
        if found or self._commit.number == 0:
            self.commit(force=True)  # salvaged records become durable before anything new

    # ------------------------------------------------------------------ writing

    def _write(self, data: Any, size: int | None = None) -> None:
        """Append bytes at the end; ``_pos`` is the file end including the buffer."""
        size = len(data) if size is None else size
        if size >= DIRECT_BYTES:
            self._flush()
            self._pwrite(memoryview(data).cast("B"), self._pos)
            self._pos += size
        else:
            self._buf += memoryview(data)  # memoryview: ndarray's __radd__ must not run
            self._pos += size
            if len(self._buf) >= FLUSH_BYTES:
                self._flush()

    def _pwrite(self, view: memoryview, offset: int) -> None:
        # pwrite: explicit offsets, so nothing depends on the descriptor's file position.
        while view:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def _flush(self) -> None:
        if self._buf:
            with memoryview(self._buf) as view:
                self._pwrite(view, self._pos - len(self._buf))
            self._buf.clear()

    def _align(self) -> int:
        padding = -self._pos & (self.alignment - 1)
        if padding:
            self._write(bytes(padding))
        return self._pos

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ValueError(f"{self.path}: writer is closed")

    def append(self, record: Sequence[Any]) -> int:
        """Append one record (a list of values); returns its index. Visible after commit()."""
        self._check_open()
        chunks, length, crc = encode_record(record, self.alignment)
        offset = self._align()  # after a footer the file end may be unaligned
        for chunk in chunks:
            self._write(chunk, chunk.nbytes if isinstance(chunk, np.ndarray) else len(chunk))
        index = len(self)
        self._pending += ENTRY.pack(offset, length, crc, 0)
        return index

    def extend(self, records: Iterable[Sequence[Any]]) -> None:
        """Append every record of an iterable."""
        for record in records:
            self.append(record)

    def set_metadata(self, metadata: dict | None) -> None:
        """Replace the file's metadata at the next commit (None removes it)."""
        self._check_open()
        self._metadata_bytes = _encode_metadata(metadata)
        self._metadata_dirty = True

    def __len__(self) -> int:
        return self._commit.record_count + len(self._pending) // ENTRY_SIZE

    # ------------------------------------------------------------------ commit

    def _segment_bytes(self, segment: Segment) -> bytes:
        size = segment.count * ENTRY_SIZE
        data = os.pread(self._fd, size, segment.offset)
        if len(data) != size:
            raise OSError(f"{self.path}: short read of index segment at {segment.offset}")
        return data

    def _index_segments(self, new_entries: bytes) -> tuple[tuple[Segment, ...], bytes, int]:
        """Segments after adding ``new_entries``: merges the newest ones level by level.

        Returns (segments kept from the last commit, bytes of the one new segment, its level).
        Merging MERGE_FANOUT segments of one level into one of the next keeps at most
        (MERGE_FANOUT - 1) segments per level, so a reader maps O(log n) segments while
        each entry is rewritten O(log n) times over the file's life.
        """
        kept = list(self._commit.segments)
        data, level = new_entries, 0
        while len(kept) >= MERGE_FANOUT - 1 and all(
            s.level == level for s in kept[-(MERGE_FANOUT - 1) :]
        ):
            merged = kept[-(MERGE_FANOUT - 1) :]
            del kept[-(MERGE_FANOUT - 1) :]
            data = b"".join(self._segment_bytes(s) for s in merged) + data
            level += 1
        return tuple(kept), data, level

    def commit(self, force: bool = False) -> None:
        """Make every appended record durable and visible to readers.

        Order: record data is flushed and fsynced first, then the index segment and the
        footer are written and fsynced, so a footer never points at data that is not on disk.
        """
        self._check_open()
        if not (self._pending or self._metadata_dirty or force):
            return
        self._flush()
        if self.durable:
            os.fsync(self._fd)
        segments, pending = self._commit.segments, bytes(self._pending)
        if pending:
            kept, data, level = self._index_segments(pending)
            offset = self._align()
            self._write(data)
            segments = kept + (Segment(offset, len(data) // ENTRY_SIZE, crc32(data), level),)
        meta_off, meta_len, meta_crc = (
            self._commit.metadata_offset,
            self._commit.metadata_length,
            self._commit.metadata_crc,
        )
        if self._metadata_dirty:
            meta = self._metadata_bytes
            meta_off, meta_len, meta_crc = (self._align() if meta else 0), len(meta), crc32(meta)
            if meta:
                self._write(meta)
        footer_offset = self._align()
        commit = Commit(
            self._commit.number + 1,
            self._commit.record_count + len(pending) // ENTRY_SIZE,
            footer_offset,
            0,
            self._commit.footer_offset,
            meta_off,
            meta_len,
            meta_crc,
            segments,
        )
        footer = encode_footer(footer_offset, self.file_id, commit)
        self._write(footer)
        self._flush()
        if self.durable:
            os.fsync(self._fd)
        self._commit = replace(commit, end=footer_offset + len(footer))
        self._pending.clear()
        self._metadata_dirty = False

    def close(self) -> None:
        """Commit and release the file (and its lock)."""
        if self._fd < 0:
            return
        try:
            self.commit()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # A forgotten writer still releases its descriptor; it does not commit from a finalizer.
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1


def recover(path: str | os.PathLike) -> Salvage:
    """Salvage complete, checksum-valid records written after a file's last commit.

    The records found are committed; bytes that were not complete records are moved to a
    side file named in the report (never deleted). A file with no tail is left unchanged.
    """
    with Writer(path, mode="a") as writer:
        report = writer.salvage
        if report is None:
            count = writer._commit.record_count
            report = Salvage(count, 0, 0, 0, None)
    return report
