"""Format adapters: one small class per format/variant, all behind ``Adapter``.

An adapter is constructed with the workload's fields, then used as::

    adapter.write(records, path)      # path: a fresh directory owned by the adapter
    adapter.open(path)
    adapter.get(i) / adapter.get_many(indices) / adapter.scan()
    adapter.close()

Optional: ``get_batch(indices)`` (a batch as one value per field: stacked arrays, or lists)
and ``write_columns(columns, path, fsync)`` (the records given as ``Data.columns``), for
formats with a batch read or a columnar write; ``batched`` / ``columnar`` say whether there
is one. ``fsync`` None is the format's default (``columns_fsync`` says whether that default
makes the data durable before returning); True / False ask for it or not, so that the two
can be compared alike.

Records go in and come out as lists (see workloads.py). ``zero_copy`` says whether returned
tensors are views of the stored bytes (mmap) rather than copies.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from ..workloads import Field, Record


class Unavailable(Exception):
    """The adapter cannot run here (package missing, API not there yet...); the message says why."""


class Adapter(ABC):
    name: str = ""
    zero_copy: bool = False
    packages: tuple[str, ...] = ()  # distributions whose versions go into the results
    notes: str = ""
    n: int = 0  # records, once opened (the default scan() reads 0..n-1)

    def __init__(self, fields: tuple[Field, ...]):
        self.fields = fields

    @abstractmethod
    def write(self, records: Iterable[Record], path: Path) -> None: ...

    @abstractmethod
    def open(self, path: Path) -> None: ...

    @abstractmethod
    def get(self, i: int) -> Record: ...

    batched = False  # has get_batch
    columnar = False  # has write_columns
    columns_fsync = False  # write_columns' default makes the data durable (fsync) first

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        return [self.get(int(i)) for i in indices]

    def get_batch(self, indices: Sequence[int]) -> list:
        raise NotImplementedError

    def write_columns(self, columns: list, path: Path, fsync: bool | None = None) -> None:
        raise NotImplementedError

    def scan(self) -> Iterator[Record]:
        """Every record in order. This default, for formats without a sequential reader of
        their own, gets them one by one; it needs ``self.n``, the record count."""
        for i in range(self.n):
            yield self.get(i)

    @abstractmethod
    def close(self) -> None:
        """Release the opened dataset."""


# name -> "module:Class", in report order. Modules are imported only when used, so that a
# missing package makes only its own adapters unavailable.
ADAPTERS: dict[str, str] = {
    "floor": "floor:Floor",
    "floor_copy": "floor:FloorCopy",
    "npz": "npz:Npz",
    "lmdb_pickle": "lmdb_store:LmdbPickle",
    "lmdb_raw": "lmdb_store:LmdbRaw",
    "evalue_store": "evalue:EvalueStore",
    "evalue_store_noverify": "evalue:EvalueStoreNoVerify",
    "evalue_store_zstd": "evalue:EvalueStoreZstd",
    "mds": "mds:Mds",
    "mds_zstd": "mds:MdsZstd",
    "array_record": "arrayrecord:ArrayRecord",
    "array_record_zstd": "arrayrecord:ArrayRecordZstd",
    "hf_datasets": "hf:HfDatasets",
    "webdataset": "webdataset_tar:WebDatasetTar",
    "safetensors": "safetensors_file:Safetensors",
}

OURS = ("evalue_store", "evalue_store_noverify", "evalue_store_zstd")
FLOOR = "floor"
# Yardsticks, not peers: floor_copy is the floor plus one memory pass (np.copyto), the cost a
# verified read is measured against (issue 13).
REFERENCES = (FLOOR, "floor_copy")


def load_adapter(name: str, fields: tuple[Field, ...]) -> Adapter:
    """Instantiate adapter ``name``; raises Unavailable with the reason if it cannot run."""
    module_name, class_name = ADAPTERS[name].split(":")
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as exc:
        raise Unavailable(f"import failed: {exc}") from exc
    cls: type[Adapter] = getattr(module, class_name)
    return cls(fields)
