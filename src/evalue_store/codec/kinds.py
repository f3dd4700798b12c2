"""One codec per EValue kind: how its fields are written, read back and laid out.

Each codec has three methods, the only places the grammar of a value is spelled out:

* ``encode(out, value)`` appends the value (tag included) to a record being built
  (``record.Builder``);
* ``decode(reader, at)`` reads it back, checking every rule, after ``reader`` has taken its
  tag at ``at`` (``record.Reader``);
* ``step(compiler)`` does what decode does for a record that ``decode`` has accepted, but
  declares each field to a ``layout.Compiler`` instead: as structure that every record of the
  layout repeats, or as the value's own bytes. It returns the value's slot (where and what
  the value is in the frame), or None when the kind is not worth a layout.

``CODECS`` maps a tag byte to its codec; ``BY_TYPE`` the common exact Python types to the
codec that encodes them without classifying.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..dtypes import CODE_TO_DTYPE, dtype_code
from ..errors import LIMIT, OUT_OF_BOUNDS, TRUNCATED, VALUE, EncodeError, FormatError
from ..values import INT64_MAX, INT64_MIN, MAX_RANK, Kind, canonical_bools, classify
from .grammar import (
    BIG_PART,
    BOOL_CODE,
    BOOL_SIZE,
    DIM,
    DIM_SIZE,
    DIMS,
    F64,
    I64,
    LIST_ITEM,
    LIST_ITEMS,
    SCALAR,
    SCALAR_SIZE,
    STRING,
    STRING_BYTES,
    STRING_HEAD,
    STRING_TAIL,
    STRING_UTF8,
    T_BOOL,
    T_NONE,
    T_STRING,
    T_TENSOR,
    TAG_F64,
    TAG_I64,
    TAG_U8,
    TAG_U64,
    TENSOR,
    TENSOR_DIM_ORDER,
    TENSOR_HEADS,
    TENSOR_TAIL,
    U64,
    ZEROS,
    region,
    tensor_strides,
)

# Slot kinds: what a layout's value is, at a fixed place in every frame of the layout.
S_NONE, S_TENSOR, S_TEXT, S_BYTES, S_SCALAR, S_BOOL = range(6)


class Slot(NamedTuple):
    """One value of a layout: ``kind`` (above), ``index`` of its field in the layout's
    struct (scalars and strings), ``at`` its byte offset in the frame, and ``detail``:
    a tensor's (dtype, shape, strides, nbytes, numel or None if strided), a scalar's
    numpy dtype, a string's byte length."""

    kind: int
    index: int
    at: int
    detail: Any


class NoneCodec:
    kind = Kind.NONE

    def encode(self, out: Any, value: Any) -> None:
        out.cur.append(T_NONE)

    def decode(self, reader: Any, at: int) -> None:
        return None

    def step(self, compiler: Any) -> Slot:
        return Slot(S_NONE, 0, 0, None)


class ScalarCodec:
    """Int and Double: the value packed after its tag."""

    def __init__(self, kind: Kind, head: Any, unpack: Any, what: str):
        self.kind, self.code, self.tag = kind, SCALAR[kind], int(kind)
        self._pack, self._unpack, self._what = head.pack, unpack, what

    def encode(self, out: Any, value: Any) -> None:
        out.cur += self._pack(self.tag, value)

    def decode(self, reader: Any, at: int) -> Any:
        return self._unpack(reader.buf, reader.need(SCALAR_SIZE, self._what))[0]

    def step(self, compiler: Any) -> Slot:
        index, at, _ = compiler.field(self.code, False)
        return Slot(S_SCALAR, index, at, np.dtype("<" + self.code))


class IntCodec(ScalarCodec):
    def encode(self, out: Any, value: Any) -> None:
        if not INT64_MIN <= value <= INT64_MAX:
            classify(value)  # raises: says that it does not fit
        out.cur += self._pack(self.tag, value)


class BoolCodec:
    kind = Kind.BOOL

    def encode(self, out: Any, value: Any) -> None:
        out.cur += TAG_U8.pack(T_BOOL, value)

    def decode(self, reader: Any, at: int) -> bool:
        byte = reader.buf[reader.need(BOOL_SIZE, "Bool")]
        if byte > 1:
            raise FormatError(f"Bool byte {byte} is neither 0 nor 1", reader.pos - 1, code=VALUE)
        return byte == 1

    def step(self, compiler: Any) -> Slot:
        index, at, _ = compiler.field(SCALAR[Kind.BOOL], False)
        return Slot(S_BOOL, index, at, None)


