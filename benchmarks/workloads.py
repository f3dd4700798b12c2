"""Workloads as data: a field list plus sizes; records are generated from a seed.

Every adapter receives the same records, in the same order, for a given workload and mode.
A record is a list with one value per field: ``numpy.ndarray`` for tensor fields, ``int`` for
int fields and ``str`` for str fields. Adapters must hand records back in exactly that form.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

Record = list[Any]


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # "tensor", "int" or "str"
    dtype: str = "int64"  # numpy dtype of a tensor (ints are always int64)
    shape: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of a fixed-size field (tensor or int); strings are variable."""
        if self.kind == "str":
            raise ValueError("str fields have no fixed size")
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    fields: tuple[Field, ...]
    n: int
    seed: int
    batch_size: int = 256

    def scaled(self, n: int, shapes: dict[str, tuple[int, ...]] | None = None) -> Workload:
        """The same workload with fewer records and optionally smaller tensors (for --quick)."""
        fields = tuple(
            replace(f, shape=shapes[f.name]) if shapes and f.name in shapes else f
            for f in self.fields
        )
        return replace(self, n=n, fields=fields)


W1 = Workload(
    name="W1",
    description="[int64[128] tokens, float32[16] features, int label, str id]",
    fields=(
        Field("tokens", "tensor", "int64", (128,)),
        Field("features", "tensor", "float32", (16,)),
        Field("label", "int"),
        Field("id", "str"),
    ),
    n=200_000,
    seed=1,
)

W2 = Workload(
    name="W2",
    description="[uint8[224,224,3] image, int label]",
    fields=(Field("image", "tensor", "uint8", (224, 224, 3)), Field("label", "int")),
    n=5_000,
    seed=2,
    batch_size=64,
)

W3 = Workload(
    name="W3",
    description="[float32 tensor of 64 MiB] (quick: 1 MiB): time to get one tensor",
    fields=(Field("weights", "tensor", "float32", (16 * 1024 * 1024,)),),
    n=8,
    seed=3,
    batch_size=2,
)

WORKLOADS: dict[str, Workload] = {w.name: w for w in (W1, W2, W3)}

QUICK: dict[str, Workload] = {
    "W1": W1.scaled(2_000),
    "W2": W2.scaled(100),
    "W3": W3.scaled(4, {"weights": (256 * 1024,)}),
}


# Scaling (issue 7): how open and random get grow with the record count (W1-shaped records,
# small so that 10M fit on disk), and how write throughput grows with the record size.
SCALING_COUNTS = (10_000, 100_000, 1_000_000, 10_000_000)
SCALING_SIZES = (100, 10_000, 1 << 20, 64 << 20)  # bytes per record
QUICK_SCALING_COUNTS = (1_000, 10_000)
QUICK_SCALING_SIZES = (100, 100_000)
SIZE_BYTES = 256 << 20  # records written per size: this many bytes' worth...
SIZE_RECORDS = (4, 200_000)  # ...but at least 4 and at most 200k records
QUICK_SIZE_BYTES = 4 << 20
QUICK_SIZE_RECORDS = (4, 2_000)


def scaling_workload(n: int) -> Workload:
    """``S<n>``: n records of [int64[4] tokens, float32[2] features, int label, str id]."""
    return Workload(
        name=f"S{n}",
        description="[int64[4] tokens, float32[2] features, int label, str id]",
        fields=(
            Field("tokens", "tensor", "int64", (4,)),
            Field("features", "tensor", "float32", (2,)),
            Field("label", "int"),
            Field("id", "str"),
        ),
        n=n,
        seed=4,
    )


