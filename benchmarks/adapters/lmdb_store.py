"""LMDB, keyed by the record number (8 bytes big-endian, so keys append in order).

lmdb_pickle: each record pickled (protocol 5). lmdb_raw: the byte packing of packing.py,
read with ``buffers=True`` inside one long-lived read transaction, so tensors are numpy views
of LMDB's own memory map (valid while the dataset is open, as for the other mmap formats).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import lmdb

from ..workloads import Field, Record
from . import Adapter
from .packing import Packer

MAP_SIZE = 1 << 40  # address space only: the file grows as data is written
COMMIT_EVERY = 10_000


def _key(i: int) -> bytes:
    return i.to_bytes(8, "big")


class _Lmdb(Adapter):
    packages = ("lmdb",)

    def encode(self, record: Record) -> bytes:
        raise NotImplementedError

    def decode(self, buf: Any) -> Record:
        raise NotImplementedError

    def write(self, records: Iterable[Record], path: Path) -> None:
        env = lmdb.open(str(path), map_size=MAP_SIZE, subdir=True, readahead=False)
        try:
            txn = env.begin(write=True)
            for i, r in enumerate(records):
                txn.put(_key(i), self.encode(r), append=True)
                if (i + 1) % COMMIT_EVERY == 0:
                    txn.commit()
                    txn = env.begin(write=True)
            txn.commit()
        finally:
            env.close()

    def open(self, path: Path) -> None:
        self.env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, readahead=False)
        self.txn = self.env.begin(buffers=self.zero_copy)
        self.n = self.txn.stat()["entries"]

    def get(self, i: int) -> Record:
        return self.decode(self.txn.get(_key(i)))

    def scan(self) -> Iterator[Record]:
        for _key_bytes, value in self.txn.cursor():
            yield self.decode(value)

    def close(self) -> None:
        self.txn.abort()
        self.env.close()


class LmdbPickle(_Lmdb):
    name = "lmdb_pickle"
    zero_copy = False
    notes = "pickle protocol 5 per record"

    def encode(self, record: Record) -> bytes:
        return pickle.dumps(record, protocol=5)

    def decode(self, buf: Any) -> Record:
        return pickle.loads(buf)


class LmdbRaw(_Lmdb):
    name = "lmdb_raw"
    zero_copy = True
    notes = "raw bytes, np.frombuffer views of LMDB's mmap (buffers=True)"

    def __init__(self, fields: tuple[Field, ...]):
        super().__init__(fields)
        self.packer = Packer(fields)

    def encode(self, record: Record) -> bytes:
        return self.packer.pack(record)

    def decode(self, buf: Any) -> Record:
        return self.packer.unpack(buf)
