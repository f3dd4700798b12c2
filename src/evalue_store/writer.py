"""Writer: appends records to a container and commits them (docs/FORMAT.md, "Commit protocol")."""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import zstandard

from . import __version__
from .codec import check_payload, decode_payload, encode_record, realign_payload
from .container import (
    DEFAULT_ALIGNMENT,
    ENTRY,
    ENTRY_SIZE,
    FRAME,
    FRAME_MAGIC,
    FRAME_SIZE,
    MAX_ALIGNMENT,
    MAX_METADATA,
    MIN_ALIGNMENT,
    Commit,
    Header,
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
from .errors import EncodeError, FormatError, WriterLockedError
from .frames import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_FRAME_SIZE,
    MAX_FRAME_SIZE,
    PlainSink,
    ZstdSink,
    ZstdSource,
    dictionary_frame,
    is_compressed,
    pwrite_all,
    table_from_lists,
)
from .seekable import EMPTY_CHECKSUM, decompress_frame, frame_extent

MERGE_FANOUT = 4  # merge the newest index segments when this many share a level
MIN_FRAME_SIZE = 256  # below this, per-frame overhead outweighs the record; 1 record per frame
SALVAGE_EXPANSION = 64  # recovery decompresses at most this much per byte of compressed tail


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


def _side_file(path: str, keep: int, data: Any) -> str:
    """Save bytes that recovery will cut off, fsynced, under a name no other file has."""
    side = f"{path}.tail-{keep}"
    counter = 0
    while os.path.exists(side):
        counter += 1
        side = f"{path}.tail-{keep}.{counter}"
    with open(side, "xb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return side


def _scan_tail(read: Any, header: Header, start: int, end: int, buf: Any, base: int) -> tuple:
    """Complete, checksum-valid, decodable record frames in logical bytes [start, end).

    ``buf[offset - base]`` holds logical byte ``offset``. Returns (frames, end of the last
    frame including its zero padding, or ``start`` if none).
    """

    def validate(offset: int, length: int) -> None:
        decode_payload(buf, offset - base, length, header.alignment)

    found, good_end = scan_frames(read, start, end, header.alignment, validate)
    if not found:
        return found, start
    padded = min(align_up(good_end, header.alignment), end)
    if not any(read(good_end, padded - good_end)):  # the last record's own zero padding
        good_end = padded
    return found, good_end


class _PlainFile:
    """An existing plain container opened for appending: its state and a salvaged tail."""

    def __init__(self, fd: int, size: int, path: str):
        self.map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        try:
            self.header = parse_header(self.read, size)
            self.commit = find_last_commit(self.read, size, self.header)
            start = align_up(self.commit.end, self.header.alignment)
            self.found, keep = [], self.commit.end
            if size > self.commit.end:
                self.found, keep = _scan_tail(self.read, self.header, start, size, self.map, 0)
                keep = max(keep, self.commit.end) if self.found else self.commit.end
            self.keep = keep
            side = _side_file(path, keep, self.read(keep, size - keep)) if size > keep else None
            self.salvage = (
                Salvage(
                    self.commit.record_count,
                    len(self.found),
                    size - self.commit.end,
                    size - keep,
                    side,
                )
                if size > self.commit.end
                else None
            )
        finally:
            self.map.close()

    def read(self, offset: int, n: int) -> memoryview:
        return memoryview(self.map)[offset : offset + n]


class _ZstdFile:
    """An existing compressed container opened for appending.

    A crash leaves frames after the last seek table; the complete ones whose bytes are
    complete records are kept (their frames stay as they are), the rest goes to a side file.
    """

    def __init__(self, fd: int, size: int, path: str):
        source = ZstdSource(fd, size, cache_bytes=DEFAULT_CACHE_BYTES)
        try:
            self.header = parse_header(source.read, source.size)
            source.set_alignment(self.header.alignment)
            self.commit = source.last_commit(self.header)
            if self.commit.end != source.size:
                raise FormatError("the last seek table does not end at a commit", size)
            self.dictionary = source.dictionary
            table = source.table
            if table.checksums is None:  # valid seekable, but its next table could not list them
                reason = "seek table has no checksums (Checksum_Flag 0): cannot append to it"
                raise FormatError(reason, table.table_offset)
            frames = [list(x) for x in table.entries_for_next_table()]
            self.found, self.keep, kept = self._salvage(source, table.end, size)
            for csize, dsize, checksum in kept:
                frames[0].append(csize)
                frames[1].append(dsize)
                frames[2].append(checksum)
            self.frames = frames
            self.logical_end = source.size + sum(d for _, d, _ in kept)
            side = None
            if size > self.keep:
                side = _side_file(path, self.keep, source.map[self.keep : size])
            self.salvage = None
            if size > table.end:
                self.salvage = Salvage(
                    self.commit.record_count,
                    len(self.found),
                    size - table.end,
                    size - self.keep,
                    side,
                )
        finally:
            source.close()

    def _salvage(self, source: ZstdSource, start: int, size: int) -> tuple:
        # Decompressed tail bytes are held in memory: bounded by the reader's frame cap per
        # frame, and in all by SALVAGE_EXPANSION times the compressed tail plus one frame.
        # Frames past either bound are not salvaged (they go to the side file).
        frames, logical, pos = [], bytearray(), start
        room = MAX_FRAME_SIZE + SALVAGE_EXPANSION * (size - start)
        while pos < size:
            n = frame_extent(source.map, pos, size)
            if n is None:
                break
            data = _decompress_tail_frame(source, pos, n, min(MAX_FRAME_SIZE, room))
            if data is None:
                break
            (checksum,) = struct.unpack_from("<I", source.map, pos + n - 4)
            frames.append((n, len(data), checksum, pos + n))
            logical += data
            room -= len(data)
            pos += n
        base = source.size
        if not frames:
            return [], start, []

        def read(offset: int, n: int) -> memoryview:
            return memoryview(logical)[offset - base : offset - base + n]

        found, good_end = _scan_tail(
            read,
            self.header,
            align_up(base, self.header.alignment),
            base + len(logical),
            logical,
            base,
        )
        if not found:  # frames of alignment padding alone are no records: nothing to keep
            return [], start, []
        kept, logical_end, keep = [], base, start
        for csize, dsize, checksum, physical_end in frames:
            if logical_end + dsize > good_end:
                break  # a frame holding anything but complete records is not kept
            kept.append((csize, dsize, checksum))
            logical_end += dsize
            keep = physical_end
        found = [f for f in found if f[0] + FRAME_SIZE + f[1] <= logical_end]
        return found, keep, kept


def _decompress_tail_frame(source: ZstdSource, pos: int, n: int, cap: int) -> Any:
    """The bytes of the complete zstd frame at ``pos`` (``n`` bytes; no seek table lists it),
    or None if it declares more than ``cap`` bytes or does not decompress to what it
    declares: checked before any allocation (its header, its blocks' capacity)."""
    frame = source.map[pos : pos + n]
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
    except zstandard.ZstdError:
        return None
    if declared > cap:  # frame_extent already refused an unknown content size
        return None
    (checksum,) = struct.unpack_from("<I", frame, n - 4)
    table = table_from_lists([n], [declared], [checksum])
    try:
        return memoryview(decompress_frame(frame, table, 0, dctx=source.dctx))
    except FormatError:
        return None


def _check_alignment(alignment: int) -> None:
    if alignment & (alignment - 1) or not MIN_ALIGNMENT <= alignment <= MAX_ALIGNMENT:
        raise ValueError(f"alignment must be a power of two in [8, 65536], not {alignment}")


class Writer:
    """Appends records to a container file; ``commit()`` makes them durable and visible.

    ``mode``: "w" creates or truncates, "x" creates and fails if the file exists, "a" appends
    (creating the file if needed; a tail left by a crashed writer is salvaged first, see
    ``salvage``). ``close()``, or leaving the ``with`` block normally, commits; leaving it by an
    exception discards what was appended since the last commit (``abort()``). One writer per file:
    a second one raises WriterLockedError. Not thread-safe.

    ``compression="zstd"`` stores the same container as seekable zstd frames of about
    ``frame_size`` bytes (docs/FORMAT.md section 16); ``dictionary`` (bytes from
    ``train_dictionary``) is stored once at the start of the file. In mode "a" the file's
    own compression settings apply.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        mode: str = "w",
        *,
        metadata: dict | None = None,
        alignment: int = DEFAULT_ALIGNMENT,
        durable: bool = True,
        compression: str | None = None,
        level: int = 3,
        frame_size: int = DEFAULT_FRAME_SIZE,
        dictionary: bytes | None = None,
    ):
        if mode not in ("w", "x", "a"):
            raise ValueError(f"mode must be 'w', 'x' or 'a', not {mode!r}")
        _check_alignment(alignment)
        if compression not in (None, "zstd"):
            raise ValueError(f"compression must be None or 'zstd', not {compression!r}")
        if not MIN_FRAME_SIZE <= frame_size <= MAX_FRAME_SIZE:
            raise ValueError(
                f"frame_size must be in [{MIN_FRAME_SIZE}, {MAX_FRAME_SIZE}], not {frame_size}"
            )
        if dictionary is not None and compression != "zstd":
            raise ValueError("a dictionary needs compression='zstd'")
        self.path = os.fspath(path)
        self.durable = durable
        self.salvage: Salvage | None = None
        self._metadata_bytes = _encode_metadata(metadata)
        self._pending = bytearray()
        self._zstd = dict(level=level, frame_size=frame_size)
        self._fd = -1
        self._failed = ""  # why the writer cannot go on, after a write it could not undo
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
                self._create(alignment, size, compression, dictionary)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    # ------------------------------------------------------------------ setup

    def _create(
        self, alignment: int, size: int, compression: str | None, dictionary: bytes | None
    ) -> None:
        if size:
            os.ftruncate(self._fd, 0)
        self.alignment = alignment
        self.file_id = new_file_id()
        writer_info = f"evalue_store {__version__}"
        header = encode_header(alignment, self.file_id, time.time_ns(), writer_info)
        if compression == "zstd":
            frames: tuple[list, list, list] = ([], [], [])
            physical = 0
            if dictionary:
                head = dictionary_frame(dictionary)
                pwrite_all(self._fd, memoryview(head), 0)
                frames = ([len(head)], [0], [EMPTY_CHECKSUM])
                physical = len(head)
            self._sink: Any = ZstdSink(
                self._fd, physical, 0, frames, dictionary=dictionary, **self._zstd
            )
        else:
            self._sink = PlainSink(self._fd, 0)
        self._commit = empty_commit(len(header))
        self._sink.write(header, len(header))
        self._metadata_dirty = True
        self.commit(force=True)
        _fsync_dir(self.path)

    def _open_existing(self, size: int, new_metadata: bool) -> None:
        with open(self.path, "rb") as probe:
            compressed = is_compressed(probe.read(8))
        state: Any = (_ZstdFile if compressed else _PlainFile)(self._fd, size, self.path)
        if state.commit.number >= (1 << 64) - 1:  # a footer's u64 counter cannot go on
            reason = "commit number is at its 64-bit maximum: cannot commit again"
            raise FormatError(reason, state.commit.footer_offset)
        self.alignment = state.header.alignment
        self.file_id = state.header.file_id
        self._commit = state.commit
        self._metadata_dirty = new_metadata
        self.salvage = state.salvage
        self._committed_size = state.keep
        if state.keep < size:
            os.ftruncate(self._fd, state.keep)
        if compressed:
            self._sink = ZstdSink(
                self._fd,
                state.keep,
                state.logical_end,
                state.frames,
                dictionary=state.dictionary,
                **self._zstd,
            )
        else:
            self._sink = PlainSink(self._fd, state.keep)
        for offset, length, crc in state.found:
            self._pending += ENTRY.pack(offset, length, crc, 0)
        if state.found or self._commit.number == 0:
            self.commit(force=True)  # salvaged records become durable before anything new

    # ------------------------------------------------------------------ writing

    def _align(self) -> int:
        padding = -self._sink.pos & (self.alignment - 1)
        if padding:
            self._sink.write(bytes(padding), padding)
        return self._sink.pos

    def _block(self, data: Any, granule: int = 1) -> int:
        """Write one block (index segment, metadata, footer) at an aligned offset."""
        offset = self._align()
        self._sink.begin_block(len(data), granule)
        self._sink.write(data, len(data))
        return offset

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ValueError(f"{self.path}: writer is closed")
        if self._failed:
            raise ValueError(f"{self.path}: {self._failed}")

    def _undo_record(self, offset: int, error: BaseException) -> None:
        """After a record's write failed part way (disk full, an interrupt): forget its bytes
        so that the next block starts where it did. Where that cannot be done, the writer
        refuses to go on, and close() keeps only the last commit."""
        try:
            undone = self._sink.rewind(offset)
        except OSError:
            undone = False
        if not undone:
            self._failed = (
                f"a record's write failed part way ({error!r}); the records appended since "
                "the last commit are lost: reopen the file with mode='a'"
            )

    def append(self, record: Sequence[Any]) -> int:
        """Append one record (a list of values); returns its index. Visible after commit()."""
        self._check_open()
        chunks, length, crc = encode_record(record, self.alignment)
        sink = self._sink
        offset = sink.pos
        if offset & (self.alignment - 1):  # after a footer the file end may be unaligned
            offset = self._align()
        sink.begin_block(FRAME_SIZE + length)
        try:
            for chunk in chunks:
                sink.write(chunk, len(chunk))  # bytearrays and 1-D uint8 arrays
        except BaseException as exc:
            self._undo_record(offset, exc)
            raise
        pending = self._pending
        pending += ENTRY.pack(offset, length, crc, 0)
        return self._commit.record_count + len(pending) // ENTRY_SIZE - 1

    def append_raw(self, payload: Any, alignment: int | None = None) -> int:
        """Append a record given as its encoded payload (what ``Dataset.raw`` returns);
        returns its index. The payload is checked first (FormatError if malformed).

        The bytes are kept as they are, which makes copying records between files exact:
        decoding and re-encoding cannot tell an empty ListTensor from an empty ListInt.
        ``alignment`` is the one the payload was encoded for (``Dataset.alignment``), if not
        this file's; its tensors are then re-padded, all other bytes kept.
        """
        self._check_open()
        payload = memoryview(payload).cast("B")
        if alignment is None or alignment == self.alignment:
            check_payload(payload, self.alignment)
        else:
            _check_alignment(alignment)
            payload = memoryview(realign_payload(payload, alignment, self.alignment))
        length = len(payload)
        sink = self._sink
        offset = self._align()
        sink.begin_block(FRAME_SIZE + length)
        crc = zlib.crc32(payload)
        padding = -(FRAME_SIZE + length) & (self.alignment - 1)
        try:
            sink.write(FRAME.pack(FRAME_MAGIC, crc, length), FRAME_SIZE)
            sink.write(payload, length)
            sink.write(bytes(padding), padding)  # so that the next block starts aligned
        except BaseException as exc:
            self._undo_record(offset, exc)
            raise
        self._pending += ENTRY.pack(offset, length, crc, 0)
        return len(self) - 1

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

    def tell(self) -> int:
        """Bytes of the container written so far, buffered ones included (for a compressed
        file, of the uncompressed stream): what a size limit on the file should count."""
        return self._sink.pos

    # ------------------------------------------------------------------ commit

    def _segment_bytes(self, segment: Segment) -> bytes:
        return bytes(self._sink.read(segment.offset, segment.count * ENTRY_SIZE))

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
        self._sink.flush()
        if self.durable:
            os.fsync(self._fd)
        segments, pending = self._commit.segments, bytes(self._pending)
        if pending:
            kept, data, level = self._index_segments(pending)
            offset = self._block(data, granule=ENTRY_SIZE)
            segments = kept + (Segment(offset, len(data) // ENTRY_SIZE, crc32(data), level),)
        meta_off, meta_len, meta_crc = (
            self._commit.metadata_offset,
            self._commit.metadata_length,
            self._commit.metadata_crc,
        )
        if self._metadata_dirty:
            meta = self._metadata_bytes
            meta_off, meta_len, meta_crc = (
                (self._block(meta) if meta else 0),
                len(meta),
                crc32(meta),
            )
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
        self._block(footer)
        self._sink.end_commit()
        if self.durable:
            os.fsync(self._fd)
        self._commit = replace(commit, end=footer_offset + len(footer))
        self._committed_size = self._sink.physical_end
        self._pending.clear()
        self._metadata_dirty = False

    def abort(self) -> None:
        """Discard the records appended since the last commit and release the file.

        The file is cut back to its last commit, so they do not come back as a salvageable
        tail. Leaving a ``with`` block by an exception aborts; leaving it normally commits.
        """
        if self._fd < 0:
            return
        try:
            os.ftruncate(self._fd, self._committed_size)
        finally:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Commit and release the file (and its lock)."""
        if self._fd < 0:
            return
        if self._failed:
            self.abort()
            raise ValueError(f"{self.path}: {self._failed}")
        try:
            self.commit()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

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
