"""Writer: appends records to a container and commits them (docs/FORMAT.md, "Commit protocol")."""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import stat
import struct
import threading
import time
import warnings
import weakref
import zlib
from collections.abc import Iterable, Mapping, Sequence
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
    MAGIC,
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
from .errors import EncodeError, FormatError
from .fields import WriterFields
from .files import create_temp, fsync_dir, open_locked, replace_locked
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
    read_dictionary,
    table_from_lists,
)
from .seekable import (
    EMPTY_CHECKSUM,
    MAX_FRAME_DECOMPRESSED_SIZE,
    decompress_frame,
    find_last_seek_table,
    frame_extent,
    new_decompressor,
)

MERGE_FANOUT = 4  # merge the newest index segments when this many share a level
MIN_FRAME_SIZE = 256  # below this, per-frame overhead outweighs the record; 1 record per frame
SALVAGE_EXPANSION = 64  # recovery decompresses at most this much per byte of compressed tail


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
    try:
        with open(side, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        fsync_dir(side)  # the bytes are cut from the container next: their new name must last
    except BaseException:
        with contextlib.suppress(OSError):  # a partial copy saves nothing: the file is intact
            os.unlink(side)
        raise
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
            try:
                self.map.close()
            except BufferError:
                pass  # an exception's traceback still holds views of the map; they free it

    def read(self, offset: int, n: int) -> memoryview:
        return memoryview(self.map)[offset : offset + n]


class _ZstdFile:
    """An existing compressed container opened for appending.

    A crash leaves frames after the last seek table; the complete ones whose bytes are
    complete records are kept (their frames stay as they are), the rest goes to a side file.
    """

    def __init__(self, fd: int, size: int, path: str):
        source = ZstdSource(fd, size, cache_bytes=DEFAULT_CACHE_BYTES, map_tail=True)
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


_LIVE_WRITERS: weakref.WeakSet = weakref.WeakSet()


def _disown_writers() -> None:
    """In a forked child, writers inherited from the parent share its descriptor and lock:
    using one would interleave the two processes' bytes. They refuse to, and closing or
    collecting them leaves the parent's file alone."""
    for writer in list(_LIVE_WRITERS):
        writer._foreign = True
        writer._failed = (
            f"this Writer belongs to process {writer._pid} (it was inherited by fork); "
            "open the file in this process instead"
        )


os.register_at_fork(after_in_child=_disown_writers)


def _serialized(method: Any) -> Any:
    """Run a Writer method under the writer's lock: threads may share a Writer, and their
    appends and commits take turns instead of losing records."""

    @functools.wraps(method)
    def locked(self: Writer, *args: Any, **kwargs: Any) -> Any:
        with self._mutex:
            return method(self, *args, **kwargs)

    return locked


def _died_before_first_commit(fd: int, size: int) -> bytes | None:
    """For a compressed file whose writer died while creating it (its header frame is
    written, the first seek table is not): the file's dictionary (b"" if none). None for any
    other file: one with a seek table, or one that does not start with our header."""
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
        # Any valid table, whatever its frames' sizes: one over the cap is an error for
        # _ZstdFile to raise, not a file to start afresh.
        if find_last_seek_table(data, size, max_frame_size=MAX_FRAME_DECOMPRESSED_SIZE):
            return None
        dictionary = read_dictionary(data, size)
        start = 8 + len(dictionary) if dictionary else 0
        length = frame_extent(data, start, size)
        if length is None:
            return None
        dict_data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        try:
            reader = new_decompressor(dict_data).stream_reader(data[start : start + length])
            head = reader.read(len(MAGIC))  # bounded, whatever the frame claims
        except zstandard.ZstdError:
            return None
    return (dictionary or b"") if head == MAGIC else None


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


class Writer(WriterFields):
    """Appends records to a container file; ``commit()`` makes them durable and visible.

    ``mode``: "w" creates or truncates, "x" creates and fails if the file exists, "a" appends
    (creating the file if needed; a tail left by a crashed writer is salvaged first, see
    ``salvage``). ``close()``, or leaving the ``with`` block normally, commits; leaving it by an
    exception discards what was appended since the last commit (``abort()``). One writer per file:
    a second one raises WriterLockedError. Threads may share a Writer: its calls take turns.

    ``compression="zstd"`` stores the same container as seekable zstd frames of about
    ``frame_size`` bytes (docs/FRAMES.md); ``dictionary`` (bytes from
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
        self._inflight: Commit | None = None  # a commit whose footer write has begun
        self._mutex = threading.RLock()
        self._pid = os.getpid()
        self._foreign = False  # inherited by a forked child: never touch the file
        _LIVE_WRITERS.add(self)
        if mode == "w" and os.path.lexists(self.path):
            self._replace(alignment, compression, dictionary)
            return
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if mode != "a" else 0)
        self._fd = open_locked(self.path, flags)
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise FormatError("not a regular file: cannot hold a container", None, self.path)
            size = st.st_size
            if size:
                self._open_existing(size, metadata is not None, alignment)
            else:
                self._create(alignment, compression, dictionary)
                if self.durable:
                    fsync_dir(self.path)
        except BaseException:
            self._release()
            raise

    def _replace(self, alignment: int, compression: str | None, dictionary: bytes | None) -> None:
        """Mode "w" over an existing file: build the new, empty container as a new inode and
        rename it over the old one. Truncating in place would kill every reader that maps
        the old file (SIGBUS); this way they keep reading the old data."""
        target = os.path.realpath(self.path)  # through a symlink, as truncating went
        old_mode = stat.S_IMODE(os.stat(target).st_mode)
        self._fd, temp = create_temp(target, old_mode)
        try:
            self._create(alignment, compression, dictionary)
            replace_locked(temp, target, durable=self.durable)
        except BaseException:
            self._release()
            with contextlib.suppress(FileNotFoundError):  # gone if the rename happened
                os.unlink(temp)
            raise

    # ------------------------------------------------------------------ setup

    def _create(self, alignment: int, compression: str | None, dictionary: bytes | None) -> None:
        """Write the header and the first (empty) commit into the empty file at ``_fd``."""
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
        self._committed_size = 0
        self._commit_now()

    def _open_existing(self, size: int, new_metadata: bool, alignment: int) -> None:
        compressed = is_compressed(os.pread(self._fd, 8, 0))
        if compressed:
            dictionary = _died_before_first_commit(self._fd, size)
            if dictionary is not None:  # nothing was ever committed: start it afresh
                side = _side_file(self.path, 0, os.pread(self._fd, size, 0))
                os.ftruncate(self._fd, 0)  # no reader can have opened it: it has no commit
                self._create(alignment, "zstd", dictionary or None)
                self.salvage = Salvage(0, 0, size, size, side)
                return
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
            self._commit_now()  # salvaged records become durable before anything new

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
        if self._inflight is not None and not self._foreign:
            self._settle_inflight()
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

    @_serialized
    def append(self, record: Sequence[Any] | Mapping[str, Any]) -> int:
        """Append one record: a list of values, or a dict naming them (``fields``; see
        ``evalue_store.fields``); returns its index. Visible after commit()."""
        self._check_open()
        values, fixed = self._record_values(record)  # a dict's values by the file's names
        chunks, length, crc = encode_record(values, self.alignment)
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
        self._record_appended(fixed)
        return self._commit.record_count + len(pending) // ENTRY_SIZE - 1

    @_serialized
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
        self._raw_value_count(struct.unpack_from("<I", payload)[0])  # as many as the names
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

    @_serialized
    def extend(self, records: Iterable[Sequence[Any]]) -> None:
        """Append every record of an iterable."""
        for record in records:
            self.append(record)

    @_serialized
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

    @_serialized
    def commit(self, force: bool = False) -> None:
        """Make every appended record durable and visible to readers.

        If this raises (an interrupt, a failed fsync), the commit either took effect as a
        whole or not at all; the writer then refuses to go on (reopen with mode="a"), and
        ``abort()``, as leaving a ``with`` block by the exception does, never cuts off a
        commit that took effect.
        """
        self._check_open()
        if self._pending or self._metadata_dirty or force:
            self._commit_now()

    def _commit_now(self) -> None:
        """The commit protocol (docs/FORMAT.md, "Commit protocol").

        fsync orders nothing within the writes it covers: after a power cut, any subset of
        the pages written since the last fsync may have reached the disk. So everything the
        footer points at (records, index segment, metadata) is fsynced before the footer is
        written; the footer is then written and fsynced on its own. A crash at any instant
        leaves either the new footer with all it points at, or no valid new footer.
        """
        pending = bytes(self._pending)
        segments = self._commit.segments
        if pending:
            kept, data, level = self._index_segments(pending)
            offset = self._block(data, granule=ENTRY_SIZE)
            segments = kept + (Segment(offset, len(data) // ENTRY_SIZE, crc32(data), level),)
        c = self._commit
        meta_off, meta_len, meta_crc = c.metadata_offset, c.metadata_length, c.metadata_crc
        if self._metadata_dirty:
            meta = self._metadata_bytes
            meta_off = self._block(meta) if meta else 0
            meta_len, meta_crc = len(meta), crc32(meta)
        self._sink.flush()
        self._sync()  # what the footer will point at is on disk before the footer is written
        footer_offset = self._align()
        count = c.record_count + len(pending) // ENTRY_SIZE
        commit = Commit(
            c.number + 1,
            count,
            footer_offset,
            0,
            c.footer_offset,
            meta_off,
            meta_len,
            meta_crc,
            segments,
        )
        footer = encode_footer(footer_offset, self.file_id, commit)
        self._block(footer)
        # From here until _adopt returns, an exception (a signal's, a failed write's) may
        # leave the commit visible to readers or not: _settle_inflight finds out which.
        self._inflight = replace(commit, end=footer_offset + len(footer))
        self._sink.end_commit(footer, self._sync)
        self._adopt(self._inflight)
        self._sync()

    def _sync(self) -> None:
        if self.durable:
            os.fsync(self._fd)

    def _adopt(self, commit: Commit) -> None:
        """Record ``commit`` as the last one. Idempotent, so that it can be redone when an
        interrupt cut it short; ``_inflight`` is cleared last."""
        offset, marker = self._sink.marker
        self._commit = commit
        self._committed_size = offset + len(marker)
        self._pending.clear()
        self._metadata_dirty = False
        self._inflight = None

    def _settle_inflight(self) -> bool | None:
        """After an exception inside the commit protocol: did the commit take effect?

        It did exactly when the bytes that make it visible to readers (the footer; for a
        compressed file, the seek table) are all in the file; it is then adopted, so that
        abort() keeps it. None: the file could not be read to tell.
        """
        marker = self._sink.marker
        visible: bool | None = False
        if marker is not None:
            offset, data = marker
            try:
                visible = os.pread(self._fd, len(data), offset) == bytes(data)
            except OSError:
                visible = None
        outcome = {True: "took effect", False: "did not take effect", None: "may have taken effect"}
        self._failed = (
            f"a commit was interrupted and {outcome[visible]}; reopen the file with mode='a' "
            "to go on"
        )
        if visible:
            self._adopt(self._inflight)
        elif visible is False:
            self._inflight = None
        return visible

    @_serialized
    def abort(self) -> None:
        """Discard the records appended since the last commit and release the file.

        The file is cut back to its last commit, so they do not come back as a salvageable
        tail. Leaving a ``with`` block by an exception aborts; leaving it normally commits.
        A commit that was interrupted but took effect is kept (see ``commit``).
        """
        if self._fd < 0:
            return
        try:
            if self._foreign:
                return  # a forked child's copy: the file is its parent's to cut
            if self._inflight is not None and self._settle_inflight() is None:
                return  # cannot tell where the last commit ends: cut nothing
            os.ftruncate(self._fd, self._committed_size)
        finally:
            self._release()

    @_serialized
    def close(self) -> None:
        """Commit and release the file (and its lock)."""
        if self._fd < 0:
            return
        if self._inflight is not None and not self._foreign:
            self._settle_inflight()
        if self._failed:
            reason = self._failed
            self.abort()
            raise ValueError(f"{self.path}: {reason}")
        try:
            self.commit()
        finally:
            self._release()

    def _release(self) -> None:
        """Close the descriptor, forgetting it first: an interrupt after close(2) must not
        leave a number that a later close would take from whoever reuses it."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            f"a Writer cannot be pickled or copied: it owns the lock and descriptor of "
            f"{self.path}; pass the path and open a Writer where it is needed"
        )

    def __del__(self) -> None:
        # A forgotten writer releases its descriptor but does not commit from a finalizer:
        # what it appended since its last commit is lost, so say so, as files do.
        if getattr(self, "_fd", -1) < 0:
            return
        if not self._foreign:
            lost = len(self._pending) // ENTRY_SIZE
            warnings.warn(
                f"{self.path}: Writer was never closed; {lost} records appended since its last "
                "commit are not committed (use `with evs.Writer(...)` or call close())",
                ResourceWarning,
                source=self,
                stacklevel=2,
            )
        self._release()


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
