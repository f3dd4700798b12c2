"""Native record codec: one EValue[] record <-> little-endian bytes with aligned tensor data.

A record payload starts right after its 16-byte frame header. Tensor data is padded so it
starts at a multiple of the file's alignment counted from the frame start; frames start at
aligned file offsets, so mapped tensors are aligned in memory too. See docs/FORMAT.md.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from .container import FRAME, FRAME_CRC_AT, FRAME_LENGTH_AT, FRAME_MAGIC, FRAME_SIZE, Checksum
from .dtypes import CODE_TO_DTYPE, dtype_code
from .errors import EncodeError, FormatError
from .values import INT64_MAX, INT64_MIN, MAX_RANK, Kind, classify

# ----------------------------------------------------------------------------- the grammar
#
# The record payload (docs/FORMAT.md section 3), declared once as struct codes: every struct
# below, the generic decoder's sizes and compile_layout's field formats are built from these.
# A payload is COUNT, then per value a TAG byte (a values.Kind) and that kind's fields:
COUNT = "I"  # the number of values
TAG = "B"
SCALAR = {Kind.INT: "q", Kind.DOUBLE: "d", Kind.BOOL: "B"}  # the value itself (Bool: 0 or 1)
STRING = "BQ"  # subtype (STRING_UTF8, STRING_BYTES), byte length; then the bytes
TENSOR = "BBB"  # dtype code, rank, flags; then rank DIMs, the dim order (rank bytes) if
DIM = "Q"  # flagged, zero padding to the alignment (counted from the frame start), the data
LIST_LENGTH = "Q"  # then a scalar list's items packed as SCALAR, or a tensor list's values
LIST_ITEM = {Kind.LIST_BOOL: Kind.BOOL, Kind.LIST_INT: Kind.INT, Kind.LIST_DOUBLE: Kind.DOUBLE}

STRING_UTF8 = 0
STRING_BYTES = 1
TENSOR_DIM_ORDER = 1  # flag: a dim-order permutation follows the dims
MAX_VALUES = 1 << 20  # values in one record; a header claiming more is hostile

_U32 = struct.Struct("<" + COUNT)
_U64 = struct.Struct("<" + LIST_LENGTH)
_I64 = struct.Struct("<" + SCALAR[Kind.INT])
_F64 = struct.Struct("<" + SCALAR[Kind.DOUBLE])
_TAG_U8 = struct.Struct("<" + TAG + SCALAR[Kind.BOOL])
_TAG_I64 = struct.Struct("<" + TAG + SCALAR[Kind.INT])
_TAG_F64 = struct.Struct("<" + TAG + SCALAR[Kind.DOUBLE])
_TAG_U64 = struct.Struct("<" + TAG + LIST_LENGTH)
_STRING_HEAD = struct.Struct("<" + TAG + STRING)
_STRING_TAIL = struct.Struct("<" + STRING)  # the String fields after its tag
_TENSOR_HEAD = struct.Struct("<" + TAG + TENSOR)
_TENSOR_TAIL = struct.Struct("<" + TENSOR)
_TAG_SIZE = struct.calcsize(TAG)
_SCALAR_SIZE = _I64.size  # Int and Double
_BOOL_SIZE = struct.calcsize(SCALAR[Kind.BOOL])
_DIM_SIZE = struct.calcsize("<" + DIM)

# list kind -> (item dtype, item size)
_LIST_ITEM = {
    kind: (np.dtype("<" + SCALAR[item]), struct.calcsize("<" + SCALAR[item]))
    for kind, item in LIST_ITEM.items()
}
assert _I64.size == _F64.size

# The tag bytes as plain ints for the hot loops (looking up a Kind member costs ~10x more).
_T_NONE, _T_TENSOR, _T_STRING, _T_DOUBLE, _T_INT, _T_BOOL = (
    int(k) for k in (Kind.NONE, Kind.TENSOR, Kind.STRING, Kind.DOUBLE, Kind.INT, Kind.BOOL)
)
_T_SCALAR_LISTS = tuple(int(k) for k in _LIST_ITEM)
_T_TENSOR_LISTS = (int(Kind.LIST_TENSOR), int(Kind.LIST_OPTIONAL_TENSOR))
_IN_LIST_TENSOR = (_T_TENSOR,)  # the tags a ListTensor item may have
_IN_LIST_OPTIONAL_TENSOR = (_T_NONE, _T_TENSOR)
_NONE_VALUE = bytes((_T_NONE,))
_BOOL_CODE = dtype_code(np.dtype("?"))  # ScalarType Bool: its bytes must be 0 or 1


# ----------------------------------------------------------------------------- encoding


BIG_PART = 1 << 16  # tensor data at least this large is written from the caller's array


class _Builder:
    """Accumulates one record frame: small pieces are copied into ``cur``, big tensors are
    kept as references so that they are written without an extra copy. The frame header
    is not in the pieces; ``base`` counts it, and the bytes of ``chunks``."""

    __slots__ = ("chunks", "cur", "base", "alignment")

    def __init__(self, alignment: int, chunks: list[Any], cur: bytearray, base: int):
        self.chunks = chunks
        self.cur = cur
        self.base = base
        self.alignment = alignment

    def pad(self) -> None:
        self.cur += _ZEROS[: -(self.base + len(self.cur)) & (self.alignment - 1)]

    def add_array(self, flat: np.ndarray) -> None:
        if flat.nbytes < BIG_PART:
            self.cur.extend(flat)
        else:
            self.chunks.append(self.cur)
            self.chunks.append(flat)
            self.base += len(self.cur) + flat.nbytes
            self.cur = bytearray()


_DIMS = [struct.Struct("<" + DIM * rank) for rank in range(MAX_RANK + 1)]
_TENSOR_HEADS = [struct.Struct("<" + TAG + TENSOR + DIM * rank) for rank in range(MAX_RANK + 1)]
_ZEROS = memoryview(bytes(1 << 16))  # padding source: alignment is at most 65536


def _memory_layout(array: np.ndarray) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """The bytes to store (little-endian, dense) and the dim order they are in.

    A C-contiguous array needs no dim order. An array that is dense in some other axis order
    (channels-last, a transpose) is stored as it sits in memory with that order, so it comes
    back as the same strided view without a copy. Anything else is copied to C order.
    """
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"), order="K")
    if array.flags.c_contiguous:
        return array, None
    order = tuple(int(k) for k in np.argsort([-s for s in array.strides], kind="stable"))
    dense = array.transpose(order)
    if dense.flags.c_contiguous:
        return dense, order
    return np.ascontiguousarray(array), None


def _encode_tensor(out: _Builder, array: np.ndarray) -> None:
    if array.flags.c_contiguous and array.dtype.byteorder != ">":
        data, order = array, None  # the common case, without a call
    else:
        data, order = _memory_layout(array)
    rank = array.ndim
    cur = out.cur
    cur += _TENSOR_HEAD.pack(Kind.TENSOR, dtype_code(array.dtype), rank, 1 if order else 0)
    cur += _DIMS[rank].pack(*array.shape)
    if order:
        cur += bytes(order)
    out.pad()
    out.add_array(data.reshape(-1).view(np.uint8) if data.nbytes >= BIG_PART else data)


def _encode_value(out: _Builder, value: Any, kind: Kind | None = None) -> None:
    if kind is None:
        cls = type(value)  # exact types first: most values are these, and classify is slower
        if cls is np.ndarray:
            kind = Kind.TENSOR
        elif cls is int and INT64_MIN <= value <= INT64_MAX:
            kind = Kind.INT
        elif cls is str:
            kind = Kind.STRING
        elif cls is float:
            kind = Kind.DOUBLE
        else:
            kind, value = classify(value)
    if kind is Kind.TENSOR:
        _encode_tensor(out, value)
    elif kind is Kind.INT:
        out.cur += _TAG_I64.pack(_T_INT, value)
    elif kind is Kind.STRING:
        if isinstance(value, str):
            try:
                data = value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise EncodeError(f"string is not encodable as UTF-8: {exc.reason}") from None
            subtype = STRING_UTF8
        else:
            data, subtype = value, STRING_BYTES
        out.cur += _STRING_HEAD.pack(_T_STRING, subtype, len(data))
        out.cur += data
    elif kind is Kind.DOUBLE:
        out.cur += _TAG_F64.pack(_T_DOUBLE, value)
    elif kind is Kind.BOOL:
        out.cur += _TAG_U8.pack(_T_BOOL, value)
    elif kind is Kind.NONE:
        out.cur += _NONE_VALUE
    elif kind in _LIST_ITEM:
        out.cur += _TAG_U64.pack(kind, len(value))
        out.cur += np.asarray(value, dtype=_LIST_ITEM[kind][0]).tobytes()
    else:  # LIST_TENSOR, LIST_OPTIONAL_TENSOR
        out.cur += _TAG_U64.pack(kind, len(value))
        for item in value:
            _encode_value(out, item, Kind.NONE if item is None else Kind.TENSOR)


def encode_record(
    values: Sequence[Any], alignment: int, checksum: Checksum
) -> tuple[list[Any], int, int]:
    """Encode one record frame. Returns (chunks, payload length, payload checksum), the
    checksum by the file's function (``Header.checksum``).

    The chunks, written in order, are the whole frame (header included) followed by zero
    padding up to the next multiple of ``alignment``; big tensor data chunks are views of
    the caller's arrays, not copies.
    """
    if type(values) is not list and not isinstance(values, (list, tuple)):
        raise EncodeError(f"a record is a list or tuple of values, not {type(values).__name__}")
    if len(values) > MAX_VALUES:
        raise EncodeError(f"a record holds at most {MAX_VALUES} values")
    chunks: list[Any] = []  # pieces before ``cur``: only when a big tensor was added
    cur = bytearray(_U32.pack(len(values)))
    base = FRAME_SIZE  # frame bytes before ``cur``
    mask = alignment - 1
    for value in values:
        # The common values inline, exactly as _encode_value encodes them; the rest through it.
        cls = type(value)
        if (
            cls is np.ndarray
            and value.nbytes < BIG_PART
            and value.flags.c_contiguous
            and value.dtype.byteorder != ">"
        ):
            rank = value.ndim
            cur += _TENSOR_HEADS[rank].pack(
                _T_TENSOR, dtype_code(value.dtype), rank, 0, *value.shape
            )
            cur += _ZEROS[: -(base + len(cur)) & mask]
            cur.extend(value)
        elif cls is int and INT64_MIN <= value <= INT64_MAX:
            cur += _TAG_I64.pack(_T_INT, value)
        elif cls is str and value.isascii():  # ASCII always encodes
            data = value.encode()
            cur += _STRING_HEAD.pack(_T_STRING, STRING_UTF8, len(data))
            cur += data
        elif cls is float:
            cur += _TAG_F64.pack(_T_DOUBLE, value)
        else:
            out = _Builder(alignment, chunks, cur, base)
            _encode_value(out, value)
            cur, base = out.cur, out.base  # a big tensor starts a new piece
    length = base + len(cur) - FRAME_SIZE
    crc = 0
    for chunk in chunks:
        crc = checksum(chunk, crc)
    crc = checksum(cur, crc)
    cur += _ZEROS[: -(FRAME_SIZE + length) & mask]  # so the next block starts aligned
    chunks.append(cur)
    chunks[0][:0] = FRAME.pack(FRAME_MAGIC, crc, length)
    return chunks, length, crc


# ----------------------------------------------------------------------------- decoding


def _tensor_strides(shape: tuple[int, ...], order: bytes, itemsize: int) -> tuple[int, ...]:
    strides = [0] * len(shape)
    step = itemsize
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis]
    return tuple(strides)


class _Reader:
    """Decodes values from ``buf[start:end]``; ``frame`` is where the record frame starts."""

    __slots__ = ("buf", "pos", "end", "frame", "alignment")

    def __init__(self, buf: Any, pos: int, end: int, frame: int, alignment: int):
        self.buf = buf
        self.pos = pos
        self.end = end
        self.frame = frame
        self.alignment = alignment

    def need(self, n: int, what: str) -> int:
        pos = self.pos
        if n > self.end - pos:
            raise FormatError(f"truncated {what}: needs {n} bytes, {self.end - pos} left", pos)
        self.pos = pos + n
        return pos

    def value(self, allowed: Any = None) -> Any:
        buf = self.buf
        at = self.need(_TAG_SIZE, "value tag")
        tag = buf[at]
        if allowed is not None and tag not in allowed:
            raise FormatError(f"tag {tag} not allowed inside a list of tensors", at)
        if tag == _T_TENSOR:
            return self.tensor(at)
        if tag == _T_INT:
            return _I64.unpack_from(buf, self.need(_SCALAR_SIZE, "Int"))[0]
        if tag == _T_STRING:
            return self.string(at)
        if tag == _T_DOUBLE:
            return _F64.unpack_from(buf, self.need(_SCALAR_SIZE, "Double"))[0]
        if tag == _T_BOOL:
            byte = buf[self.need(_BOOL_SIZE, "Bool")]
            if byte > 1:
                raise FormatError(f"Bool byte {byte} is neither 0 nor 1", self.pos - 1)
            return byte == 1
        if tag == _T_NONE:
            return None
        if tag in _T_SCALAR_LISTS:
            return self.scalar_list(Kind(tag))
        if tag in _T_TENSOR_LISTS:
            count = _U64.unpack_from(buf, self.need(_U64.size, "list length"))[0]
            if count > self.end - self.pos:  # every item takes at least one byte
                raise FormatError(f"list claims {count} items, more than its bytes", at)
            items = _IN_LIST_TENSOR if tag == Kind.LIST_TENSOR else _IN_LIST_OPTIONAL_TENSOR
            return [self.value(items) for _ in range(count)]
        raise FormatError(f"unknown value tag {tag}", at)

    def string(self, at: int) -> Any:
        at_tail = self.need(_STRING_TAIL.size, "String header")
        subtype, length = _STRING_TAIL.unpack_from(self.buf, at_tail)
        start = self.need(length, "String")
        raw = bytes(self.buf[start : start + length])
        if subtype == STRING_BYTES:
            return raw
        if subtype != STRING_UTF8:
            raise FormatError(f"unknown String subtype {subtype}", at + 1)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"invalid UTF-8 in String: {exc.reason}", start + exc.start) from None

    def scalar_list(self, kind: Kind) -> list:
        count = _U64.unpack_from(self.buf, self.need(_U64.size, "list length"))[0]
        item_dtype, itemsize = _LIST_ITEM[kind]
        if count > (self.end - self.pos) // itemsize:
            raise FormatError(
                f"list claims {count} items, more than its bytes", self.pos - _U64.size
            )
        start = self.need(count * itemsize, "list items")
        items = np.frombuffer(self.buf, item_dtype, count, start)
        if kind is Kind.LIST_BOOL:
            if count and items.max() > 1:
                raise FormatError("ListBool item is neither 0 nor 1", start)
            return [bool(x) for x in items]
        return items.tolist()

    def tensor(self, at: int) -> np.ndarray:
        buf, pos, end = self.buf, self.pos, self.end
        if end - pos < _TENSOR_TAIL.size:
            raise FormatError("truncated Tensor header", pos)
        code, rank, flags = _TENSOR_TAIL.unpack_from(buf, pos)
        dtype = CODE_TO_DTYPE.get(code)
        if dtype is None:
            raise FormatError(f"unknown tensor dtype code {code}", at + 1)
        if rank > MAX_RANK:
            raise FormatError(f"tensor rank {rank} exceeds {MAX_RANK}", at + 2)
        if flags & ~TENSOR_DIM_ORDER:
            raise FormatError(f"unknown tensor flags {flags:#x}", at + 3)
        pos += _TENSOR_TAIL.size
        if end - pos < _DIM_SIZE * rank + (rank if flags else 0):
            raise FormatError("truncated Tensor dims", pos)
        shape = _DIMS[rank].unpack_from(buf, pos)
        pos += _DIM_SIZE * rank
        order = None
        if flags:
            order = bytes(buf[pos : pos + rank])
            if sorted(order) != list(range(rank)):
                raise FormatError(f"dim order {list(order)} is not a permutation", pos)
            pos += rank
        align = self.alignment
        data = self.frame + (pos - self.frame + align - 1) // align * align
        if data <= end and bytes(buf[pos:data]).count(0) != data - pos:
            raise FormatError("non-zero bytes in the padding before tensor data", pos)
        nbytes = extent = dtype.itemsize
        for dim in shape:
            nbytes *= dim
            extent *= dim or 1
        if extent >= 1 << 63:
            raise FormatError(f"tensor dims {list(shape)} overflow 64-bit sizes", at + 4)
        if data > end or nbytes > end - data:
            raise FormatError(f"tensor data ({nbytes} bytes) runs past the record", data)
        self.pos = data + nbytes
        if order:
            strides = _tensor_strides(shape, order, dtype.itemsize)
            array = np.ndarray(shape, dtype, buffer=_region(buf, data, nbytes), strides=strides)
        else:  # np.frombuffer is the cheapest view, and it keeps the mapping alive
            array = np.frombuffer(buf, dtype, nbytes // dtype.itemsize, data)
            if rank != 1:
                array = array.reshape(shape)
        if code == _BOOL_CODE and nbytes and array.view(np.uint8).max() > 1:
            raise FormatError("bool tensor holds a byte other than 0 or 1", data)
        return array


def _region(buf: Any, offset: int, n: int) -> np.ndarray:
    """``buf[offset:offset + n]`` as uint8, for np.ndarray(buffer=...) to view.

    np.frombuffer keeps a memoryview of ``buf``, so a mapping cannot be closed while a view
    of it lives; np.ndarray(buffer=buf) keeps only ``buf`` itself, which close() unmaps.
    """
    return np.frombuffer(buf, np.uint8, n, offset)


def value_count(payload: Any) -> int:
    """The value count a record payload starts with (the payload must hold its 4 bytes)."""
    return _U32.unpack_from(payload)[0]


def decode_payload(buf: Any, frame: int, length: int, alignment: int) -> list:
    """Decode the record whose frame starts at ``buf[frame]`` and has a ``length``-byte payload.

    Tensors are views into ``buf``. Raises FormatError for anything malformed, including
    bytes left over after the last value.
    """
    start = frame + FRAME_SIZE
    return _decode(_Reader(buf, start, start + length, frame, alignment))


def _decode(reader: _Reader) -> list:
    start, length = reader.pos, reader.end - reader.pos
    count = _U32.unpack_from(reader.buf, reader.need(_U32.size, "value count"))[0]
    if count > MAX_VALUES:
        raise FormatError(f"record claims {count} values, over the limit {MAX_VALUES}", start)
    if count > length:
        raise FormatError(f"record claims {count} values in {length} bytes", start)
    values = [reader.value() for _ in range(count)]
    if reader.pos != reader.end:
        raise FormatError(f"{reader.end - reader.pos} bytes left after the last value", reader.pos)
    return values


# A payload on its own is decoded as if its frame header sat just before it: padding is
# counted from the frame start, which is all the reader uses the frame position for.


def check_payload(payload: Any, alignment: int) -> None:
    """Raise FormatError unless ``payload`` is a well-formed record payload (docs/FORMAT.md
    sections 4-5) for ``alignment``; offsets count from the payload's start."""
    _decode(_Reader(payload, 0, len(payload), -FRAME_SIZE, alignment))


