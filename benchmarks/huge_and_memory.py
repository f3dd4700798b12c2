"""Two core claims measured directly (issue 2):

1. Tensors over 4 GiB round-trip, and getting one costs the same as getting a small one
   (zero-copy: the time does not grow with the tensor's size).
2. The reader's private memory (RSS minus file-backed pages) does not grow with the number
   of records read.

Run: python benchmarks/huge_and_memory.py [--huge-gib 5] [--records 200000]
Writes benchmarks/results/huge_and_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import evalue_store as evs

RESULTS = Path(__file__).parent / "results"
WORK = Path(__file__).parent / "work"


def rss_private_kib() -> int:
    """Anonymous resident memory: RSS without the mapped file's page-cache pages."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def time_get(ds: evs.Dataset, index: int, repeat: int = 201) -> float:
    """Median seconds to get a record's first tensor and touch one element of it."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        tensor = ds[index][0]
        tensor.reshape(-1)[-1]  # touch the last element: the view is real
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def huge_tensors(gib: float) -> dict:
    path = WORK / "huge.evs"
    sizes = {"64 KiB": 1 << 16, "64 MiB": 64 << 20, f"{gib:g} GiB": int(gib * (1 << 30))}
    with evs.Writer(path, durable=False) as w:
        for nbytes in sizes.values():
            array = np.zeros(nbytes, np.uint8)
            array[::4096] = 7  # sparse marks we check after reading it back
            array[-1] = 9
            start = time.perf_counter()
            w.append([array])
            del array
        write_s = time.perf_counter() - start
    ds = evs.open(path, verify=False)  # verify=True would hash every byte on each get
    out = {"write_largest_s": write_s, "get_median_us": {}}
    for i, (name, nbytes) in enumerate(sizes.items()):
        tensor = ds[i][0]
        assert tensor.nbytes == nbytes and tensor[-1] == 9 and tensor[4096 * 3] == 7
        out["get_median_us"][name] = time_get(ds, i) * 1e6
    ds.close()
    path.unlink()
    return out


def private_memory(records: int) -> dict:
    path = WORK / "w1.evs"
    rng = np.random.default_rng(0)
    with evs.Writer(path, durable=False) as w:
        for i in range(records):
            w.append(
                [
                    rng.integers(0, 50000, 128),
                    rng.random(16, dtype=np.float32),
                    i % 10,
                    f"ex-{i:06d}",
                ]
            )
    ds = evs.open(path)
    samples = []
    before = rss_private_kib()
    for i, record in enumerate(ds):
        if i % (records // 10) == 0:
            samples.append((i, rss_private_kib() - before))
        del record
    samples.append((records, rss_private_kib() - before))
    ds.close()
    path.unlink()
    return {"records": records, "private_kib_growth_at": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--huge-gib", type=float, default=5.0)
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    RESULTS.mkdir(exist_ok=True)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "huge": huge_tensors(args.huge_gib),
        "memory": private_memory(args.records),
        "command": f"python benchmarks/huge_and_memory.py --huge-gib {args.huge_gib:g} "
        f"--records {args.records}",
    }
    (RESULTS / "huge_and_memory.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
