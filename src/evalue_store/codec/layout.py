"""Layouts: the decoder (and columnar encoder) for records that share one structure.

Most datasets repeat one record structure (same kinds, dtypes, shapes, string lengths).
A Layout captures that structure as one struct format covering the whole frame, so a
record is checked and unpacked by a single C call instead of a Python walk per value.
Records of one structure that a writer appended one after another sit at a fixed stride,
so a run of them is also checked and decoded column by column with numpy (decode_run).
A record whose structural fields differ from the layout's is decoded by decode_payload.

A layout is compiled by walking an accepted record with each value's codec ``step``
(kinds.py): the grammar is not restated here.
"""

from __future__ import annotations

import operator
import struct
from typing import Any

import numpy as np

from ..container import FRAME_CRC_AT, FRAME_LENGTH_AT, FRAME_SIZE
from . import grammar as g
from .kinds import CODECS, S_BOOL, S_BYTES, S_SCALAR, S_TENSOR, S_TEXT, Slot

_CRC_FIELD = 1  # the layout's fields start with FRAME's magic and crc (Compiler)


class Layout:
    """The decoder for one record structure; built by ``compile_layout``.

    ``slots`` holds one Slot per value. ``check_at`` are the frame offsets of the
    structural bytes (everything but the checksum, scalar values, string contents and
    tensor data), ``check_bytes`` their values; ``frame`` is the whole sample frame. The
    struct unpacks each run of structural bytes as one bytes field, so that checking a
    record's structure compares a few byte strings.
    """

    __slots__ = (
        "unpack",
        "structure",
        "expected",
        "slots",
        "steps",
        "size",
        "length",
        "check_at",
        "check_bytes",
        "frame",
        "plan",
        "alignment",
    )

    def __init__(
        self,
        fmt: str,
        structural: list[int],
        slots: list[Slot],
        check_at: list[int],
        frame: np.ndarray,
        alignment: int,
    ):
        layout = struct.Struct(fmt)
        self.unpack = layout.unpack_from
        self.size = layout.size  # the whole frame
        self.length = self.size - FRAME_SIZE  # the payload
        self.structure = operator.itemgetter(*structural)
        self.expected = self.structure(layout.unpack(frame.tobytes()))  # the sample's own
        self.slots = [tuple(slot) for slot in slots]  # unpacked fastest as plain tuples
        self.steps = [_step(slot, alignment) for slot in self.slots]
        self.check_at = np.array(check_at, np.intp)
        self.check_bytes = frame[self.check_at]
        self.frame = frame
        self.plan: Any = None  # its _native.BatchPlan, made by the first batch of this layout
        self.alignment = alignment  # of the file: frames and tensor data start at multiples

    def decode(self, buf: Any, frame: int, crc: int, typed: dict | None = None) -> list | None:
        """The record's values, or None when this record does not have this layout.

        ``typed`` (optional, with a ``frame`` at a multiple of the alignment): a dict kept
        with ``buf`` (a whole mapping), which is filled with arrays viewing all of ``buf``,
        one per tensor spec, whose rows start at every multiple of the alignment: a tensor
        is then one row, cheaper to index than a new view of ``buf`` is to make (and
        reshape).
        """
        unpack, structure = self.unpack, self.structure  # (attributes, not methods)
        fields = unpack(buf, frame)
        if fields[_CRC_FIELD] != crc or structure(fields) != self.expected:
            return None
        values = []
        for kind, index, at, detail in self.steps:
            if kind == S_TENSOR:  # index: its rows' key in typed ("" if it has none)
                if index and typed is not None:
                    try:
                        rows = typed[index]
                    except KeyError:
                        rows = typed[index] = _rows(buf, detail, self.alignment, at)
                    if rows is not None:
                        values.append(rows[(frame + at) // self.alignment])
                        continue
                dtype, shape, strides, nbytes, numel = detail
                if numel is None:  # a dim order
                    data = g.region(buf, frame + at, nbytes)
                    values.append(np.ndarray(shape, dtype, buffer=data, strides=strides))
                else:
                    array = np.frombuffer(buf, dtype, numel, frame + at)
                    values.append(array if len(shape) == 1 else array.reshape(shape))
            elif kind == S_SCALAR:
                values.append(fields[index])
            elif kind == S_TEXT:
                try:
                    values.append(fields[index].decode())  # UTF-8, strict
                except UnicodeDecodeError:
                    return None  # the generic decoder reports it with its offset
            elif kind == S_BYTES:
                values.append(fields[index])
            elif kind == S_BOOL:
                if fields[index] > 1:
                    return None
                values.append(fields[index] == 1)
            else:
                values.append(None)
        return values

    def runs(self) -> list[tuple[int, bytes]]:
        """The structure bytes as (frame offset, bytes) runs, for the compiled readers."""
        where = self.check_at.tolist()
        cuts = [0, *(k for k in range(1, len(where)) if where[k] != where[k - 1] + 1), len(where)]
        expected = self.check_bytes.tobytes()
        return [(where[a], expected[a:b]) for a, b in zip(cuts[:-1], cuts[1:]) if a < b]

    def native(self, buf: Any, typed: dict | None) -> tuple[list, list] | None:
        """(runs, steps) describing this layout to ``_native.Mapped.add``: the structure
        bytes as (frame offset, bytes) runs, and per value (kind, frame offset, detail: a
        scalar's type code, a string's length, a tensor's rows or how to make it).

        For records in ``buf``, a whole mapping (``typed`` as ``decode`` takes it), a
        tensor is a row; None when a value has no rows (a 0-d tensor): ``decode`` reads
        those records. With ``typed`` None (decompressed frames), a tensor is made as
        ``decode`` makes it: (how: 0 flat, 1 reshaped, 2 strided; dtype; count, or bytes
        if strided; shape; strides or None)."""
        runs = self.runs()
        steps: list[tuple] = []
        for kind, index, at, detail in self.steps:
            if kind == S_TENSOR and typed is None:
                dtype, shape, strides, nbytes, numel = detail
                if numel is None:
                    steps.append((kind, at, (2, dtype, nbytes, shape, strides)))
                else:
                    steps.append((kind, at, (int(len(shape) != 1), dtype, numel, shape, None)))
            elif kind == S_TENSOR:
                if not index:
                    return None
                if index not in typed:
                    typed[index] = _rows(buf, detail, self.alignment, at)
                if typed[index] is None:
                    return None
                steps.append((kind, at, typed[index]))
            elif kind == S_SCALAR:
                steps.append((kind, at, detail.char))
            elif kind in (S_TEXT, S_BYTES):
                steps.append((kind, at, detail))
            else:
                steps.append((kind, at, None))
        return runs, steps

    def decode_run(
        self, buf: Any, start: int, stride: int, count: int, crcs: np.ndarray
    ) -> tuple[list[list | None], list[int]]:
        """The values of the ``count`` records whose frames start at ``start + k * stride``,
        and the positions of the Nones among them.

        The frames must lie inside ``buf``. ``crcs`` are the checksums the index gives them.
        A record that does not have this layout, or whose frame header disagrees with its
        checksum, is None in the result: the generic decoder reads or rejects it.
        """

        data = g.region(buf, start, (count - 1) * stride + self.size)

        def column(dtype: Any, at: int, shape: tuple = (), strides: tuple = ()) -> np.ndarray:
            return np.ndarray(
                (count, *shape), dtype, buffer=data, offset=at, strides=(stride, *strides)
            )

        frames = column(np.uint8, 0, (self.size,), (1,))
        good = (frames[:, self.check_at] == self.check_bytes).all(axis=1)
        good &= column("<u4", FRAME_CRC_AT) == crcs
        columns: list[list] = []
        for kind, _, at, detail in self.slots:
            if kind == S_TENSOR:
                dtype, shape, strides, _, _ = detail
                run = column(dtype, at, shape, strides)
                columns.append(list(run) if shape else [run[k, ...] for k in range(count)])
            elif kind == S_SCALAR:
                columns.append(column(detail, at).tolist())
            elif kind in (S_TEXT, S_BYTES):
                raw = column(f"V{detail}", at).tolist()
                if kind == S_TEXT:
                    try:
                        raw = [text.decode("utf-8") for text in raw]
                    except UnicodeDecodeError:  # some record's: those are None
                        raw = [_utf8_or_none(text) for text in raw]
                        good &= np.array([text is not None for text in raw], bool)
                columns.append(raw)
            elif kind == S_BOOL:
                byte = column(np.uint8, at)
                good &= byte <= 1
                columns.append((byte == 1).tolist())
            else:
                columns.append([None] * count)
        records: list[list | None] = (
            [list(values) for values in zip(*columns)] if columns else [[] for _ in range(count)]
        )
        bad = np.flatnonzero(~good).tolist()
        for k in bad:
            records[k] = None
        return records, bad


def _step(slot: tuple, alignment: int) -> tuple:
    """A slot as ``decode`` uses it: a tensor's index (unused by the slot) becomes the key
    of its rows in a ``typed`` dict: its spec and where, modulo the alignment, its data
    starts; "" for a 0-d tensor, which a row cannot give (indexing gives a scalar)."""
    kind, index, at, detail = slot
    if kind != S_TENSOR:
        return slot
    dtype, shape, strides, _, _ = detail
    key = repr((dtype, shape, strides, at % alignment)) if shape else ""
    return kind, key, at, detail


def _rows(buf: Any, detail: tuple, alignment: int, at: int) -> np.ndarray | None:
    """All of ``buf`` as tensors of ``detail``'s spec, one starting at each multiple of
    ``alignment`` plus ``at % alignment``: row k is the tensor whose data starts at byte
    k * alignment + at % alignment. Rows overlap; numpy checks that the last fits. None
    when numpy cannot make such an array (an empty tensor with a dimension near 2**63:
    its rows' sizes overflow), whose tensors are then made one by one."""
    dtype, shape, strides, nbytes, _ = detail
    first = at % alignment
    count = (len(buf) - first - nbytes) // alignment + 1
    data = g.region(buf, first, len(buf) - first)  # (holds the mapping open: see region)
    try:
        return np.ndarray((count, *shape), dtype, data, 0, (alignment, *strides))
    except ValueError:
        return None


def _utf8_or_none(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class Compiler:
    """Collects a layout's struct fields while the value codecs step through a record.

    Consecutive structure fields after the frame header are unpacked as one bytes field:
    ``structural`` lists the indices of the fields that every record of the layout repeats.
    """

    def __init__(self, buf: Any, frame: int, length: int, alignment: int):
        self.buf, self.frame, self.alignment = buf, frame, alignment
        # The frame header (container.FRAME): magic, crc, then the length, which opens the
        # first run of structure bytes (one bytes field with what follows it: fewer fields
        # to unpack and compare).
        self.fmt = ["<4sI", f"{FRAME_SIZE - FRAME_LENGTH_AT}s"]
        self.structural = [0, 2]  # all of it but the crc
        self.check_at = [*range(0, FRAME_CRC_AT), *range(FRAME_LENGTH_AT, FRAME_SIZE)]
        self.pos = frame + FRAME_SIZE
        self.n_fields = 3
        self.run_at: int | None = FRAME_LENGTH_AT  # frame offset of the open run of structure

    def field(self, code: str, is_structure: bool = True) -> tuple[int, int, Any]:
        """Read the field at ``pos`` (one struct code); (its index, frame offset, value).
        A structure field's bytes are expected of every record of the layout."""
        at = self.pos - self.frame
        (value,) = struct.unpack_from("<" + code, self.buf, self.pos)
        size = struct.calcsize("<" + code)
        self.pos += size
        if not is_structure:
            self.run_at = None
            self.fmt.append(code)
            self.n_fields += 1
            return self.n_fields - 1, at, value
        self.check_at.extend(range(at, at + size))
        if self.run_at is None:  # a new run of structure bytes
            self.run_at = at
            self.structural.append(self.n_fields)
            self.fmt.append("")
            self.n_fields += 1
        self.fmt[-1] = f"{at + size - self.run_at}s"
        return self.n_fields - 1, at, value

    def skip(self, n: int) -> None:
        """Bytes of a value the layout does not unpack (tensor data)."""
        self.run_at = None
        self.fmt.append(f"{n}x")
        self.pos += n


def compile_layout(buf: Any, frame: int, length: int, alignment: int) -> Layout | None:
    """A Layout for the record at ``buf[frame]``, which decode_payload has accepted.

    Returns None for structures not worth compiling (lists, bool tensors).
    """
    c = Compiler(buf, frame, length, alignment)
    slots = []
    for _ in range(c.field(g.COUNT)[2]):
        slot = CODECS[c.field(g.TAG)[2]].step(c)
        if slot is None:
            return None
        slots.append(slot)
    if c.pos != frame + FRAME_SIZE + length:
        return None
    sample = np.frombuffer(bytes(buf[frame : c.pos]), np.uint8)
    return Layout("".join(c.fmt), c.structural, slots, c.check_at, sample, alignment)