class _SpanReader(_Reader):
    """A _Reader that also notes where each tensor's header ends and its data starts."""

    __slots__ = ("spans",)

    def tensor(self, at: int) -> np.ndarray:
        array = super().tensor(at)
        _, _, rank, flags = _TENSOR_HEAD.unpack_from(self.buf, at)
        dims_at = at + _TENSOR_HEAD.size
        header_end = dims_at + _DIM_SIZE * rank + (rank if flags & TENSOR_DIM_ORDER else 0)
        self.spans.append((header_end, self.pos - array.nbytes))
        return array


def realign_payload(payload: Any, source_alignment: int, alignment: int) -> bytearray:
    """``payload`` (encoded for ``source_alignment``) with its tensors re-padded for
    ``alignment``. Only the zero padding before tensor data changes; every other byte is
    kept, so what decoding cannot tell apart (an empty list's kind) survives."""
    reader = _SpanReader(payload, 0, len(payload), -FRAME_SIZE, source_alignment)
    reader.spans = []
    _decode(reader)
    out = bytearray()
    copied = 0
    for header_end, data in reader.spans:
        out += payload[copied:header_end]
        out += _ZEROS[: -(FRAME_SIZE + len(out)) & (alignment - 1)]
        copied = data
    out += payload[copied:]
    return out


