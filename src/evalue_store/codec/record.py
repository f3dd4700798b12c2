"""Whole records: one EValue[] record <-> little-endian bytes with aligned tensor data.

A record payload starts right after its 16-byte frame header. Tensor data is padded so it
starts at a multiple of the file's alignment counted from the frame start; frames start at
aligned file offsets, so mapped tensors are aligned in memory too. See docs/FORMAT.md.
The values themselves are written and read by their kind's codec (kinds.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..container import FRAME, FRAME_MAGIC, FRAME_SIZE, Checksum
from ..errors import LIMIT, OUT_OF_BOUNDS, TRUNCATED, VALUE, EncodeError, FormatError
from ..values import classify
from .grammar import (
    DIM_SIZE,
    MAX_VALUES,
    T_TENSOR,
    TAG_SIZE,
    TENSOR_DIM_ORDER,
    TENSOR_HEAD,
    U32,
    ZEROS,
)
from .kinds import BY_TYPE, CODECS

# ----------------------------------------------------------------------------- encoding


class Builder:
    """Accumulates one record frame: small pieces are copied into ``cur``, big tensors are
    kept in ``chunks`` as references so that they are written without an extra copy. The
    first piece starts with room for the frame header; ``base`` counts the bytes of
    ``chunks`` (the frame bytes before ``cur``)."""

    __slots__ = ("chunks", "cur", "base", "mask")

    def __init__(self, alignment: int, count: int):
        self.chunks: list[Any] = []
        self.cur = bytearray(_HEAD_ROOM)
        U32.pack_into(self.cur, FRAME_SIZE, count)
        self.base = 0
        self.mask = alignment - 1


_HEAD_ROOM = FRAME_SIZE + U32.size


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
    out = Builder(alignment, len(values))
    get = BY_TYPE.get
    for value in values:
        encode = get(type(value))
        if encode is None:
            kind, value = classify(value)
            encode = CODECS[kind].encode
        encode(out, value)
    chunks, cur = out.chunks, out.cur
    length = out.base + len(cur) - FRAME_SIZE
    first = chunks[0] if chunks else cur
    crc = checksum(memoryview(first)[FRAME_SIZE:])  # the view is gone before ``cur`` grows
    if chunks:
        for chunk in chunks[1:]:
            crc = checksum(chunk, crc)
        crc = checksum(cur, crc)
    cur += ZEROS[: -(FRAME_SIZE + length) & out.mask]  # so the next block starts aligned
    chunks.append(cur)
    FRAME.pack_into(first, 0, FRAME_MAGIC, crc, length)
    return chunks, length, crc


# ----------------------------------------------------------------------------- decoding


class Reader:
    """Decodes values from ``buf[start:end]``; ``frame`` is where the record frame starts.
    ``data_at`` is where the last tensor's data started."""

    __slots__ = ("buf", "pos", "end", "frame", "alignment", "data_at")

    def __init__(self, buf: Any, pos: int, end: int, frame: int, alignment: int):
        self.buf = buf
        self.pos = pos
        self.end = end
        self.frame = frame
        self.alignment = alignment

    def need(self, n: int, what: str) -> int:
        pos = self.pos
        if n > self.end - pos:
            raise FormatError(
                f"truncated {what}: needs {n} bytes, {self.end - pos} left", pos, code=TRUNCATED
            )
        self.pos = pos + n
        return pos

    def value(self, allowed: Any = None) -> Any:
        at = self.need(TAG_SIZE, "value tag")
        tag = self.buf[at]
        if allowed is not None and tag not in allowed:
            raise FormatError(f"tag {tag} not allowed inside a list of tensors", at, code=VALUE)
        codec = CODECS[tag]
        if codec is None:
            raise FormatError(f"unknown value tag {tag}", at, code=VALUE)
        return codec.decode(self, at)

    def record(self) -> list:
        """The record's values; its bytes must end exactly after the last one."""
        start, length = self.pos, self.end - self.pos
        count = U32.unpack_from(self.buf, self.need(U32.size, "value count"))[0]
        if count > MAX_VALUES:
            raise FormatError(
                f"record claims {count} values, over the limit {MAX_VALUES}", start, code=LIMIT
            )
        if count > length:
            raise FormatError(
                f"record claims {count} values in {length} bytes", start, code=OUT_OF_BOUNDS
            )
        values = [self.value() for _ in range(count)]
        if self.pos != self.end:
            raise FormatError(
                f"{self.end - self.pos} bytes left after the last value", self.pos, code=VALUE
            )
        return values


def value_count(payload: Any) -> int:
    """The value count a record payload starts with (the payload must hold its 4 bytes)."""
    return U32.unpack_from(payload)[0]


def decode_payload(buf: Any, frame: int, length: int, alignment: int) -> list:
    """Decode the record whose frame starts at ``buf[frame]`` and has a ``length``-byte payload.

    Tensors are views into ``buf``. Raises FormatError for anything malformed, including
    bytes left over after the last value.
    """
    start = frame + FRAME_SIZE
    return Reader(buf, start, start + length, frame, alignment).record()


# A payload on its own is decoded as if its frame header sat just before it: padding is
# counted from the frame start, which is all the reader uses the frame position for.


def check_payload(payload: Any, alignment: int) -> None:
    """Raise FormatError unless ``payload`` is a well-formed record payload (docs/FORMAT.md
    sections 4-5) for ``alignment``; offsets count from the payload's start."""
    Reader(payload, 0, len(payload), -FRAME_SIZE, alignment).record()


class _SpanReader(Reader):
    """A Reader that also notes where each tensor's header ends and its data starts."""

    __slots__ = ("spans",)

    def value(self, allowed: Any = None) -> Any:
        at = self.pos
        value = super().value(allowed)
        if self.buf[at] == T_TENSOR:
            _, _, rank, flags = TENSOR_HEAD.unpack_from(self.buf, at)
            dims_at = at + TENSOR_HEAD.size
            order = rank if flags & TENSOR_DIM_ORDER else 0
            self.spans.append((dims_at + DIM_SIZE * rank + order, self.data_at))
        return value


def realign_payload(payload: Any, source_alignment: int, alignment: int) -> bytearray:
    """``payload`` (encoded for ``source_alignment``) with its tensors re-padded for
    ``alignment``. Only the zero padding before tensor data changes; every other byte is
    kept, so what decoding cannot tell apart (an empty list's kind) survives."""
    reader = _SpanReader(payload, 0, len(payload), -FRAME_SIZE, source_alignment)
    reader.spans = []
    reader.record()
    out = bytearray()
    copied = 0
    for header_end, data in reader.spans:
        out += payload[copied:header_end]
        out += ZEROS[: -(FRAME_SIZE + len(out)) & (alignment - 1)]
        copied = data
    out += payload[copied:]
    return out
