"""The sequential reads of an open container: ``iter(ds)`` and slices of a compressed file.

Index entries are read SCAN_CHUNK at a time. A mapped plain file's records are read by
the compiled reader (``_native.Mapped``), a chunk per call; a compressed file's records of
one structure laid end to end are checked and decoded together (a run) from the frames
holding up to SCAN_SPAN bytes of consecutive records, decompressed at once.
An entry or a record that fails a check is read alone by ``_record``, so errors name their
record and the records before it are still yielded. ``Scans`` is a part of ``Records``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import bounded
from ..bounded import SHADOWED
from ..checksums import checksum_ranges
from ..container import ENTRY, ENTRY_DTYPE, ENTRY_SIZE, FRAME_SIZE
from ..errors import INDEX, ClosedError, FormatError
from .closing import closed_meanwhile
from .fields import to_dict

SCAN_CHUNK = 512  # index entries a scan decodes at a time
SCAN_SPAN = 1 << 20  # logical bytes of records a compressed scan decompresses at a time


class Scans:
    """The scans of ``Records`` (see the module's docstring)."""

    def __iter__(self) -> Iterator[list]:
        self._ensure_open()
        if self._fast is not None and not self.as_dict:
            return self._scan_mapped()  # (one generator less a record: the common scan)
        return self._scan()

    def _scan(self) -> Iterator[list]:
        """``iter(self)``: a close() is checked before each record, and an error a read
        raises because another thread closed the dataset is ClosedError (not wrapped by
        closing.reports_close: a generator around this one costs the scan a frame switch
        per record)."""
        try:
            if self._fast is not None:
                records = self._scan_mapped()
            elif self._source.compressed:
                records = self._by_spans(0, self._len, scan=True)
            else:
                records = self._scan_by_chunks()
            if self.as_dict:
                names = self._dict_names()
                records = (to_dict(r, names) for r in records)
            for record in records:
                yield record
                if self._source is None:  # closed during the scan: records handed out
                    raise ClosedError(f"{self.path}: dataset is closed")  # stay valid
        except Exception as exc:
            closed = closed_meanwhile(self, exc)  # another thread closed the dataset
            if closed is None:
                raise
            raise closed from exc

    def _shadow_check(self, chunk: np.ndarray, reach: int) -> tuple[int, int]:
        """(records of ``chunk`` before the first that overlaps an earlier one, new reach)."""
        masked, reach = bounded.shadowed(chunk, reach, self.header.data_start, self.commit.end)
        return (int(masked.argmax()) if masked.any() else len(chunk)), reach

    def _scan_mapped(self) -> Iterator[list]:
        """Every record of a plain mapped file, in order: a chunk of index entries at a time,
        its records decoded by one compiled call (``_native.Mapped``, as ``ds[i]`` reads
        them); each it cannot serve (a layout not yet learned, a failed check) is read by
        ``_record``, which learns the layout or says what is wrong."""
        first = reach = 0
        try:
            for seg in self._segments:
                entries = self._segment_array(seg)
                for lo in range(0, seg.count, SCAN_CHUNK):
                    chunk = entries[lo : lo + SCAN_CHUNK]
                    good, reach = self._shadow_check(chunk, reach)
                    records = self._fast.decode_entries(chunk[:good])
                    for i, values in enumerate(records, first + lo):
                        if self._source is None:  # closed: no record after it, even of
                            raise ClosedError(f"{self.path}: dataset is closed")  # a chunk
                        yield values if values is not None else self._record(i)
                    if good < len(chunk):
                        at, k = int(chunk[good]["offset"]), first + lo + good
                        raise FormatError(SHADOWED, at, self.path, record=k, code=INDEX)
                first += seg.count
        except Exception as exc:
            closed = closed_meanwhile(self, exc)  # another thread closed the dataset
            if closed is None:
                raise
            raise closed from exc

    def _runs(self, entries: np.ndarray) -> list[tuple[int, int]]:
        """[a, b) of each run of ``entries``: records of one payload length, each frame right
        after the one before (as a writer appends them), so their frames are a stride apart."""
        lengths, offsets = entries["length"], entries["offset"]
        step = lengths + (FRAME_SIZE + self.header.alignment - 1)
        step -= step % self.header.alignment
        joined = (lengths[1:] == lengths[:-1]) & (offsets[1:] == offsets[:-1] + step[:-1])
        bounds = [0, *(np.flatnonzero(~joined) + 1).tolist(), len(entries)]
        return list(zip(bounds[:-1], bounds[1:]))

    def _by_spans(self, start: int, stop: int, scan: bool = False) -> Iterator[list]:
        """Records [start, stop) in order, for a compressed source: index entries read
        SCAN_CHUNK at a time, and the frames holding up to SCAN_SPAN bytes of consecutive
        records decompressed at once into one buffer (``source.span``), from which each
        record is checked and decoded as ``_decode`` does (runs of one layout together, as
        in a mapped scan): lookups per span, not per record. Entries that fail a check,
        overlap an earlier record, or cannot be read, and the records of a span that cannot
        be read, are read one by one by ``_record``, so errors name their record and the
        records before them are still yielded. ``scan``: an overlapping record ends it
        (``__iter__``'s rule)."""
        reach = 0
        for seg, first in zip(self._segments, self._starts):
            lo, hi = max(start, first), min(stop, first + seg.count)
            for i in range(lo, hi, SCAN_CHUNK):
                count = min(SCAN_CHUNK, hi - i)
                try:
                    raw = self._source.read(
                        seg.offset + (i - first) * ENTRY_SIZE, count * ENTRY_SIZE
                    )
                except FormatError:
                    yield from (self._record(j) for j in range(i, i + count))
                    continue
                chunk = np.frombuffer(raw, ENTRY_DTYPE)
                shadowed, reach = bounded.shadowed(
                    chunk, reach, self.header.data_start, self.commit.end
                )
                cut = int(shadowed.argmax()) if scan and shadowed.any() else count
                sound = self._sound(chunk) & ~shadowed
                flips = np.flatnonzero(np.diff(sound[:cut].astype(np.int8))) + 1
                bounds = [0, *flips.tolist(), cut]
                for a, b in zip(bounds[:-1], bounds[1:]):
                    if a < b and sound[a]:
                        yield from self._spans(i + a, chunk[a:b])
                    else:
                        yield from (self._record(j) for j in range(i + a, i + b))
                if cut < count:
                    at = int(chunk[cut]["offset"])
                    raise FormatError(SHADOWED, at, self.path, record=i + cut, code=INDEX)

    def _sound(self, entries: np.ndarray) -> np.ndarray:
        """Which ``entries`` pass the checks ``_read`` makes of an entry (and have no
        reserved bits set)."""
        offsets = entries["offset"].astype(np.int64)  # (past 2**63: negative, so refused)
        lengths = entries["length"].astype(np.int64)
        ok = (entries["reserved"] == 0) & (offsets % self.header.alignment == 0)
        ok &= (offsets >= self.header.data_start) & (
            lengths <= self.commit.end - offsets - FRAME_SIZE
        )
        if self.max_record_bytes is not None:
            ok &= lengths <= self.max_record_bytes
        return ok

    def _spans(self, first: int, entries: np.ndarray) -> Iterator[list]:
        """Records ``first``... of ``entries`` (sound, in file order, none overlapping), read
        a span of up to SCAN_SPAN bytes at a time."""
        starts = entries["offset"].astype(np.int64)
        ends = starts + FRAME_SIZE + entries["length"].astype(np.int64)
        a = 0
        while a < len(entries):
            b = max(a + 1, int(np.searchsorted(ends, starts[a] + SCAN_SPAN, side="right")))
            lo, hi = int(starts[a]), int(ends[b - 1])
            try:
                buf, pos = self._source.span(lo, hi - lo)
            except FormatError:  # one by one: the error names the record a bad frame holds
                yield from (self._record(j) for j in range(first + a, first + b))
            else:
                yield from self._decode_span(first + a, entries[a:b], buf, pos - lo)
            a = b

    def _decode_span(self, first: int, entries: np.ndarray, buf: Any, shift: int) -> Iterator[list]:
        """The records of ``entries`` (checked, in file order) from ``buf``, which holds
        logical byte x at ``x + shift``."""
        lengths, offsets, crcs = entries["length"], entries["offset"], entries["crc"]
        for a, b in self._runs(entries):
            i = first + a
            while a < b and int(lengths[a]) not in self._layouts:  # how one is learned
                offset, length = int(offsets[a]), int(lengths[a])
                yield self._decode(i, buf, offset + shift, offset, length, int(crcs[a]))
                i, a = i + 1, a + 1
            run = self._scan_run(entries[a:b], buf, shift) if a < b else ([], [])
            for k, values in enumerate(run[0] if run is not None else [None] * (b - a)):
                if values is None:  # read by itself: it is, or it says what is wrong
                    offset, length = int(offsets[a + k]), int(lengths[a + k])
                    values = self._decode(
                        i + k, buf, offset + shift, offset, length, int(crcs[a + k])
                    )
                yield values

    def _scan_by_chunks(self) -> Iterator[list]:
        """Every record in order, for a pread source: index entries are read
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
                        raise FormatError(SHADOWED, offset, self.path, record=i, code=INDEX)
                    yield self._record(i) if reserved else self._read(i, offset, length, crc)
            first += seg.count

    def _scan_run(
        self, entries: np.ndarray, buf: Any, shift: int = 0
    ) -> tuple[list, list[int]] | None:
        """The records of a run (one payload length whose layout is known, frames laid end to
        end from the first entry's offset) decoded together from ``buf`` (which holds logical
        byte x at ``x + shift``), and the positions among them of the ones to read one by
        one (None in the list): a record whose structure differs, or whose checksum or frame
        header does not match. None if the run cannot be decoded together (a damaged index:
        each record is then read by itself, which reports it)."""
        offset, length, _, _ = entries[0].tolist()
        count = len(entries)
        layout = self._layouts.get(length)
        align = self.header.alignment
        stride = (FRAME_SIZE + length + align - 1) // align * align
        if (
            layout is None
            or entries["reserved"].any()
            or offset % align
            or offset < self.header.data_start
            or offset + (count - 1) * stride + FRAME_SIZE + length > self.commit.end
        ):
            return None
        crcs = entries["crc"]
        try:
            records, bad = layout.decode_run(buf, offset + shift, stride, count, crcs)
        except ValueError:  # numpy cannot stack the run (0 elements, a dim near 2**63)
            return None
        if self._crc_on_read:
            at = offset + shift + FRAME_SIZE
            starts = np.arange(at, at + count * stride, stride, dtype=np.int64)
            sums = checksum_ranges(self._checksum, buf, starts, length)
            if not (sums == crcs).all():
                wrong = np.flatnonzero(sums != crcs).tolist()
                for j in wrong:
                    records[j] = None
                bad = sorted({*bad, *wrong})
        return records, bad
