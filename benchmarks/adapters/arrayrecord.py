"""ArrayRecord (Google): ArrayRecordWriter; read with ArrayRecordReader, one-record ranges for
random access and chunked ranges for the scan. Records use the byte packing of packing.py."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from ..workloads import Field, Record
from . import Adapter, Unavailable

try:
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
        # ArrayRecordDataSource[i] goes through ArrayRecordReader.read([i]), which costs
        # ~0.4-0.7 ms per call on a 200,000-record file here (it was ~10 us at 2,000 records);
        # read(i, i + 1) on a reader opened with the data source's options takes ~6-8 us.
        self.file = str(path / "data.array_record")
        self.reader = ArrayRecordReader(self.file, "readahead_buffer_size:0,max_parallelism:0")
        self.n = self.reader.num_records()

    def get(self, i: int) -> Record:
        return self.packer.unpack(self.reader.read(i, i + 1)[0])

    def scan(self) -> Iterator[Record]:
        reader = ArrayRecordReader(self.file)
        try:
            for start in range(0, self.n, SCAN_CHUNK):
                for buf in reader.read(start, min(start + SCAN_CHUNK, self.n)):
                    yield self.packer.unpack(buf)
        finally:
            reader.close()

    def close(self) -> None:
        self.reader.close()


class ArrayRecordZstd(ArrayRecord):
    name = "array_record_zstd"
    notes = "default writer options (here: group_size:1, zstd:3)"
    options = ""
