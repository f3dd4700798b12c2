"""webdataset: POSIX tar shards, one member per field (``<key>.<field>.npy``, ``.cls``,
``.txt``), written with ``webdataset.ShardWriter``.

Random access uses ``wids.ShardListDataset``, which ships with webdataset 0.2.x (1.0 dropped
it): it memory-maps each shard and indexes its tar headers when the shard is first touched,
so ``open`` here touches every shard to include that indexing. Tensors are decoded from the
``.npy`` members with ``np.load`` (a copy). ``scan`` is the idiomatic sequential pipeline:
``WebDataset(shards).decode()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..workloads import Record
from . import Adapter, Unavailable

try:
    import webdataset as wds
    import wids
except ImportError as exc:
    raise Unavailable(
        f"{exc}: random access needs wids, shipped with webdataset 0.2.x (the bench extra "
        "pins webdataset==0.2.111)"
    ) from exc

SHARD_BYTES = 1 << 30  # webdataset's advice: shards of a few hundred MB to a few GB
SHARD_RECORDS = 100_000


class WebDatasetTar(Adapter):
    name = "webdataset"
    zero_copy = False
    packages = ("webdataset",)
    notes = "tar shards (1 GiB / 100k records); wids for random access; np.load decodes"

    def _member(self, k: int) -> str:
        f = self.fields[k]
        return {"tensor": f"{f.name}.npy", "int": f"{f.name}.cls", "str": f"{f.name}.txt"}[f.kind]

    def write(self, records: Iterable[Record], path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        members = [self._member(k) for k in range(len(self.fields))]
        pattern = str(path / "shard-%06d.tar")
        counts: dict[str, int] = {}  # wids needs each shard's sample count up front
        with wds.ShardWriter(
            pattern, maxsize=SHARD_BYTES, maxcount=SHARD_RECORDS, verbose=0
        ) as sink:
            for i, record in enumerate(records):
                sample: dict[str, Any] = {"__key__": f"{i:09d}"}
                for member, value in zip(members, record):
                    sample[member] = value
                sink.write(sample)
                counts[sink.fname] = counts.get(sink.fname, 0) + 1
        (path / "shards.txt").write_text(
            "".join(f"{Path(name).name} {count}\n" for name, count in counts.items())
        )

    def open(self, path: Path) -> None:
        self.shard_list = []
        for line in (path / "shards.txt").read_text().splitlines():
            name, count = line.split()
            self.shard_list.append({"url": str(path / name), "nsamples": int(count)})
        self.members = ["." + self._member(k) for k in range(len(self.fields))]
        self.ds = wids.ShardListDataset(
            self.shard_list,
            localname=lambda url: url,  # local files: no download cache
            transformations=[lambda sample: sample],
            lru_size=max(10, len(self.shard_list)),
        )
        start = 0
        for shard in self.shard_list:  # index every shard now, as open() does elsewhere
            self.ds[start]
            start += shard["nsamples"]

    def _decode(self, k: int, stream: Any) -> Any:
        kind = self.fields[k].kind
        if kind == "tensor":
            return np.load(stream)
        text = stream.read().decode()
        return int(text) if kind == "int" else text

    def get(self, i: int) -> Record:
        sample = self.ds[i]
        return [self._decode(k, sample[m]) for k, m in enumerate(self.members)]

    def scan(self) -> Iterator[Record]:
        urls = [s["url"] for s in self.shard_list]
        keys = [m[1:] for m in self.members]
        pipeline = wds.WebDataset(urls, shardshuffle=False).decode()
        for sample in pipeline:
            yield [sample[key] for key in keys]

    def close(self) -> None:
        self.ds.cache.clear()
