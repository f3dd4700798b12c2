"""ArrayRecord (Google): ArrayRecordWriter, read with ArrayRecordDataSource (random access)
and ArrayRecordReader ranges (scan). Records use the byte packing of packing.py."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..workloads import Field, Record
from . import Adapter, Unavailable

try:
    from array_record.python.array_record_data_source import ArrayRecordDataSource
    from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter
except ImportError as exc:
    raise Unavailable(f"import array_record failed: {exc}") from exc

from .packing import Packer

SCAN_CHUNK = 1024


class ArrayRecord(Adapter):
    name = "array_record"
    zero_copy = False
    packages = ("array-record",)
    notes = "options group_size:1,uncompressed"
    options = "group_size:1,uncompressed"

    def __init__(self, fields: tuple[Field, ...]):
        super().__init__(fields)
        self.packer = Packer(fields)

    def write(self, records: Iterable[Record], path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        writer = ArrayRecordWriter(str(path / "data.array_record"), self.options)
        try:
            for r in records:
                writer.write(self.packer.pack(r))
        finally:
            writer.close()

    def open(self, path: Path) -> None:
        self.file = str(path / "data.array_record")
        self.ds: Any = ArrayRecordDataSource([self.file])
        self.n = len(self.ds)

    def get(self, i: int) -> Record:
        return self.packer.unpack(self.ds[i])

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        return [self.packer.unpack(b) for b in self.ds.__getitems__([int(i) for i in indices])]

    def scan(self) -> Iterator[Record]:
        reader = ArrayRecordReader(self.file)
        try:
            for start in range(0, self.n, SCAN_CHUNK):
                for buf in reader.read(start, min(start + SCAN_CHUNK, self.n)):
                    yield self.packer.unpack(buf)
        finally:
            reader.close()

    def close(self) -> None:
        self.ds.__exit__(None, None, None)


class ArrayRecordZstd(ArrayRecord):
    name = "array_record_zstd"
    notes = "default writer options (here: group_size:1, zstd:3)"
    options = ""
