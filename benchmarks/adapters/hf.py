"""Hugging Face datasets (Arrow): Dataset.from_generator + save_to_disk, load_from_disk with
the numpy format."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..workloads import Field, Record
from . import Adapter, Unavailable

try:
    import datasets
except ImportError as exc:
    raise Unavailable(f"import datasets failed: {exc}") from exc

SCAN_BATCH = 1000

# from_generator hashes (pickles) the generator function to fingerprint the dataset, so the
# records cannot be captured in a closure; they are handed over through this module global.
_PENDING: list[Any] = []


def _generate() -> Iterator[dict[str, Any]]:
    records, names = _PENDING
    for r in records:
        yield dict(zip(names, r))


def _feature(f: Field) -> Any:
    if f.kind == "int":
        return datasets.Value("int64")
    if f.kind == "str":
        return datasets.Value("string")
    if len(f.shape) == 1:
        return datasets.Sequence(datasets.Value(f.dtype), length=f.shape[0])
    array_types = {2: datasets.Array2D, 3: datasets.Array3D, 4: datasets.Array4D}
    return array_types[len(f.shape)](shape=f.shape, dtype=f.dtype)


class HfDatasets(Adapter):
    name = "hf_datasets"
    zero_copy = False
    packages = ("datasets", "pyarrow")
    notes = 'from_generator + save_to_disk; load_from_disk().with_format("numpy")'

    def __init__(self, fields: tuple[Field, ...]):
        super().__init__(fields)
        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
        self.names = [f.name for f in fields]

    def write(self, records: Iterable[Record], path: Path) -> None:
        features = datasets.Features({f.name: _feature(f) for f in self.fields})
        cache = path / "cache"
        _PENDING[:] = [iter(records), self.names]
        try:
            ds = datasets.Dataset.from_generator(_generate, features=features, cache_dir=str(cache))
            ds.save_to_disk(str(path / "saved"))
            del ds
        finally:
            _PENDING.clear()
        shutil.rmtree(cache)

    def open(self, path: Path) -> None:
        self.ds = datasets.load_from_disk(str(path / "saved")).with_format("numpy")
        self.n = len(self.ds)

    def _record(self, row: dict[str, Any]) -> Record:
        out: Record = []
        for f in self.fields:
            value = row[f.name]
            if f.kind == "int":
                value = int(value)
            elif f.kind == "str":
                value = str(value)
            elif value.dtype != f.dtype:  # the numpy formatter widens Array2D/3D to int64
                value = value.astype(f.dtype)
            out.append(value)
        return out

    def _records(self, batch: dict[str, Any]) -> list[Record]:
        columns = [batch[name] for name in self.names]
        count = len(columns[0])
        return [self._record({n: c[j] for n, c in zip(self.names, columns)}) for j in range(count)]

    def get(self, i: int) -> Record:
        return self._record(self.ds[i])

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        return self._records(self.ds[[int(i) for i in indices]])

    def scan(self) -> Iterator[Record]:
        for batch in self.ds.iter(batch_size=SCAN_BATCH):
            yield from self._records(batch)

    def close(self) -> None:
        del self.ds
