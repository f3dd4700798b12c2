"""Byte-exact codec for ExecuTorch Android's Java ``EValue.toByteArray()`` layout.

Lets Python tools exchange single EValues (and ``EValue[]`` records, framed as EVJ1) with an
Android app. The writer produces exactly the bytes Java writes; the reader is strict where
Java is lax (trailing bytes, short or long tensor data, invalid UTF-8, Bool bytes other
than 0/1) and correct where Java is wrong (uint8/int8 tensors). Layout: docs/JAVA.md.

Every multi-byte number is big-endian. Decoded tensors are zero-copy numpy views of the input
with big-endian dtypes (``>f4``...), read-only when the input is bytes;
``arr.astype(arr.dtype.newbyteorder("="))`` gives native order when the caller wants it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Union

import numpy as np

from .dtypes import CODE_TO_DTYPE, CODE_TO_NAME, dtype_code
from .errors import LIMIT, NOT_A_CONTAINER, TRUNCATED, VALUE, EncodeError, FormatError, UsageError
from .values import Kind, classify

__all__ = ["dumps", "loads", "dumps_record", "loads_record", "iter_record_slices", "MAGIC"]

Buffer = Union[bytes, bytearray, memoryview, np.ndarray]

INT32_MAX = (1 << 31) - 1
# The largest byte[] a JVM reliably allocates (JDK's ArraysSupport.SOFT_MAX_ARRAY_LENGTH).
# Java builds every serialized EValue in one byte[], so nothing larger can come from or go to it.
JAVA_MAX_ARRAY = INT32_MAX - 8
MAX_RANK = 127  # the rank byte is read as a signed Java byte

# The only ScalarTypes Java's Tensor can hold: big-endian numpy dtype for each code.
JAVA_DTYPES: dict[int, np.dtype] = {
    code: CODE_TO_DTYPE[code].newbyteorder(">") for code in (0, 1, 3, 4, 5, 6, 7)
}

MAGIC = b"EVJ1"
_RECORD_HEADER = struct.Struct(">4si")
_I32 = struct.Struct(">i")
_NONE_BYTES = bytes((Kind.NONE,))
_BOOL_BYTES = (bytes((Kind.BOOL, 0)), bytes((Kind.BOOL, 1)))
_MIN_ENTRY = 5  # a record entry is a 4-byte length plus an EValue of at least 1 byte


# --------------------------------------------------------------------------------- writer


def dumps(value: Any) -> bytes:
    """Serialize one value exactly as Java's ``EValue.toByteArray()`` would.

    Raises EncodeError for values Java cannot hold: list kinds, dtypes other than the seven
    Java tensors support, dims >= 2**31, strings that are not valid Unicode, and anything
    whose serialized form would not fit in one Java byte[].
    """
    kind, item = classify(value)
    if kind is Kind.NONE:
        return _NONE_BYTES
    if kind is Kind.BOOL:
        return _BOOL_BYTES[item]
    if kind is Kind.INT:
        return struct.pack(">Bq", Kind.INT, item)
    if kind is Kind.DOUBLE:
        return struct.pack(">Bd", Kind.DOUBLE, item)
    if kind is Kind.STRING:
        return _dump_string(item)
    if kind is Kind.TENSOR:
        return _dump_tensor(item)
    raise EncodeError(f"Java's EValue has no list kinds: {kind.name} (tag {int(kind)})")


def _dump_string(text: str | bytes) -> bytes:
    if isinstance(text, str):
        try:
            text = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise EncodeError(
                f"String is not valid Unicode at index {exc.start} ({exc.reason}); Java "
                "would write '?' there, so it cannot round-trip"
            ) from None
    if len(text) > INT32_MAX:
        raise EncodeError(f"String of {len(text)} bytes overflows Java's int32 length field")
    _check_java_size(5 + len(text), "String")
    return b"".join((struct.pack(">Bi", Kind.STRING, len(text)), text))


def _dump_tensor(array: np.ndarray) -> bytes:
    code = dtype_code(array.dtype)
    dtype = JAVA_DTYPES.get(code)
    if dtype is None:
        raise EncodeError(
            f"tensor dtype {CODE_TO_NAME[code]} (ScalarType {code}) cannot be written to Java; "
            f"it supports only {', '.join(CODE_TO_NAME[c] for c in JAVA_DTYPES)}"
        )
    # classify() already caps rank at numpy's 64, below the rank byte's limit of 127.
    for axis, dim in enumerate(array.shape):
        if dim > INT32_MAX:
            raise EncodeError(f"tensor dim {dim} (axis {axis}) does not fit Java's int32 dims")
    header = struct.pack(f">BBB{array.ndim}i", Kind.TENSOR, code, array.ndim, *array.shape)
    _check_java_size(len(header) + math.prod(array.shape) * dtype.itemsize, "tensor")
    return b"".join((header, np.ascontiguousarray(array, dtype=dtype)))


def _check_java_size(size: int, what: str) -> None:
    if size > JAVA_MAX_ARRAY:
        raise EncodeError(
            f"serialized {what} would be {size} bytes; Java holds at most {JAVA_MAX_ARRAY} "
            "in one byte[]"
        )


# --------------------------------------------------------------------------------- reader


def loads(data: Buffer, *, strings: Literal["str", "bytes"] = "str") -> Any:
    """Decode exactly one Java-serialized EValue, rejecting anything Java would not write.

    ``strings="bytes"`` returns String payloads as raw bytes without UTF-8 validation (for
    data written from bytes, or to inspect corrupt strings). Tensors are zero-copy views.
    Raises FormatError with the byte offset of the problem.
    """
    if strings not in ("str", "bytes"):
        raise UsageError(f"strings must be 'str' or 'bytes', not {strings!r}")
    view = _byte_view(data)
    size = len(view)
    if size == 0:
        raise FormatError("empty input: an EValue needs at least its tag byte", 0, code=TRUNCATED)
    tag = view[0]
    if tag == Kind.NONE:
        value, end = None, 1
    elif tag == Kind.TENSOR:
        return _load_tensor(view)  # a tensor has no length field: its data runs to the end
    elif tag == Kind.STRING:
        value, end = _load_string(view, strings)
    elif tag == Kind.DOUBLE:
        _need(view, 1, 8, "Double payload")
        value, end = struct.unpack_from(">d", view, 1)[0], 9
    elif tag == Kind.INT:
        _need(view, 1, 8, "Int payload")
        value, end = struct.unpack_from(">q", view, 1)[0], 9
    elif tag == Kind.BOOL:
        _need(view, 1, 1, "Bool payload")
        if view[1] > 1:
            raise FormatError(f"Bool byte is {view[1]}, must be 0 or 1", 1, code=VALUE)
        value, end = view[1] == 1, 2
    else:
        raise FormatError(f"unknown EValue tag {tag}: Java writes only tags 0..5", 0, code=VALUE)
    if end != size:
        raise FormatError(
            f"{size - end} trailing bytes after the {Kind(tag).name} value", end, code=VALUE
        )
    return value


def _byte_view(data: Buffer) -> memoryview:
    if isinstance(data, np.ndarray) and data.dtype != np.uint8:
        raise TypeError(f"a numpy input must have dtype uint8, not {data.dtype}")
    if not isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
        raise TypeError(f"expected bytes, bytearray, memoryview or uint8 array, not {type(data)}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise TypeError("input buffer must be C-contiguous")
    return view.cast("B")


def _need(view: memoryview, offset: int, count: int, what: str) -> None:
    left = len(view) - offset
    if left < count:
        raise FormatError(
            f"truncated {what}: needs {count} bytes, {left} left", offset, code=TRUNCATED
        )


def _load_string(view: memoryview, strings: str) -> tuple[str | bytes, int]:
    _need(view, 1, 4, "String length")
    (length,) = _I32.unpack_from(view, 1)
    if length < 0:
        raise FormatError(f"negative String length {length}", 1, code=VALUE)
    _need(view, 5, length, "String bytes")
    raw = view[5 : 5 + length]
    if strings == "bytes":
        return bytes(raw), 5 + length
    try:
        return str(raw, "utf-8"), 5 + length
    except UnicodeDecodeError as exc:
        raise FormatError(
            f"invalid UTF-8 in String: {exc.reason}", 5 + exc.start, code=VALUE
        ) from None


def _load_tensor(view: memoryview) -> np.ndarray:
    _need(view, 1, 2, "tensor header")
    code, rank = view[1], view[2]
    dtype = JAVA_DTYPES.get(code)
    if dtype is None:
        known = f" ({CODE_TO_NAME[code]}, which Java cannot hold)" if code in CODE_TO_NAME else ""
        raise FormatError(f"unknown tensor dtype code {code}{known}", 1, code=VALUE)
    if rank > MAX_RANK:
        raise FormatError(
            f"rank byte {rank} > {MAX_RANK} (Java reads it as {rank - 256})", 2, code=LIMIT
        )
    _need(view, 3, 4 * rank, f"tensor dims (rank {rank})")
    dims = struct.unpack_from(f">{rank}i", view, 3)
    for axis, dim in enumerate(dims):
        if dim < 0:
            raise FormatError(f"negative tensor dim {dim} (axis {axis})", 3 + 4 * axis, code=VALUE)
    start = 3 + 4 * rank
    nbytes = math.prod(dims) * dtype.itemsize  # Python int: hostile dims cannot overflow
    left = len(view) - start
    if left < nbytes:
        raise FormatError(
            f"truncated tensor data: shape {dims} of {dtype.name} needs {nbytes} bytes, "
            f"{left} left",
            start,
            code=TRUNCATED,
        )
    if left > nbytes:
        raise FormatError(
            f"{left - nbytes} trailing bytes after tensor data of shape {dims}",
            start + nbytes,
            code=VALUE,
        )
    flat = np.frombuffer(view, dtype, count=nbytes // dtype.itemsize, offset=start)
    try:
        return flat.reshape(dims)
    except ValueError as exc:  # rank > 64, or zero-size with huge other dims
        reason = f"tensor shape {dims} is valid Java but not numpy: {exc}"
        raise FormatError(reason, 2, code=LIMIT) from None


# --------------------------------------------------------------------------------- records


def dumps_record(values: Sequence[Any]) -> bytes:
    """Frame a list of values as one EVJ1 record an Android app can split with a ByteBuffer.

    Layout: b"EVJ1", int32 count, then per value an int32 length and that value's dumps().
    """
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"dumps_record takes a list or tuple of values, not {type(values)}")
    parts = [_RECORD_HEADER.pack(MAGIC, len(values))]
    size = _RECORD_HEADER.size
    for index, value in enumerate(values):
        try:
            blob = dumps(value)
        except EncodeError as exc:
            raise EncodeError(f"record value {index}: {exc}") from exc
        size += _I32.size + len(blob)
        _check_java_size(size, "record")
        parts += (_I32.pack(len(blob)), blob)
    return b"".join(parts)


def loads_record(data: Buffer, *, strings: Literal["str", "bytes"] = "str") -> list[Any]:
    """Decode an EVJ1 record strictly; FormatError offsets are relative to the record start."""
    out = []
    for index, (offset, piece) in enumerate(_record_entries(data)):
        try:
            out.append(loads(piece, strings=strings))
        except FormatError as exc:
            where = None if exc.offset is None else offset + exc.offset
            raise FormatError(f"record value {index}: {exc.reason}", where, code=exc.code) from exc
    return out


def iter_record_slices(data: Buffer) -> Iterator[memoryview]:
    """Yield each value's bytes of an EVJ1 record as a memoryview, without decoding them.

    The header is checked at call time; entry lengths and trailing bytes as iteration goes.
    """
    return (piece for _, piece in _record_entries(data))


def _record_entries(data: Buffer) -> Iterator[tuple[int, memoryview]]:
    view = _byte_view(data)
    _need(view, 0, _RECORD_HEADER.size, "record header")
    magic, count = _RECORD_HEADER.unpack_from(view)
    if magic != MAGIC:
        raise FormatError(
            f"bad record magic {bytes(magic)!r}, expected {MAGIC!r}", 0, code=NOT_A_CONTAINER
        )
    if count < 0:
        raise FormatError(f"negative record count {count}", 4, code=VALUE)
    left = len(view) - _RECORD_HEADER.size
    if count * _MIN_ENTRY > left:
        raise FormatError(
            f"record count {count} needs at least {count * _MIN_ENTRY} bytes, {left} left",
            4,
            code=TRUNCATED,
        )
    return _record_body(view, count)


def _record_body(view: memoryview, count: int) -> Iterator[tuple[int, memoryview]]:
    offset = _RECORD_HEADER.size
    for index in range(count):
        _need(view, offset, 4, f"length of record value {index}")
        (length,) = _I32.unpack_from(view, offset)
        if length < 1:
            raise FormatError(
                f"record value {index} has length {length}, must be >= 1", offset, code=VALUE
            )
        offset += 4
        _need(view, offset, length, f"record value {index}")
        yield offset, view[offset : offset + length]
        offset += length
    if offset != len(view):
        raise FormatError(
            f"{len(view) - offset} trailing bytes after the record", offset, code=VALUE
        )
