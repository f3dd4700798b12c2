"""The speed floor: one fixed-size .npy file per field, memory-mapped; strings as a
fixed-width bytes array. Only works for fixed-shape fields, which is the point."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..workloads import Record
from . import Adapter


class Floor(Adapter):
    name = "floor"
    zero_copy = True
    notes = "hand-written numpy memmap, one .npy per field"

    def write(self, records: Iterable[Record], path: Path) -> None:
        records = list(records)  # the layout needs the count and string width up front
        n = len(records)
        path.mkdir(parents=True, exist_ok=True)
        for k, f in enumerate(self.fields):
            file = path / f"{k}_{f.name}.npy"
            if f.kind == "str":
                encoded = [r[k].encode() for r in records]
                width = max((len(e) for e in encoded), default=1)
                np.save(file, np.array(encoded, dtype=f"S{max(width, 1)}"))
                continue
            shape = (n, *f.shape) if f.kind == "tensor" else (n,)
            dtype = f.dtype if f.kind == "tensor" else "int64"
            out = np.lib.format.open_memmap(file, mode="w+", dtype=dtype, shape=shape)
            for i, r in enumerate(records):
                out[i] = r[k]
            out.flush()
            del out

    batched = True
    columnar = True

    def write_columns(self, columns: list, path: Path, fsync: bool | None = None) -> None:
        """np.save per column; by default not fsynced (``fsync``: each file fsynced after
        it is written, and the directory after all, as a durable write must)."""
        path.mkdir(parents=True, exist_ok=True)
        for k, (f, column) in enumerate(zip(self.fields, columns)):
            if f.kind == "str":
                encoded = [s.encode() for s in column]
                width = max((len(e) for e in encoded), default=1)
                column = np.array(encoded, dtype=f"S{max(width, 1)}")
            with open(path / f"{k}_{f.name}.npy", "wb") as file:
                np.save(file, column)
                if fsync:
                    file.flush()
                    os.fsync(file.fileno())
        if fsync:
            directory = os.open(path, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def get_batch(self, indices: Sequence[int]) -> list:
        index = np.asarray(indices)
        out: list = []
        for f, col in zip(self.fields, self.columns):
            batch = col[index]  # numpy's fancy indexing: a stacked copy
            out.append([s.decode() for s in batch] if f.kind == "str" else batch)
        return out

    def open(self, path: Path) -> None:
        self.columns: list[Any] = []
        for k, f in enumerate(self.fields):
            mm = np.load(path / f"{k}_{f.name}.npy", mmap_mode="r")
            self.columns.append(mm.view(np.ndarray))  # plain ndarray views: cheaper indexing
        self.n = len(self.columns[0])

    def get(self, i: int) -> Record:
        out: Record = []
        for f, col in zip(self.fields, self.columns):
            if f.kind == "tensor":
                out.append(col[i])
            elif f.kind == "int":
                out.append(int(col[i]))
            else:
                out.append(col[i].decode())
        return out

    def close(self) -> None:
        self.columns = []


class FloorCopy(Floor):
    """The floor plus one memory pass: each tensor copied (one np.copyto) into a buffer
    allocated once. The yardstick of a verified read, which must touch every byte once."""

    name = "floor_copy"
    zero_copy = False
    notes = "the floor, each tensor copied by one np.copyto into a buffer reused per get"

    def open(self, path: Path) -> None:
        super().open(path)
        self.buffers = [
            np.empty(col.shape[1:], col.dtype) if f.kind == "tensor" else None
            for f, col in zip(self.fields, self.columns)
        ]

    def get(self, i: int) -> Record:
        out = super().get(i)
        for k, buffer in enumerate(self.buffers):
            if buffer is not None:
                np.copyto(buffer, out[k])
                out[k] = buffer
        return out

    def get_many(self, indices: Any) -> list[Record]:
        """Fresh copies: the records of a batch must not share one buffer."""
        batch = []
        for i in indices:
            record = Floor.get(self, int(i))
            batch.append([v.copy() if isinstance(v, np.ndarray) else v for v in record])
        return batch
