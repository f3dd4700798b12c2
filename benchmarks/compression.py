"""The zstd frame layer's choices, measured (issue 3): frame size, dictionary, incompressible data.

For each workload: size relative to the plain container, write records/s, random get
(median µs over a random permutation, every field touched), sequential scan records/s, for
the plain container and for zstd at several frame sizes, with and without a dictionary.
Medians of --repeat runs in this process; the plain container is the yardstick in the same run.

Run: python benchmarks/compression.py [--records 50000] [--repeat 3]
Writes benchmarks/results/compression.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import evalue_store as evs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import touch  # noqa: E402  (the harness's own field-touching rule)

RESULTS = Path(__file__).parent / "results"
WORK = Path(__file__).parent / "work"


def w1(n: int) -> list:
    rng = np.random.default_rng(0)
    return [
        [rng.integers(0, 50000, 128), rng.random(16, dtype=np.float32), i % 10, f"ex-{i:06d}"]
        for i in range(n)
    ]


def noise(n: int) -> list:
    """Incompressible: random float32 tensors (4 KiB each) and an int."""
    rng = np.random.default_rng(1)
    return [[rng.random(1024, dtype=np.float32), i] for i in range(n)]


def w2(n: int) -> list:
    """Image-like: uint8[224, 224, 3] with smooth content (compressible) and a label."""
    rng = np.random.default_rng(2)
    base = np.linspace(0, 255, 224 * 224 * 3).astype(np.uint8).reshape(224, 224, 3)
    return [[(base + rng.integers(0, 8, base.shape, dtype=np.uint8)), i % 1000] for i in range(n)]


def measure(records: list, options: dict, repeat: int, gets: int) -> dict:
    path = WORK / "compression.evs"
    writes, randoms, scans = [], [], []
    perm = np.random.default_rng(3).permutation(len(records))[:gets].tolist()
    for _ in range(repeat):
        start = time.perf_counter()
        with evs.Writer(path, durable=False, **options) as w:
            w.extend(records)
        writes.append(len(records) / (time.perf_counter() - start))
        with evs.open(path) as ds:
            start = time.perf_counter()
            for i in perm:
                touch(ds[i])
            randoms.append((time.perf_counter() - start) / len(perm) * 1e6)
        with evs.open(path) as ds:
            start = time.perf_counter()
            for record in ds:
                touch(record)
            scans.append(len(records) / (time.perf_counter() - start))
    size = os.path.getsize(path)
    path.unlink()
    return {
        "bytes": size,
        "write_rec_s": statistics.median(writes),
        "get_us": statistics.median(randoms),
        "scan_rec_s": statistics.median(scans),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000, help="W1 records")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    RESULTS.mkdir(exist_ok=True)
    workloads = {
        f"W1 ({args.records:,} x [int64[128], float32[16], int, str])": w1(args.records),
        f"W2 ({max(args.records // 40, 50):,} x [uint8[224,224,3], int])": w2(
            max(args.records // 40, 50)
        ),
        f"noise ({args.records // 4:,} x [float32[1024] random, int])": noise(args.records // 4),
    }
    variants = {"plain": {}}
    for frame_kib in (4, 8, 16):
        variants[f"zstd {frame_kib} KiB frames"] = {
            "compression": "zstd",
            "frame_size": frame_kib << 10,
        }
    out: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average": os.getloadavg(),
        },
        "command": f"python benchmarks/compression.py --records {args.records} "
        f"--repeat {args.repeat}",
        "workloads": {},
    }
    lines = [
        "# Frame layer: frame size, dictionary, incompressible data",
        "",
        f"`{out['command']}`; medians of {args.repeat} runs; ratios against the plain "
        "container in the same run (size: smaller is better; get: µs per random record, "
        "lower is better).",
    ]
    for name, records in workloads.items():
        rows = {}
        dictionary = evs.train_dictionary(records[:1000])
        chosen = dict(variants)
        chosen["zstd 4 KiB frames + dictionary"] = {
            "compression": "zstd",
            "frame_size": 4 << 10,
            "dictionary": dictionary,
        }
        for label, options in chosen.items():
            rows[label] = measure(records, options, args.repeat, min(20000, len(records)))
            print(name, label, rows[label], flush=True)
        out["workloads"][name] = rows
        plain = rows["plain"]
        lines += [
            "",
            f"## {name}",
            "",
            "| variant | size ratio | write rec/s | get µs | get vs plain | scan rec/s |",
            "|---|---|---|---|---|---|",
        ]
        for label, r in rows.items():
            lines.append(
                f"| {label} | {r['bytes'] / plain['bytes']:.3f} | {r['write_rec_s']:,.0f} | "
                f"{r['get_us']:.1f} | {r['get_us'] / plain['get_us']:.2f}x | "
                f"{r['scan_rec_s']:,.0f} |"
            )
    (RESULTS / "compression.json").write_text(json.dumps(out, indent=2))
    (RESULTS / "compression.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