class StringCodec:
    kind = Kind.STRING

    def encode(self, out: Any, value: Any) -> None:
        if type(value) is str and value.isascii():  # ASCII always encodes
            data, subtype = value.encode(), STRING_UTF8
        elif isinstance(value, str):
            try:
                data = value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise EncodeError(f"string is not encodable as UTF-8: {exc.reason}") from None
            subtype = STRING_UTF8
        else:
            data, subtype = value, STRING_BYTES
        cur = out.cur
        cur += STRING_HEAD.pack(T_STRING, subtype, len(data))
        cur += data

    def decode(self, reader: Any, at: int) -> Any:
        at_tail = reader.need(STRING_TAIL.size, "String header")
        subtype, length = STRING_TAIL.unpack_from(reader.buf, at_tail)
        start = reader.need(length, "String")
        raw = bytes(reader.buf[start : start + length])
        if subtype == STRING_BYTES:
            return raw
        if subtype != STRING_UTF8:
            raise FormatError(f"unknown String subtype {subtype}", at + 1, code=VALUE)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(
                f"invalid UTF-8 in String: {exc.reason}", start + exc.start, code=VALUE
            ) from None

    def step(self, compiler: Any) -> Slot:
        subtype, size = (compiler.field(code)[2] for code in STRING)
        index, at, _ = compiler.field(f"{size}s", False)
        return Slot(S_TEXT if subtype == STRING_UTF8 else S_BYTES, index, at, size)


def memory_layout(array: np.ndarray) -> tuple[np.ndarray, tuple[int, ...] | None]:
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


MAX_HEADS = 4096  # tensor headers remembered (bounded: shapes may all differ)
# (dtype, shape, strides) of small C-contiguous little-endian arrays -> their header bytes
_HEADS: dict[tuple, bytes] = {}


_BOOL = np.dtype(np.bool_)


class TensorCodec:
    kind = Kind.TENSOR

    def encode(self, out: Any, array: np.ndarray) -> None:
        if array.dtype is _BOOL:  # (an identity test: this is the per-tensor path)
            array = canonical_bools(array)
        head = _HEADS.get((array.dtype, array.shape, array.strides))
        if head is not None:  # the common case: a shape seen before, stored as it is
            cur = out.cur
            cur += head
            cur += ZEROS[: -(out.base + len(cur)) & out.mask]
            cur.extend(array)
            return
        if array.flags.c_contiguous and array.dtype.byteorder != ">":
            data, order = array, None
        else:
            data, order = memory_layout(array)
        rank = array.ndim
        cur = out.cur
        if order is None:
            head = TENSOR_HEADS[rank].pack(T_TENSOR, dtype_code(array.dtype), rank, 0, *data.shape)
            if data is array and array.nbytes < BIG_PART:
                if len(_HEADS) >= MAX_HEADS:
                    _HEADS.clear()
                _HEADS[array.dtype, array.shape, array.strides] = head
            cur += head
        else:
            cur += TENSOR_HEADS[rank].pack(T_TENSOR, dtype_code(array.dtype), rank, 1, *array.shape)
            cur += bytes(order)
        cur += ZEROS[: -(out.base + len(cur)) & out.mask]
        if data.nbytes < BIG_PART:
            cur.extend(data)
        else:  # kept by reference: written without an extra copy
            out.chunks.append(cur)
            out.chunks.append(data.reshape(-1).view(np.uint8))
            out.base += len(cur) + data.nbytes
            out.cur = bytearray()

    def decode(self, reader: Any, at: int) -> np.ndarray:
        buf, pos, end = reader.buf, reader.pos, reader.end
        if end - pos < TENSOR_TAIL.size:
            raise FormatError("truncated Tensor header", pos, code=TRUNCATED)
        code, rank, flags = TENSOR_TAIL.unpack_from(buf, pos)
        dtype = CODE_TO_DTYPE.get(code)
        if dtype is None:
            raise FormatError(f"unknown tensor dtype code {code}", at + 1, code=VALUE)
        if rank > MAX_RANK:
            raise FormatError(f"tensor rank {rank} exceeds {MAX_RANK}", at + 2, code=LIMIT)
        if flags & ~TENSOR_DIM_ORDER:
            raise FormatError(f"unknown tensor flags {flags:#x}", at + 3, code=VALUE)
        pos += TENSOR_TAIL.size
        if end - pos < DIM_SIZE * rank + (rank if flags else 0):
            raise FormatError("truncated Tensor dims", pos, code=TRUNCATED)
        shape = DIMS[rank].unpack_from(buf, pos)
        pos += DIM_SIZE * rank
        order = None
        if flags:
            order = bytes(buf[pos : pos + rank])
            if sorted(order) != list(range(rank)):
                raise FormatError(f"dim order {list(order)} is not a permutation", pos, code=VALUE)
            pos += rank
        align = reader.alignment
        data = reader.frame + (pos - reader.frame + align - 1) // align * align
        if data <= end and bytes(buf[pos:data]).count(0) != data - pos:
            raise FormatError("non-zero bytes in the padding before tensor data", pos, code=VALUE)
        nbytes = extent = dtype.itemsize
        for dim in shape:
            nbytes *= dim
            extent *= dim or 1
        if extent >= 1 << 63:
            raise FormatError(
                f"tensor dims {list(shape)} overflow 64-bit sizes", at + 4, code=LIMIT
            )
        if data > end or nbytes > end - data:
            raise FormatError(
                f"tensor data ({nbytes} bytes) runs past the record", data, code=OUT_OF_BOUNDS
            )
        reader.pos = data + nbytes
        reader.data_at = data
        if order:
            strides = tensor_strides(shape, order, dtype.itemsize)
            array = np.ndarray(shape, dtype, buffer=region(buf, data, nbytes), strides=strides)
        else:  # np.frombuffer is the cheapest view, and it keeps the mapping alive
            array = np.frombuffer(buf, dtype, nbytes // dtype.itemsize, data)
            if rank != 1:
                array = array.reshape(shape)
        if code == BOOL_CODE and nbytes and array.view(np.uint8).max() > 1:
            raise FormatError("bool tensor holds a byte other than 0 or 1", data, code=VALUE)
        return array

    def step(self, compiler: Any) -> Slot | None:
        code, rank, flags = (compiler.field(c)[2] for c in TENSOR)
        if code == BOOL_CODE:
            return None  # its bytes are checked one by one: not a fixed layout
        shape = tuple(compiler.field(DIM)[2] for _ in range(rank))
        order = compiler.field(f"{rank}s")[2] if flags else None
        dtype = CODE_TO_DTYPE[code]
        frame, pos, alignment = compiler.frame, compiler.pos, compiler.alignment
        data = frame + (pos - frame + alignment - 1) // alignment * alignment
        if data > pos:  # the padding is structure: zero bytes, checked like the rest
            compiler.field(f"{data - pos}s")
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=object))
        compiler.skip(nbytes)
        strides = tensor_strides(shape, order, dtype.itemsize) if order else None
        sample = np.ndarray(shape, dtype, buffer=compiler.buf, offset=data, strides=strides)
        detail = (dtype, shape, sample.strides, nbytes, None if order else sample.size)
        return Slot(S_TENSOR, 0, data - frame, detail)


