"""MosaicML Streaming's MDS format: MDSWriter, read back with StreamingDataset on a local dir.

``import streaming`` imports torchvision (for its vision datasets, which this benchmark does
not use). The PyPI torchvision wheels are built against CUDA torch and fail to load next to the
CPU-only torch used here, so when torchvision is not importable a stub stands in for it; the
MDS writer and reader never call it.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..workloads import Record
from . import Adapter, Unavailable


def _stub_torchvision() -> None:
    torchvision = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")

    class VisionDataset:  # only subclassed by streaming.vision, never used here
        def __init__(self, *args: Any, **kwargs: Any):
            raise RuntimeError("torchvision is stubbed out in this benchmark")

    def to_tensor(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("torchvision is stubbed out in this benchmark")

    datasets.VisionDataset = VisionDataset  # type: ignore[attr-defined]
    datasets.CIFAR10 = VisionDataset  # type: ignore[attr-defined]
    functional.to_tensor = to_tensor  # type: ignore[attr-defined]
    torchvision.datasets = datasets  # type: ignore[attr-defined]
    torchvision.transforms = transforms  # type: ignore[attr-defined]
    transforms.functional = functional  # type: ignore[attr-defined]
    sys.modules.update(
        {
            "torchvision": torchvision,
            "torchvision.datasets": datasets,
            "torchvision.transforms": transforms,
            "torchvision.transforms.functional": functional,
        }
    )


def _import_streaming() -> Any:
    try:
        import torchvision  # noqa: F401
    except Exception:  # ImportError, or RuntimeError from a CUDA-built wheel
        sys.modules.pop("torchvision", None)
        try:
            # transformers probes for torchvision when imported; let it see none first.
            import transformers  # noqa: F401
        except ImportError:
            pass
        _stub_torchvision()
    try:
        import streaming
    except Exception as exc:
        raise Unavailable(f"import streaming failed: {exc!r}") from exc
    return streaming


streaming = _import_streaming()
TORCHVISION_STUBBED = isinstance(sys.modules.get("torchvision"), types.ModuleType) and not hasattr(
    sys.modules["torchvision"], "__file__"
)


class Mds(Adapter):
    name = "mds"
    zero_copy = False
    packages = ("mosaicml-streaming",)
    notes = "MDSWriter, StreamingDataset(local=...)"
    compression: str | None = None

    def _columns(self) -> dict[str, str]:
        columns = {}
        for f in self.fields:
            if f.kind == "tensor":
                columns[f.name] = f"ndarray:{f.dtype}:{','.join(str(d) for d in f.shape)}"
            else:
                columns[f.name] = "int" if f.kind == "int" else "str"
        return columns

    def write(self, records: Iterable[Record], path: Path) -> None:
        names = [f.name for f in self.fields]
        largest = sum(f.nbytes for f in self.fields if f.kind != "str")
        size_limit = max(1 << 26, 2 * largest + (1 << 20))  # a shard must hold one sample
        with streaming.MDSWriter(
            out=str(path),
            columns=self._columns(),
            compression=self.compression,
            size_limit=size_limit,
            progress_bar=False,
        ) as writer:
            for r in records:
                writer.write(dict(zip(names, r)))

    def open(self, path: Path) -> None:
        streaming.base.util.clean_stale_shared_memory()
        # predownload defaults to 8 x batch_size samples, and the iterator's threads sleep 7 ms
        # whenever they get that far ahead (batch_size=1: about 1,100 samples/s). Everything is
        # local here, so let them run ahead without limit.
        self.ds = streaming.StreamingDataset(
            local=str(path), remote=None, shuffle=False, batch_size=256, predownload=1 << 30
        )
        self.names = [f.name for f in self.fields]

    def _record(self, sample: dict[str, Any]) -> Record:
        return [sample[name] for name in self.names]

    def get(self, i: int) -> Record:
        return self._record(self.ds.get_item(i))

    def scan(self) -> Iterator[Record]:
        for sample in self.ds:
            yield self._record(sample)

    def close(self) -> None:
        del self.ds
        gc.collect()


class MdsZstd(Mds):
    name = "mds_zstd"
    notes = 'MDSWriter(compression="zstd"), shards decompressed on first access'
    compression = "zstd"
