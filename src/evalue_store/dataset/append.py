"""Appending and committing: the writes of ``Writer`` once its file is open.

``Appending`` is the part of ``Writer`` that writes: records (encoded, raw, columns), the
index segments and their merging, metadata, and the commit protocol with its recovery from
an interrupted commit. ``writer`` creates or opens the file, holds its lock and owns the
writer's lifecycle (abort, close, fork); it sets the state used here: ``_sink`` (the
physical variant's sink), ``_fd``, ``_commit``, ``_pending``, ``_checksum``, ``alignment``.
"""

from __future__ import annotations

import functools
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..codec import check_payload, encode_record, realign_payload, value_count
from ..container import (
    ENTRY,
    ENTRY_SIZE,
    FRAME,
    FRAME_MAGIC,
    FRAME_SIZE,
    Commit,
    Segment,
    encode_footer,
    valid_alignment,
)
from ..errors import ClosedError, EncodeError, UsageError
from ..metadata import encode_metadata
from .columns import append_columns
from .rows import extend_rows

MERGE_FANOUT = 4  # merge the newest index segments when this many share a level


def serialized(method: Any) -> Any:
    """Run a Writer method under the writer's lock: threads may share a Writer, and their
    appends and commits take turns instead of losing records."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._mutex:
            return method(self, *args, **kwargs)

    return locked


def check_alignment(alignment: int) -> None:
    if isinstance(alignment, bool) or not isinstance(alignment, numbers.Integral):
        raise TypeError(f"alignment must be an int, not {alignment!r}")
    if not valid_alignment(int(alignment)):
        raise UsageError(f"alignment must be a power of two in [8, 65536], not {alignment}")


class Appending:
    """Writes for ``Writer`` (a mixin: the state is the writer's)."""

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
        """After a record's write, or a commit's before its footer, failed part way (disk
        full, an interrupt): forget its bytes so that the next block starts where it did.
        Where that cannot be done, the writer refuses to go on, and close() keeps only the
        last commit."""
        try:
            undone = self._sink.rewind(offset)
        except OSError:
            undone = False
        if not undone:
            self._failed = (
                f"a write failed part way ({error!r}); the records appended since "
                "the last commit are lost: reopen the file with mode='a'"
            )

    def append(self, record: Sequence[Any] | Mapping[str, Any]) -> int:
        """Append one record: a list of values, or a dict naming them (``fields``; see
        ``evalue_store.fields``); returns its index. Visible after commit()."""
        with self._mutex:  # inline, not serialized: this is the per-record path
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
            pending = self._pending
            entries = len(pending)
            try:
                for chunk in chunks:
                    sink.write(chunk, len(chunk))  # bytearrays and 1-D uint8 arrays
                pending += ENTRY.pack(offset, length, crc, 0)  # the record is appended
                if fields is None:
                    self._record_appended(fixed, len(values))
                else:
                    fields.counts.add(len(values))
            except BaseException as exc:  # an interrupt lands anywhere: all or nothing
                del pending[entries:]
                self._undo_record(offset, exc)
                raise
            return self._commit.record_count + len(pending) // ENTRY_SIZE - 1

    @serialized
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
            check_alignment(alignment)
            payload = memoryview(realign_payload(payload, alignment, self.alignment))
        self._raw_value_count(value_count(payload))  # as many as the names
        length = len(payload)
        sink = self._sink
        offset = self._align()
        sink.begin_block(FRAME_SIZE + length)
        crc = self._checksum(payload)
        padding = -(FRAME_SIZE + length) & (self.alignment - 1)
        entries = len(self._pending)
        try:
            sink.write(FRAME.pack(FRAME_MAGIC, crc, length), FRAME_SIZE)
            sink.write(payload, length)
            sink.write(bytes(padding), padding)  # so that the next block starts aligned
            self._pending += ENTRY.pack(offset, length, crc, 0)
        except BaseException as exc:
            del self._pending[entries:]
            self._undo_record(offset, exc)
            raise
        return len(self) - 1

    @serialized
    def extend(self, records: Iterable[Sequence[Any]]) -> None:
        """Append every record of an iterable, as ``append`` would one by one. Runs of
        records of one structure are encoded together (``evalue_store.dataset.rows``), so
        the iterable is read up to a batch ahead of what has been written when an error
        stops it."""
        extend_rows(self, records)

    @serialized
    def extend_columns(self, columns: Mapping[Any, Any]) -> range:
        """Append N records given as columns, ``{field name or position: column}``: an
        array [N, ...] (a tensor per record), a 1-D int / float / bool array (an Int /
        Double / Bool per record) or a list of N values; see ``evalue_store.dataset.columns``.
        Returns the new records' indices. The file is byte for byte what appending the
        rows one by one writes; all N are appended or, on an error, none.
        """
        self._check_open()
        return append_columns(self, columns)

    @serialized
    def set_metadata(self, metadata: dict | None) -> None:
        """Replace the file's metadata at the next commit (None removes it)."""
        self._check_open()
        data = encode_metadata(metadata)
        before = self.__dict__.get("_user_metadata", b""), self.__dict__.get("_declared_names")
        self._metadata_bytes = data
        try:
            self._field_state()  # names it gives must fit the records
        except EncodeError:
            self.__dict__["_user_metadata"], self.__dict__["_declared_names"] = before
            raise
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

    @serialized
    def commit(self, force: bool = False) -> None:
        """Make every appended record durable and visible to readers.

        If this raises (an interrupt, a full disk, a failed fsync), the commit either took
        effect as a whole or not at all. One that took effect is kept, and the writer then
        refuses to go on (reopen with mode="a"); ``abort()``, as leaving a ``with`` block by
        the exception does, never cuts it off. One that did not is undone: its records stay
        appended, and the next ``commit()`` or ``close()`` tries again, except where its
        bytes cannot be cut (a compressed file's frames already written), when the writer
        refuses to go on and ``close()`` keeps the last commit.
        """
        self._check_open()
        if self._pending or self._metadata_dirty or force:
            self._commit_now()

    def _commit_now(self) -> None:
        """The commit protocol (docs/FORMAT.md §11 rule 1).

        fsync orders nothing within the writes it covers: after a power cut, any subset of
        the pages written since the last fsync may have reached the disk. So everything the
        footer points at (records, index segment, metadata) is fsynced before the footer is
        written; the footer is then written and fsynced on its own. A crash at any instant
        leaves either the new footer with all it points at, or no valid new footer.
        """
        start = self._sink.pos
        try:
            commit, footer = self._commit_blocks()
            self._sink.marker = None  # (the last commit's must not stand in: see below)
            self._inflight_from = start
            self._inflight = replace(commit, end=commit.footer_offset + len(footer))
        except BaseException as exc:
            if self._inflight is None:  # nothing is visible yet: the next try starts afresh
                self._undo_record(start, exc)  # (its blocks left in would be garbage
            raise  # between the records: attacker's B05)
        # From here until _adopt returns, an exception (a signal's, a failed write's) may
        # leave the commit visible to readers or not: _settle_inflight finds out which, from
        # the marker the sink sets before writing it.
        self._sink.end_commit(footer, self._sync)
        self._adopt(self._inflight)
        self._sync()

    def _commit_blocks(self) -> tuple[Commit, bytes]:
        """A commit's index segment and metadata, made durable, then its footer written
        into the sink: the commit and its footer."""
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
        return commit, footer

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
        compressed file, the index block) are all in the file; it is then adopted, so that
        abort() keeps it, and the writer refuses to go on. If it did not, a plain file's
        commit blocks are cut off and its records stay pending, for the next commit (the
        writer refuses to go on until that is done: an interrupt may land in between); a
        compressed file's frames were written, so the writer refuses to go on. None: the
        file could not be read to tell.
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
            if not self._sink.compressed and self._cut_back(self._inflight_from):
                self._failed = ""  # the next commit writes the blocks again (one store, last)
        return visible

    def _cut_back(self, pos: int) -> bool:
        """Forget the logical bytes from ``pos`` on (cut from the file): True if done."""
        try:
            return self._sink.rewind(pos)
        except OSError:
            return False