# ----------------------------------------------------------------------------- layouts
#
# Most datasets repeat one record structure (same kinds, dtypes, shapes, string lengths).
# A Layout captures that structure as one struct format covering the whole frame, so a
# record is checked and unpacked by a single C call instead of a Python walk per value.
# Records of one structure that a writer appended one after another sit at a fixed stride,
# so a run of them is also checked and decoded column by column with numpy (decode_run).
# A record whose structural fields differ from the layout's is decoded by decode_payload.

_NONE, _TENSOR, _TEXT, _BYTES, _SCALAR, _BOOL = range(6)
_CRC_FIELD = 1  # the layout's fields start with FRAME's: magic, crc, length


class Layout:
    """The decoder for one record structure; built by ``compile_layout``.

    ``builders`` holds one (kind, field index, byte offset in the frame, detail) per value.
    ``check_at`` are the frame offsets of the structural bytes (everything but the
    checksum, scalar values, string contents and tensor data), ``check_bytes`` their values.
    """

    __slots__ = ("unpack", "structure", "expected", "builders", "size", "check_at", "check_bytes")

    def __init__(
        self,
        fmt: str,
        structural: list[int],
        expected: tuple,
        builders: list,
        check_at: list[int],
        check_bytes: np.ndarray,
    ):
        layout = struct.Struct(fmt)
        self.unpack = layout.unpack_from
        self.size = layout.size  # the whole frame
        self.structure = operator.itemgetter(*structural)
        self.expected = expected
        self.builders = builders
        self.check_at = np.array(check_at, np.intp)
        self.check_bytes = check_bytes

    def decode(self, buf: Any, frame: int, crc: int) -> list | None:
        """The record's values, or None when this record does not have this layout."""
        fields = self.unpack(buf, frame)
        if fields[_CRC_FIELD] != crc or self.structure(fields) != self.expected:
            return None
        values = []
        for kind, index, at, detail in self.builders:
            if kind == _TENSOR:  # detail: dtype, shape, strides, nbytes, numel (None: strided)
                dtype, shape, strides, nbytes, numel = detail
                if numel is None:  # a dim order
                    region = _region(buf, frame + at, nbytes)
                    values.append(np.ndarray(shape, dtype, buffer=region, strides=strides))
                else:
                    array = np.frombuffer(buf, dtype, numel, frame + at)
                    values.append(array if len(shape) == 1 else array.reshape(shape))
            elif kind == _SCALAR:
                values.append(fields[index])
            elif kind == _TEXT:
                try:
                    values.append(fields[index].decode("utf-8"))
                except UnicodeDecodeError:
                    return None  # the generic decoder reports it with its offset
            elif kind == _BYTES:
                values.append(fields[index])
            elif kind == _BOOL:
                if fields[index] > 1:
                    return None
                values.append(fields[index] == 1)
            else:
                values.append(None)
        return values

    def decode_run(
        self, buf: Any, start: int, stride: int, count: int, crcs: np.ndarray
    ) -> list[list | None]:
        """The values of the ``count`` records whose frames start at ``start + k * stride``.

        The frames must lie inside ``buf``. ``crcs`` are the checksums the index gives them.
        A record that does not have this layout, or whose frame header disagrees with its
        checksum, is None in the result: the generic decoder reads or rejects it.
        """

        region = _region(buf, start, (count - 1) * stride + self.size)

        def column(dtype: Any, at: int, shape: tuple = (), strides: tuple = ()) -> np.ndarray:
            return np.ndarray(
                (count, *shape), dtype, buffer=region, offset=at, strides=(stride, *strides)
            )

        frames = column(np.uint8, 0, (self.size,), (1,))
        good = (frames[:, self.check_at] == self.check_bytes).all(axis=1)
        good &= column("<u4", FRAME_CRC_AT) == crcs
        columns: list[list] = []
        for kind, _, at, detail in self.builders:
            if kind == _TENSOR:
                dtype, shape, strides, _, _ = detail
                run = column(dtype, at, shape, strides)
                columns.append(list(run) if shape else [run[k, ...] for k in range(count)])
            elif kind == _SCALAR:
                columns.append(column(detail, at).tolist())
            elif kind in (_TEXT, _BYTES):
                raw = column(f"V{detail}", at).tolist()
                if kind == _TEXT:
                    raw = [_utf8_or_none(data) for data in raw]
                    good &= np.array([text is not None for text in raw], bool)
                columns.append(raw)
            elif kind == _BOOL:
                byte = column(np.uint8, at)
                good &= byte <= 1
                columns.append((byte == 1).tolist())
            else:
                columns.append([None] * count)
        records: list[list | None] = (
            [list(values) for values in zip(*columns)] if columns else [[] for _ in range(count)]
        )
        for k in np.flatnonzero(~good).tolist():
            records[k] = None
        return records


