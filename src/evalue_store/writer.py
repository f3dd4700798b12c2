"""Writer: appends records to a container and commits them (docs/FORMAT.md, "Commit protocol")."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import numbers
import os
import stat
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from . import __version__, remote
from .codec import check_payload, encode_record, realign_payload, value_count
from .columns import append_columns
from .container import (
    DEFAULT_ALIGNMENT,
    DEFAULT_VERSION,
    ENTRY,
    ENTRY_SIZE,
    FRAME,
    FRAME_MAGIC,
    FRAME_SIZE,
    MAX_METADATA,
    Commit,
    Segment,
    checksum_function,
    double_int,
    empty_commit,
    encode_footer,
    encode_header,
    new_file_id,
    valid_alignment,
    version_flags,
)
from .errors import ClosedError, EncodeError, FormatError
from .fields import WriterFields
from .files import (
    create_temp,
    fsync_dir,
    link_new,
    new_file_mode,
    open_locked,
    replace_locked,
    unlock,
)
from .physical import Restart, new_sink, open_for_append
from .salvage import Salvage, side_file
from .zframe import DEFAULT_LEVEL
from .zstd import DEFAULT_FRAME_SIZE, MAX_FRAME_SIZE

MERGE_FANOUT = 4  # merge the newest index segments when this many share a level
MIN_FRAME_SIZE = 256  # below this, per-frame overhead outweighs the record; 1 record per frame


def _encode_metadata(metadata: dict | None) -> bytes:
    if metadata is None:
        return b""
    if not isinstance(metadata, dict):
        raise EncodeError("metadata must be a dict of JSON values")
    try:
        data = json.dumps(metadata, ensure_ascii=False, allow_nan=False).encode("utf-8")
        json.loads(data, parse_int=double_int)  # as a reader will: no integer beyond a double
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"metadata is not JSON-serializable: {exc}") from None
    except RecursionError:
        raise EncodeError("metadata is nested too deeply to be stored as JSON") from None
    if len(data) > MAX_METADATA:
        raise EncodeError(f"metadata is {len(data)} bytes; the limit is {MAX_METADATA}")
    return data


_LIVE_WRITERS: weakref.WeakSet = weakref.WeakSet()


def _disown_writers() -> None:
    """In a forked child, writers inherited from the parent share its descriptor and lock:
    using one would interleave the two processes' bytes. They refuse to, and closing or
    collecting them leaves the parent's file alone. The child's copy of the descriptor is
    closed at once: the lock goes only with the last descriptor of the open file, so a child
    that keeps it would hold the file locked after the parent closed its writer."""
    for writer in list(_LIVE_WRITERS):
        writer._foreign = True
        writer._release()
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


def _check_alignment(alignment: int) -> None:
    if isinstance(alignment, bool) or not isinstance(alignment, numbers.Integral):
        raise TypeError(f"alignment must be an int, not {alignment!r}")
    if not valid_alignment(int(alignment)):
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

    ``format_version``: "1.1" (default; CRC-32C checksums) or "1.0" (zlib's CRC-32, for
    readers that predate 1.1), for a new file; appending keeps the file's own version,
    which ``format_version`` then names.
    """

    def __new__(cls, path: str | os.PathLike = "", *args: Any, **kwargs: Any) -> Writer:
        # A URL or a filesystem: the remote writer (stages locally, uploads on close).
        if cls is Writer and (remote.is_url(path) or kwargs.get("filesystem") is not None):
            from .remote_shards import RemoteWriter

            return super().__new__(RemoteWriter)
        return super().__new__(cls)

    def __init__(
        self,
        path: str | os.PathLike,
        mode: str = "w",
        *,
        metadata: dict | None = None,
        alignment: int = DEFAULT_ALIGNMENT,
        durable: bool = True,
        compression: str | None = None,
        level: int = DEFAULT_LEVEL,
        frame_size: int = DEFAULT_FRAME_SIZE,
        dictionary: bytes | None = None,
        format_version: str = DEFAULT_VERSION,
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
        self._new_flags = version_flags(format_version)
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
        if mode == "x" and os.path.lexists(self.path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), self.path)
        if not os.path.lexists(self.path):
            if self._create_new(alignment, compression, dictionary):
                return
            if mode == "x":  # another process created it meanwhile
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), self.path)
            if mode == "w":
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

    def _create_new(
        self, alignment: int, compression: str | None, dictionary: bytes | None
    ) -> bool:
        """A new file: built as a temporary file holding its header and first commit, then
        linked to its name, so that no reader ever finds it without them. False (and nothing
        changed) if a file took the name meanwhile."""
        try:
            self._fd, temp = create_temp(self.path, new_file_mode())
        except OSError as exc:  # name the file asked for, not the temporary one
            raise type(exc)(exc.errno, exc.strerror, self.path) from None
        try:
            self._create(alignment, compression, dictionary)
            linked = link_new(temp, self.path)
        except BaseException:
            self._release()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        if not linked:
            self._release()
            os.unlink(temp)
            return False
        if self.durable:
            fsync_dir(self.path)
        return True

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
        self._use_flags(self._new_flags)
        info = f"evalue_store {__version__}"
        header = encode_header(alignment, self.file_id, time.time_ns(), info, self._new_flags)
        self._sink: Any = new_sink(self._fd, compression, dictionary, **self._zstd)
        self._commit = empty_commit(len(header))
        self._sink.write(header, len(header))
        self._metadata_dirty = True
        self._committed_size = 0
        self._commit_now()

    def _open_existing(self, size: int, new_metadata: bool, alignment: int) -> None:
        state = open_for_append(self._fd, size, self.path)
        if isinstance(state, Restart):  # nothing was ever committed: start it afresh
            side = side_file(self.path, self._fd, 0, size)
            os.ftruncate(self._fd, 0)  # no reader can have opened it: it has no commit
            self._create(alignment, "zstd", state.dictionary)
            self.salvage = Salvage(0, 0, size, size, side)
            return
        if state.commit.number >= (1 << 64) - 1:  # a footer's u64 counter cannot go on
            reason = "commit number is at its 64-bit maximum: cannot commit again"
            raise FormatError(reason, state.commit.footer_offset)
        self.alignment = state.header.alignment
        self.file_id = state.header.file_id
        self._use_flags(state.header.flags)  # an append keeps the file's version
        self._commit = state.commit
        self._metadata_dirty = new_metadata
        self.salvage = state.salvage
        self._committed_size = state.keep
        if state.keep < size:
            os.ftruncate(self._fd, state.keep)
        self._sink = state.sink(self._fd, **self._zstd)
        for offset, length, crc in state.found:
            self._pending += ENTRY.pack(offset, length, crc, 0)
        if state.found or self._commit.number == 0:
            self._commit_now()  # salvaged records become durable before anything new

    def _use_flags(self, flags: int) -> None:
        self._checksum = checksum_function(flags)  # every checksum this writer computes
        self.format_version = "1.1" if flags else "1.0"

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
        if self._foreign:
            raise ClosedError(f"{self.path}: {self._failed}")
        if self._fd < 0:
            raise ClosedError(f"{self.path}: writer is closed")
        if self._inflight is not None and not self._foreign:
            self._settle_inflight()
        if self._failed:
            raise ClosedError(f"{self.path}: {self._failed}")

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

    def append(self, record: Sequence[Any] | Mapping[str, Any]) -> int:
        """Append one record: a list of values, or a dict naming them (``fields``; see
        ``evalue_store.fields``); returns its index. Visible after commit()."""
        with self._mutex:  # inline, not _serialized: this is the per-record path
            if self._fd < 0 or self._inflight is not None or self._failed:
                self._check_open()
            fields = self.__dict__.get("_fields")
            cls = type(record)
            if (
                fields is not None
                and fields.positional
                and fields.names is None
                and (cls is list or cls is tuple)
            ):
                values, fixed = record, None  # lists into an unnamed file: nothing to check
            else:
                values, fixed = self._record_values(record)  # a dict's values by the names
                fields = None
            chunks, length, crc = encode_record(values, self.alignment, self._checksum)
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
            if fields is None:
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
        self._raw_value_count(value_count(payload))  # as many as the names
        length = len(payload)
        sink = self._sink
        offset = self._align()
        sink.begin_block(FRAME_SIZE + length)
        crc = self._checksum(payload)
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
    def extend_columns(self, columns: Mapping[Any, Any]) -> range:
        """Append N records given as columns, ``{field name or position: column}``: an
        array [N, ...] (a tensor per record), a 1-D int / float / bool array (an Int /
        Double / Bool per record) or a list of N values; see ``evalue_store.columns``.
        Returns the new records' indices. The file is byte for byte what appending the
        rows one by one writes; all N are appended or, on an error, none.
        """
        self._check_open()
        return append_columns(self, columns)

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
            entry = Segment(offset, len(data) // ENTRY_SIZE, self._checksum(data), level)
            segments = kept + (entry,)
        c = self._commit
        meta_off, meta_len, meta_crc = c.metadata_offset, c.metadata_length, c.metadata_crc
        if self._metadata_dirty:
            meta = self._metadata_bytes
            meta_off = self._block(meta) if meta else 0
            meta_len, meta_crc = len(meta), self._checksum(meta)
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
        footer = encode_footer(footer_offset, self.file_id, commit, self._checksum)
        self._block(footer)
        # From here until _adopt returns, an exception (a signal's, a failed write's) may
        # leave the commit visible to readers or not: _settle_inflight finds out which, from
        # the marker the sink sets before writing it (the last commit's must not stand in).
        self._sink.marker = None
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
            raise ClosedError(f"{self.path}: {reason}")
        try:
            self.commit()
        finally:
            self._release()

    def _release(self) -> None:
        """Close the descriptor, forgetting it first: an interrupt after close(2) must not
        leave a number that a later close would take from whoever reuses it."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                if not self._foreign:  # a forked child that has not yet closed its copy of
                    unlock(fd)  # the descriptor would keep the lock; a child never unlocks
            finally:
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