def size_workload(size: int, quick: bool) -> Workload:
    """``B<size>``: records of one uint8 tensor of ``size`` bytes, a fixed total volume."""
    total, (low, high) = (
        (QUICK_SIZE_BYTES, QUICK_SIZE_RECORDS) if quick else (SIZE_BYTES, SIZE_RECORDS)
    )
    return Workload(
        name=f"B{size}",
        description=f"[uint8[{size}]]",
        fields=(Field("blob", "tensor", "uint8", (size,)),),
        n=min(max(total // size, low), high),
        seed=5,
        batch_size=min(64, max(2, (16 << 20) // size)),
    )


def get_workload(name: str, quick: bool) -> Workload:
    """W1, W2, W3 (shrunk with ``quick``), or a scaling point: ``S<records>``, ``B<bytes>``."""
    if name[:1] == "S" and name[1:].isdigit():
        return scaling_workload(int(name[1:]))
    if name[:1] == "B" and name[1:].isdigit():
        return size_workload(int(name[1:]), quick)
    return QUICK[name] if quick else WORKLOADS[name]


class Data:
    """The generated records of a workload, held column-wise; ``record(i)`` builds record i."""

    def __init__(self, workload: Workload):
        self.workload = workload
        rng = np.random.default_rng(workload.seed)
        n = workload.n
        self.columns: list[Any] = []
        for f in workload.fields:
            if f.kind == "tensor":
                self.columns.append(_random_tensor(rng, f, n))
            elif f.kind == "int":
                self.columns.append(rng.integers(0, 1000, size=n, dtype=np.int64))
            elif f.kind == "str":
                self.columns.append([f"ex-{i:06d}" for i in range(n)])
            else:
                raise ValueError(f"unknown field kind {f.kind!r}")

    def __len__(self) -> int:
        return self.workload.n

    def record(self, i: int) -> Record:
        out: Record = []
        for f, col in zip(self.workload.fields, self.columns):
            out.append(int(col[i]) if f.kind == "int" else col[i])
        return out

    def __iter__(self) -> Iterator[Record]:
        for i in range(self.workload.n):
            yield self.record(i)

    def payload_bytes(self) -> int:
        """Raw bytes of all field values (tensor bytes, 8 per int, UTF-8 length of strings)."""
        total = 0
        for f, col in zip(self.workload.fields, self.columns):
            if f.kind == "str":
                total += sum(len(s.encode()) for s in col)
            else:
                total += f.nbytes * self.workload.n
        return total


def _random_tensor(rng: np.random.Generator, f: Field, n: int) -> np.ndarray:
    shape = (n, *f.shape)
    dtype = np.dtype(f.dtype)
    if dtype.kind == "f":
        return rng.standard_normal(size=shape, dtype=np.float32).astype(dtype, copy=False)
    if dtype == np.uint8:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.integers(0, 50_000, size=shape, dtype=dtype)


def touch(record: Record) -> float:
    """Read every field the way a training loop would: a few tensor elements, the int, the
    string's length. Returns a number so that the work is not optimized away."""
    acc = 0.0
    for value in record:
        if isinstance(value, np.ndarray):
            flat = value.reshape(-1)
            acc += float(flat[0]) + float(flat[-1])
        elif isinstance(value, str):
            acc += len(value)
        else:
            acc += value
    return acc


def check_record(expected: Record, got: Any, where: str) -> str | None:
    """None if ``got`` equals ``expected`` exactly (types, dtypes, shapes, bytes), else why."""
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        return f"{where}: expected a list of {len(expected)} values, got {type(got).__name__}"
    for k, (want, have) in enumerate(zip(expected, got)):
        if isinstance(want, np.ndarray):
            if not isinstance(have, np.ndarray):
                return f"{where} field {k}: expected ndarray, got {type(have).__name__}"
            if have.dtype != want.dtype or have.shape != want.shape:
                return (
                    f"{where} field {k}: expected {want.dtype}{list(want.shape)}, "
                    f"got {have.dtype}{list(have.shape)}"
                )
            if have.tobytes() != want.tobytes():
                return f"{where} field {k}: tensor contents differ"
        elif type(have) is not type(want) or have != want:
            return f"{where} field {k}: expected {want!r}, got {have!r} ({type(have).__name__})"
    return None
