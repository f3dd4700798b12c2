"""A simple byte packing of a record: fixed-size fields in order, then each str field as a
uint32 length and its UTF-8 bytes. Unpacking gives numpy views of the buffer (no copy)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..workloads import Field, Record

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")


class Packer:
    def __init__(self, fields: tuple[Field, ...]):
        self.fields = fields
        self.fixed: list[tuple[int, Field, int]] = []  # (field index, field, offset)
        self.strings: list[int] = []
        offset = 0
        for k, f in enumerate(fields):
            if f.kind == "str":
                self.strings.append(k)
            else:
                self.fixed.append((k, f, offset))
                offset += f.nbytes
        self.fixed_size = offset
        self.counts = {k: f.nbytes // np.dtype(f.dtype).itemsize for k, f, _ in self.fixed}

    def pack(self, record: Record) -> bytes:
        parts: list[Any] = []
        for k, f, _ in self.fixed:
            value = record[k]
            parts.append(_I64.pack(value) if f.kind == "int" else memoryview(value).cast("B"))
        for k in self.strings:
            encoded = record[k].encode()
            parts.append(_U32.pack(len(encoded)))
            parts.append(encoded)
        return b"".join(parts)

    def unpack(self, buf: Any) -> Record:
        out: list[Any] = [None] * len(self.fields)
        for k, f, offset in self.fixed:
            if f.kind == "int":
                out[k] = _I64.unpack_from(buf, offset)[0]
            else:
                array = np.frombuffer(buf, f.dtype, self.counts[k], offset)
                out[k] = array if len(f.shape) == 1 else array.reshape(f.shape)
        pos = self.fixed_size
        for k in self.strings:
            (length,) = _U32.unpack_from(buf, pos)
            pos += 4
            out[k] = str(buf[pos : pos + length], "utf-8")
            pos += length
        return out
