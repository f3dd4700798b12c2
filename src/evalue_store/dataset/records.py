"""Reading the records of an open container: index lookups, one record's checks and decoding,
and batched reads (the sequential scan: ``scans``).

``Records`` is the part of ``Dataset`` that reads; ``reader`` opens the file, owns its
lifecycle (refresh, close, pickling) and the attributes used here: ``_source`` (the physical
variant's source), ``header``, ``commit``, ``_segments`` / ``_starts`` (the index),
``_checksum``, ``_crc_on_read``, ``_offsets_in`` and the layout caches.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import bounded
from ..codec import compile_layout, decode_payload
from ..container import ENTRY, ENTRY_DTYPE, ENTRY_SIZE, FRAME_SIZE, check_frame
from ..errors import CHECKSUM, INDEX, LIMIT, OUT_OF_BOUNDS, FormatError
from . import batch, indexing
from .batch import Batch, Out
from .closing import closed_meanwhile, reports_close
from .fields import to_dict
from .indexing import Index
from .scans import Scans

ENTRY_UNPACK = ENTRY.unpack_from
MAX_LAYOUTS = 1024  # record structures remembered per reader (bounded: lengths may all differ)


class Records(Scans):
    """Record access for ``Dataset`` (a mixin: the state is the dataset's)."""

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
            reason = "index entry has reserved bits set"
            raise FormatError(reason, at, self.path, record=i, code=INDEX)
        return offset, length, crc

    @reports_close
    def entries(self) -> np.ndarray:
        """The whole index as one structured array (offset, length, crc, reserved).

        Each segment is a zero-copy view; with several segments they are concatenated.
        """
        self._ensure_open()
        parts = [self._segment_array(seg) for seg in self._segments]
        if not parts:
            return np.zeros(0, ENTRY_DTYPE)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @reports_close
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
        try:
            entry = self._entry(i)
        except FormatError as exc:  # of the source's own layer: placed, its offset kept
            raise exc.at(path=self.path, record=i) from None
        return self._read(i, *entry)

    def _check_entry(self, i: int, offset: int, length: int) -> None:
        place = dict(path=self.path, record=i, offset_in=self._offsets_in)
        if offset % self.header.alignment or offset < self.header.data_start:
            raise FormatError(f"bad offset {offset}", offset, code=OUT_OF_BOUNDS, **place)
        if length > self.commit.end - offset - FRAME_SIZE:
            raise FormatError("runs past the committed end", offset, code=OUT_OF_BOUNDS, **place)
        if self.max_record_bytes is not None and length > self.max_record_bytes:
            reason = f"{length} bytes, over max_record_bytes={self.max_record_bytes}"
            raise FormatError(reason, offset, code=LIMIT, **place)

    @reports_close
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

    def _read(
        self, i: int, offset: int, length: int, crc: int, checked: bool = False, frame: Any = None
    ) -> list:
        """Record ``i`` given its index entry (``checked``: its checksum was verified;
        ``frame``: reads its bytes instead of the source's ``frame``)."""
        align = self.header.alignment
        limit = self.max_record_bytes
        if (
            offset % align
            or offset < self.header.data_start
            or length > self.commit.end - offset - FRAME_SIZE
            or (limit is not None and length > limit)
        ):
            self._check_entry(i, offset, length)  # raises, saying which rule failed
        try:
            buf, pos = (frame or self._source.frame)(offset, FRAME_SIZE + length)
        except FormatError as exc:  # a compressed file's frames, a remote object
            raise exc.at(path=self.path, record=i) from None
        return self._decode(i, buf, pos, offset, length, crc, checked)

    def _decode(
        self, i: int, buf: Any, pos: int, offset: int, length: int, crc: int, checked: bool = False
    ) -> list:
        """Record ``i``'s values from its frame at ``buf[pos]`` (its entry checked)."""
        align = self.header.alignment
        try:
            if self._crc_on_read and not checked:
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
            for fast in (self._fast, self._fast_frames):
                if fast is not None:
                    fast.clear()
        self._layouts[length] = layout
        self._teach(length, layout)

    def _teach(self, length: int, layout: Any) -> None:
        """Give the compiled readers (``reader._bind_fast``) the layout of records of
        ``length`` payload bytes, when they can decode them (a mapping's 0-d tensors cannot
        be rows: ``Layout.decode`` reads those)."""
        if layout is None:
            return
        try:
            if self._fast is not None:
                spec = layout.native(self._source.mapped, self._source.typed)
                if spec is not None:
                    self._fast.add(length, *spec)
            if self._fast_frames is not None:
                self._fast_frames.add(length, *layout.native(None, None))
        except ValueError:  # a shape they cannot hold (0 elements, a dim near 2**63): the
            pass  # records are read by ``decode``, which can

    def __getitem__(self, index: Index) -> Any:
        """One record for an integer; a list of records for a slice, an integer array or a
        boolean mask (numpy's rules, see ``evalue_store.dataset.indexing``). Once another
        thread has closed the dataset, any error of a read under way is ClosedError."""
        try:  # (free in Python 3.11 until something raises)
            fast_get = self._fast_get
            if fast_get is not None and type(index) is int:
                # A record with a learned layout, of a plain mapped file or in a compressed
                # file's frame found through its locator: all of ``_record`` in one compiled
                # call (_native_mapped.cc), which answers None for any record it cannot
                # serve (a check fails, the layout is not known): the paths below read it.
                record = fast_get(index)
                if record is not None:
                    return to_dict(record, self._dict_names()) if self.as_dict else record
            return self._get(index)
        except Exception as exc:
            closed = closed_meanwhile(self, exc)  # another thread closed the dataset
            if closed is None:
                raise
            raise closed from exc

    def _get(self, index: Index) -> Any:
        """``self[index]`` when the compiled reader did not serve it."""
        mapped = self._mapped
        if mapped is not None and type(index) is int:
            # A plain mapped file: ``_record`` with its layers inlined (the per-record path;
            # no closure in this function, so ``self`` stays a plain local). A record that
            # fails a check, or has no layout yet, goes through ``_read``, which says what
            # is wrong.
            view, typed, first, mask, start, reach, crc_on, checksum, layouts, n = mapped
            if -n <= index < n:
                i = index + n if index < 0 else index
                at = first + i * ENTRY_SIZE if first >= 0 else self._entry_at(i)
                offset, length, crc, reserved = ENTRY_UNPACK(view, at)
                limit = self.max_record_bytes
                if (
                    reserved
                    or offset & mask
                    or offset < start
                    or length > reach - offset
                    or (limit is not None and length > limit)
                ):
                    record = self._record(i)  # raises, saying which rule failed
                elif (
                    crc_on
                    and checksum(view[offset + FRAME_SIZE : offset + FRAME_SIZE + length]) != crc
                ):
                    record = self._read(i, offset, length, crc)  # raises
                else:
                    try:
                        layout = layouts[length]
                    except KeyError:  # not learned yet
                        layout = None
                    record = None if layout is None else layout.decode(view, offset, crc, typed)
                    if record is None:
                        record = self._read(i, offset, length, crc, checked=True)
                return to_dict(record, self._dict_names()) if self.as_dict else record
        located = self._located
        if located is not None and type(index) is int:
            # A compressed file: the source finds the record's frame through its locator
            # (one group, one frame); the entry checks of ``_read`` inlined. A record it does
            # not find, or that fails a check, goes through ``_record``, which says why.
            n = self._len
            if -n <= index < n:
                record = self._from_locator(index + n if index < 0 else index)
                return to_dict(record, self._dict_names()) if self.as_dict else record
        return self._index(index)

    def _from_locator(self, i: int) -> list:
        """Record ``i`` of a compressed file, whose source finds its frame through its
        locator (one group, one frame); the entry checks of ``_read`` inlined. A record it
        does not find, or that fails a check, goes through ``_record``, which says why."""
        found = self._located(i)
        if found is None:
            return self._record(i)
        buf, pos, offset, length, crc, _, _ = found
        frames = self._fast_frames
        record = None if frames is None else frames.decode_frame(buf, pos, offset, length, crc)
        if record is not None:  # else the checks below say why, or the layout is learned
            return record
        limit = self.max_record_bytes
        if (
            offset % self.header.alignment
            or offset < self.header.data_start
            or length > self.commit.end - offset - FRAME_SIZE
            or (limit is not None and length > limit)
        ):
            return self._record(i)  # raises
        layout = self._layouts.get(length)
        record = None if layout is None else layout.decode(buf, pos, crc)
        if record is None:
            record = self._decode(i, buf, pos, offset, length, crc)
        return record

    def _index(self, index: Index) -> Any:
        """``self[index]`` for any index and source."""
        self._ensure_open()
        where = indexing.normalize(index, self._len)
        if isinstance(where, int):
            record = self._record(where)
            return to_dict(record, self._dict_names()) if self.as_dict else record
        if isinstance(where, range):
            if self._source.compressed and where.step == 1:
                records = list(self._by_spans(where.start, where.stop))
            else:
                records = [self._record(i) for i in where]
        else:
            records = self._get_positions(where.tolist())
        return self._named(records) if self.as_dict else records

    @reports_close
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
        never views of the file. See ``evalue_store.dataset.batch``.
        """
        return batch.get_batch(self, indices, out)

    @reports_close
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
        get = self._fast_get
        if get is not None:  # the compiled reader, as ds[i] reads, in file order (so a
            result: list = [None] * len(wanted)  # compressed file's frame shared by
            for i, k in wanted:  # several records is decompressed once while cached)
                values = get(i)
                if values is None:  # the Python reader reads it, or says what is wrong
                    values = list(self[i].values()) if self.as_dict else self[i]
                result[k] = values
            return result
        if self._located is not None:  # compressed, without the compiled reader
            result = [None] * len(wanted)
            for i, k in wanted:
                result[k] = self._from_locator(i)
            return result
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
