"""One .npz file per record (numpy's own zip container; strings as 0-d unicode arrays)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..workloads import Record
from . import Adapter

PER_DIR = 10_000  # files per subdirectory


class Npz(Adapter):
    name = "npz"
    zero_copy = False
    notes = "np.savez, one file per record"

    def _file(self, i: int) -> Path:
        return self.path / f"{i // PER_DIR:04d}" / f"{i:08d}.npz"

    def write(self, records: Iterable[Record], path: Path) -> None:
        self.path = path
        n = 0
        for i, r in enumerate(records):
            if i % PER_DIR == 0:
                (path / f"{i // PER_DIR:04d}").mkdir(parents=True, exist_ok=True)
            arrays = {f"f{k}": np.asarray(v) for k, v in enumerate(r)}
            np.savez(self._file(i), **arrays)
            n += 1
        (path / "count").write_text(str(n))

    def open(self, path: Path) -> None:
        self.path = path
        self.n = int((path / "count").read_text())

    def get(self, i: int) -> Record:
        out: Record = []
        with np.load(self._file(i)) as z:
            for k, f in enumerate(self.fields):
                value = z[f"f{k}"]
                if f.kind == "int":
                    out.append(int(value))
                elif f.kind == "str":
                    out.append(str(value))
                else:
                    out.append(value)
        return out

    def close(self) -> None:
        self.n = 0
