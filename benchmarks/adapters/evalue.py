"""evalue_store, our library: Writer / open, records as lists of values."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..workloads import Field, Record
from . import Adapter, Unavailable

try:
    import evalue_store as evs
except ImportError as exc:  # pragma: no cover - the package is this repo
    raise Unavailable(f"import evalue_store failed: {exc}") from exc


class EvalueStore(Adapter):
    name = "evalue_store"
    zero_copy = True
    packages = ("evalue_store",)
    notes = "defaults (CRC verified on every read)"
    writer_options: dict[str, Any] = {}
    open_options: dict[str, Any] = {}

    def __init__(self, fields: tuple[Field, ...]):
        super().__init__(fields)
        for attr in ("Writer", "open"):
            if not hasattr(evs, attr):
                raise Unavailable(f"evalue_store has no {attr} yet (API not landed)")

    def write(self, records: Iterable[Record], path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        try:
            writer = evs.Writer(path / "data.evs", metadata={"bench": True}, **self.writer_options)
        except TypeError as exc:
            raise Unavailable(f"evs.Writer does not take {self.writer_options}: {exc}") from exc
        with writer as w:
            w.extend(records)

    batched = hasattr(evs, "Dataset") and hasattr(evs.Dataset, "get_batch")
    columnar = hasattr(evs, "Writer") and hasattr(evs.Writer, "extend_columns")

    columns_fsync = True  # Writer(durable=True), the default: each commit is fsynced

    def write_columns(self, columns: list, path: Path, fsync: bool | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = dict(self.writer_options, metadata={"bench": True})
        if fsync is not None:
            options["durable"] = fsync
        with evs.Writer(path / "data.evs", **options) as w:
            w.extend_columns(dict(enumerate(columns)))

    def get_batch(self, indices: Sequence[int]) -> list:
        return self.ds.get_batch(indices)

    def open(self, path: Path) -> None:
        try:
            self.ds = evs.open(path / "data.evs", **self.open_options)
        except TypeError as exc:
            raise Unavailable(f"evs.open does not take {self.open_options}: {exc}") from exc

    def get(self, i: int) -> Record:
        return self.ds[i]

    def get_many(self, indices: Sequence[int]) -> list[Record]:
        return self.ds[list(indices)]

    def scan(self) -> Iterator[Record]:
        return iter(self.ds)

    def close(self) -> None:
        close = getattr(self.ds, "close", None)
        if close is not None:
            close()


class EvalueStoreNoVerify(EvalueStore):
    name = "evalue_store_noverify"
    notes = "open(verify=False): no per-read CRC"
    open_options = {"verify": False}


class EvalueStoreZstd(EvalueStore):
    name = "evalue_store_zstd"
    zero_copy = False
    notes = 'Writer(compression="zstd"): level 1, 2 KiB frames, its own trained dictionary'
    writer_options = {"compression": "zstd"}
