"""How cost grows with the work (issues 2 and 7).

1. Open time and random-get time at 10k, 100k, 1M and 10M records (W1-shaped but small:
   [int64[4], float32[2], int, str]), for evalue_store and the hand-written numpy floor.
   Open must stay flat: the index is mapped, never parsed.
2. Write throughput (MB/s) for records of one uint8 tensor of 100 B ... 64 MiB.

Run: python benchmarks/scaling.py [--max-records 10000000]
Writes benchmarks/results/scaling.{json,md} and scaling_open.png, scaling_get.png,
scaling_write.png (matplotlib, from the bench extra).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

import evalue_store as evs

RESULTS = Path(__file__).parent / "results"
WORK = Path(__file__).parent / "work" / "scaling"
GETS = 20_000


def small_records(n: int, chunk: int = 100_000):
    """W1-shaped records, small enough for 10M of them to fit on disk; generated in chunks."""
    for start in range(0, n, chunk):
        rng = np.random.default_rng(start)
        count = min(chunk, n - start)
        tokens = rng.integers(0, 50000, (count, 4))
        feats = rng.random((count, 2), dtype=np.float32)
        for j in range(count):
            i = start + j
            yield [tokens[j], feats[j], i % 10, f"ex-{i:08d}"]


def timed_open_and_get(open_fn, get_fn, n: int) -> dict:
    opens = []
    for _ in range(7):
        start = time.perf_counter()
        handle = open_fn()
        opens.append(time.perf_counter() - start)
    picks = np.random.default_rng(1).integers(0, n, min(GETS, n)).tolist()
    start = time.perf_counter()
    for i in picks:
        get_fn(handle, i)
    get_us = (time.perf_counter() - start) / len(picks) * 1e6
    return {"open_ms": statistics.median(opens) * 1e3, "get_us": get_us}


def evs_case(n: int) -> dict:
    path = WORK / f"evs-{n}.evs"
    start = time.perf_counter()
    with evs.Writer(path, durable=False) as w:
        w.extend(small_records(n))
    write_s = time.perf_counter() - start
    out = timed_open_and_get(lambda: evs.open(path), lambda ds, i: ds[i], n)
    out.update(write_rec_s=n / write_s, bytes=os.path.getsize(path))
    path.unlink()
    return out


def floor_case(n: int) -> dict:
    """The floor: one memory-mapped .npy per field (fixed shapes only)."""
    folder = WORK / f"floor-{n}"
    folder.mkdir(parents=True, exist_ok=True)
    cols = [
        np.lib.format.open_memmap(folder / "t.npy", "w+", np.int64, (n, 4)),
        np.lib.format.open_memmap(folder / "f.npy", "w+", np.float32, (n, 2)),
        np.lib.format.open_memmap(folder / "l.npy", "w+", np.int64, (n,)),
        np.lib.format.open_memmap(folder / "s.npy", "w+", "S11", (n,)),
    ]
    for k, record in enumerate(small_records(n)):
        cols[0][k], cols[1][k], cols[2][k], cols[3][k] = record[0], record[1], record[2], record[3]
    del cols

    def open_floor():
        return [np.load(folder / f"{x}.npy", mmap_mode="r") for x in "tfls"]

    def get(c, i):
        return [c[0][i], c[1][i], int(c[2][i]), c[3][i].decode()]

    out = timed_open_and_get(open_floor, get, n)
    shutil.rmtree(folder)
    return out


def write_sizes() -> dict:
    out = {}
    for size in (100, 10_000, 1 << 20, 64 << 20):
        count = max(4, (256 << 20) // size)
        record = [np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)]
        path = WORK / "sizes.evs"
        times = []
        for _ in range(3):
            start = time.perf_counter()
            with evs.Writer(path, durable=False) as w:
                for _ in range(count):
                    w.append(record)
            times.append(time.perf_counter() - start)
        path.unlink()
        out[size] = {"records": count, "mb_s": count * size / statistics.median(times) / 1e6}
        print("write", size, out[size], flush=True)
    return out


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted(int(n) for n in results["records"])
    for key, label, name in (
        ("open_ms", "open time (ms)", "scaling_open.png"),
        ("get_us", "random get (µs per record)", "scaling_get.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for fmt in ("evalue_store", "floor"):
            ax.plot(counts, [results["records"][str(n)][fmt][key] for n in counts], "o-", label=fmt)
        ax.set_xscale("log")
        ax.set_xlabel("records")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(RESULTS / name, dpi=100)
        plt.close(fig)
    sizes = sorted(int(s) for s in results["write"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, [results["write"][str(s)]["mb_s"] for s in sizes], "o-", label="evalue_store")
    ax.set_xscale("log")
    ax.set_xlabel("record size (bytes)")
    ax.set_ylabel("write MB/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "scaling_write.png", dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-records", type=int, default=10_000_000)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(exist_ok=True)
    counts = [n for n in (10_000, 100_000, 1_000_000, 10_000_000) if n <= args.max_records]
    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average_start": os.getloadavg(),
        },
        "command": f"python benchmarks/scaling.py --max-records {args.max_records}",
        "records": {},
    }
    for n in counts:
        results["records"][str(n)] = {"evalue_store": evs_case(n), "floor": floor_case(n)}
        print(n, results["records"][str(n)], flush=True)
    results["write"] = {str(k): v for k, v in write_sizes().items()}
    results["machine"]["load_average_end"] = os.getloadavg()
    (RESULTS / "scaling.json").write_text(json.dumps(results, indent=2))
    lines = [
        "# Scaling",
        "",
        f"`{results['command']}` · load average {results['machine']['load_average_start']}",
        "",
        "| records | evs open ms | floor open ms | evs get µs | floor get µs | evs write rec/s |",
        "|---|---|---|---|---|---|",
    ]
    for n in counts:
        e, f = results["records"][str(n)]["evalue_store"], results["records"][str(n)]["floor"]
        lines.append(
            f"| {n:,} | {e['open_ms']:.3f} | {f['open_ms']:.3f} | {e['get_us']:.2f} | "
            f"{f['get_us']:.2f} | {e['write_rec_s']:,.0f} |"
        )
    lines += ["", "| record size | write MB/s |", "|---|---|"]
    for size, row in results["write"].items():
        lines.append(f"| {int(size):,} B | {row['mb_s']:,.0f} |")
    lines += ["", "![open](scaling_open.png) ![get](scaling_get.png) ![write](scaling_write.png)"]
    (RESULTS / "scaling.md").write_text("\n".join(lines) + "\n")
    plot(results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