class ScalarListCodec:
    """ListBool, ListInt, ListDouble: a length, then the items packed."""

    def __init__(self, kind: Kind):
        self.kind, self.tag = kind, int(kind)
        self.dtype, self.itemsize = LIST_ITEMS[kind]

    def encode(self, out: Any, value: Any) -> None:
        out.cur += TAG_U64.pack(self.tag, len(value))
        out.cur += np.asarray(value, dtype=self.dtype).tobytes()

    def decode(self, reader: Any, at: int) -> list:
        count = U64.unpack_from(reader.buf, reader.need(U64.size, "list length"))[0]
        if count > (reader.end - reader.pos) // self.itemsize:
            raise FormatError(
                f"list claims {count} items, more than its bytes",
                reader.pos - U64.size,
                code=OUT_OF_BOUNDS,
            )
        start = reader.need(count * self.itemsize, "list items")
        items = np.frombuffer(reader.buf, self.dtype, count, start)
        if self.kind is Kind.LIST_BOOL:
            if count and items.max() > 1:
                raise FormatError("ListBool item is neither 0 nor 1", start, code=VALUE)
            return [bool(x) for x in items]
        return items.tolist()

    def step(self, compiler: Any) -> None:
        return None  # lengths vary record to record: not worth a layout


class TensorListCodec:
    """ListTensor, ListOptionalTensor: a length, then the items as values of their own."""

    def __init__(self, kind: Kind, allowed: tuple[int, ...]):
        self.kind, self.tag, self.allowed = kind, int(kind), allowed

    def encode(self, out: Any, value: Any) -> None:
        out.cur += TAG_U64.pack(self.tag, len(value))
        for item in value:
            (NONE_CODEC if item is None else TENSOR_CODEC).encode(out, item)

    def decode(self, reader: Any, at: int) -> list:
        count = U64.unpack_from(reader.buf, reader.need(U64.size, "list length"))[0]
        if count > reader.end - reader.pos:  # every item takes at least one byte
            raise FormatError(
                f"list claims {count} items, more than its bytes", at, code=OUT_OF_BOUNDS
            )
        return [reader.value(self.allowed) for _ in range(count)]

    def step(self, compiler: Any) -> None:
        return None


NONE_CODEC = NoneCodec()
TENSOR_CODEC = TensorCodec()
INT_CODEC = IntCodec(Kind.INT, TAG_I64, I64.unpack_from, "Int")
DOUBLE_CODEC = ScalarCodec(Kind.DOUBLE, TAG_F64, F64.unpack_from, "Double")
STRING_CODEC = StringCodec()

CODECS: list[Any] = [None] * 256  # tag byte -> codec; None: an unknown tag
for _codec in (
    NONE_CODEC,
    TENSOR_CODEC,
    STRING_CODEC,
    DOUBLE_CODEC,
    INT_CODEC,
    BoolCodec(),
    *(ScalarListCodec(kind) for kind in LIST_ITEM),
    TensorListCodec(Kind.LIST_TENSOR, (T_TENSOR,)),
    TensorListCodec(Kind.LIST_OPTIONAL_TENSOR, (T_NONE, T_TENSOR)),
):
    CODECS[_codec.kind] = _codec
del _codec

# Exact types whose kind needs no classify (the common values).
BY_TYPE = {
    np.ndarray: TENSOR_CODEC.encode,
    int: INT_CODEC.encode,
    str: STRING_CODEC.encode,
    float: DOUBLE_CODEC.encode,
}
