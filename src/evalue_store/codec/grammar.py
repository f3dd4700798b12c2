"""The record payload grammar (docs/FORMAT.md sections 3-5), declared once as struct codes.

A payload is COUNT, then per value a TAG byte (a values.Kind) and that kind's fields. Every
struct of the codec package is built from the codes below; kinds.py says, once per kind,
how those fields are written, read back and laid out.
"""

from __future__ import annotations

import struct

import numpy as np

from ..dtypes import dtype_code
from ..values import MAX_RANK, Kind

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
BIG_PART = 1 << 16  # tensor data at least this large is written from the caller's array

U32 = struct.Struct("<" + COUNT)
U64 = struct.Struct("<" + LIST_LENGTH)
I64 = struct.Struct("<" + SCALAR[Kind.INT])
F64 = struct.Struct("<" + SCALAR[Kind.DOUBLE])
TAG_U8 = struct.Struct("<" + TAG + SCALAR[Kind.BOOL])
TAG_I64 = struct.Struct("<" + TAG + SCALAR[Kind.INT])
TAG_F64 = struct.Struct("<" + TAG + SCALAR[Kind.DOUBLE])
TAG_U64 = struct.Struct("<" + TAG + LIST_LENGTH)
STRING_HEAD = struct.Struct("<" + TAG + STRING)
STRING_TAIL = struct.Struct("<" + STRING)  # the String fields after its tag
TENSOR_HEAD = struct.Struct("<" + TAG + TENSOR)
TENSOR_TAIL = struct.Struct("<" + TENSOR)
TAG_SIZE = struct.calcsize(TAG)
SCALAR_SIZE = I64.size  # Int and Double
BOOL_SIZE = struct.calcsize(SCALAR[Kind.BOOL])
DIM_SIZE = struct.calcsize("<" + DIM)
DIMS = [struct.Struct("<" + DIM * rank) for rank in range(MAX_RANK + 1)]
TENSOR_HEADS = [struct.Struct("<" + TAG + TENSOR + DIM * rank) for rank in range(MAX_RANK + 1)]
assert I64.size == F64.size

# list kind -> (item dtype, item size)
LIST_ITEMS = {
    kind: (np.dtype("<" + SCALAR[item]), struct.calcsize("<" + SCALAR[item]))
    for kind, item in LIST_ITEM.items()
}

# The tag bytes as plain ints for the hot loops (looking up a Kind member costs ~10x more).
T_NONE, T_TENSOR, T_STRING, T_DOUBLE, T_INT, T_BOOL = (
    int(k) for k in (Kind.NONE, Kind.TENSOR, Kind.STRING, Kind.DOUBLE, Kind.INT, Kind.BOOL)
)
BOOL_CODE = dtype_code(np.dtype("?"))  # ScalarType Bool: its bytes must be 0 or 1
ZEROS = memoryview(bytes(1 << 16))  # padding source: alignment is at most 65536


def tensor_strides(shape: tuple[int, ...], order: bytes, itemsize: int) -> tuple[int, ...]:
    """Byte strides of a tensor stored densely in dim order ``order``."""
    strides = [0] * len(shape)
    step = itemsize
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis]
    return tuple(strides)


def region(buf: object, offset: int, n: int) -> np.ndarray:
    """``buf[offset:offset + n]`` as uint8, for np.ndarray(buffer=...) to view.

    np.frombuffer keeps a memoryview of ``buf``, so a mapping cannot be closed while a view
    of it lives; np.ndarray(buffer=buf) keeps only ``buf`` itself, which close() unmaps.
    """
    return np.frombuffer(buf, np.uint8, n, offset)