def _utf8_or_none(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def compile_layout(buf: Any, frame: int, length: int, alignment: int) -> Layout | None:
    """A Layout for the record at ``buf[frame]``, which decode_payload has accepted.

    It walks the record by the grammar's struct codes (COUNT, TAG, SCALAR, STRING, TENSOR,
    DIM); each field read becomes a field of the layout's struct, its bytes expected of
    every record of this layout unless it is a value (a scalar, string bytes, tensor data).
    Returns None for structures not worth compiling (lists, bool tensors).
    """
    fmt = [FRAME.format]  # the frame header: magic, crc, length
    structural, expected = [0, 2], [FRAME_MAGIC, length]  # all of it but the crc
    check_at = [*range(0, FRAME_CRC_AT), *range(FRAME_LENGTH_AT, FRAME_SIZE)]
    builders: list = []
    pos = frame + FRAME_SIZE
    n_fields = len(expected) + 1

    def field(code: str, is_structure: bool = True) -> tuple[int, int, Any]:
        """Read the field at ``pos`` (one struct code); (its index, frame offset, value)."""
        nonlocal n_fields, pos
        at = pos - frame
        (value,) = struct.unpack_from("<" + code, buf, pos)
        size = struct.calcsize("<" + code)
        if is_structure:
            check_at.extend(range(at, at + size))
            structural.append(n_fields)
            expected.append(value)
        fmt.append(code)
        pos += size
        n_fields += 1
        return n_fields - 1, at, value

    count = field(COUNT)[2]
    for _ in range(count):
        tag = field(TAG)[2]
        if tag == _T_TENSOR:
            code, rank, flags = (field(c)[2] for c in TENSOR)
            if code == _BOOL_CODE:
                return None
            shape = tuple(field(DIM)[2] for _ in range(rank))
            order = field(f"{rank}s")[2] if flags else None
            dtype = CODE_TO_DTYPE[code]
            data = frame + (pos - frame + alignment - 1) // alignment * alignment
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=object))
            if data > pos:  # the padding is structure: zero bytes, checked like the rest
                field(f"{data - pos}s", bytes(data - pos))
            fmt.append(f"{nbytes}x")
            pos = data + nbytes
            strides = _tensor_strides(shape, order, dtype.itemsize) if order else None
            sample = np.ndarray(shape, dtype, buffer=buf, offset=data, strides=strides)
            detail = (dtype, shape, sample.strides, nbytes, None if order else sample.size)
            builders.append((_TENSOR, 0, data - frame, detail))
        elif tag == _T_DOUBLE or tag == _T_INT:
            code = SCALAR[Kind(tag)]
            index, at, _ = field(code, False)
            builders.append((_SCALAR, index, at, "<" + code))
        elif tag == _T_STRING:
            subtype, size = (field(c)[2] for c in STRING)
            index, at, _ = field(f"{size}s", False)
            builders.append((_TEXT if subtype == STRING_UTF8 else _BYTES, index, at, size))
        elif tag == _T_BOOL:
            index, at, _ = field(SCALAR[Kind.BOOL], False)
            builders.append((_BOOL, index, at, None))
        elif tag == _T_NONE:
            builders.append((_NONE, 0, 0, None))
        else:
            return None
    if pos != frame + FRAME_SIZE + length:
        return None
    frame_bytes = np.frombuffer(bytes(buf[frame:pos]), np.uint8)
    return Layout(
        "".join(fmt), structural, tuple(expected), builders, check_at, frame_bytes[check_at]
    )
