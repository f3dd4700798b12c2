"""The zstd layer's targets (issue 13, item 4), measured in one run: W1 size against the raw
bytes, W1 random get against our plain get (and ArrayRecord zstd's, when installed), open at
10M records, and get at 10M records against get at 100k.

Run: python benchmarks/zstd_targets.py [--quick] [--counts 100000,10000000]
(quick: 2k W1 records, 10k/100k points)
Writes benchmarks/results/zstd_targets.json and .md (quick: zstd_targets_quick.*).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import evalue_store as evs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import QUICK, W1, Data, scaling_workload, touch  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def write(path: str, data: Data, **options) -> None:
    with evs.Writer(path, durable=False, **options) as w:
        w.extend(iter(data))


def get_us(path: str, n: int, gets: int, repeat: int) -> float:
    """Median over ``repeat`` runs of µs per random get (a fresh open each run, so the
    first gets are cold), every field touched."""
    perm = np.random.default_rng(3).integers(0, n, gets).tolist()
    runs = []
    for _ in range(repeat):
        with evs.open(path) as ds:
            start = time.perf_counter()
            for i in perm:
                touch(ds[i])
            runs.append((time.perf_counter() - start) / gets * 1e6)
    return statistics.median(runs)


def open_ms(path: str, repeat: int = 21) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        evs.open(path).close()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def arrayrecord_get_us(data: Data, work: str, gets: int, repeat: int) -> float | None:
    """The same gets from ArrayRecord zstd (benchmarks/adapters/arrayrecord.py), or None when
    it is not installed."""
    from benchmarks.adapters import Unavailable

    try:
        from benchmarks.adapters.arrayrecord import ArrayRecordZstd
    except Unavailable:
        return None
    adapter = ArrayRecordZstd(data.workload.fields)
    path = Path(work) / "ar"
    adapter.write(iter(data), path)
    perm = np.random.default_rng(3).integers(0, len(data), gets).tolist()
    runs = []
    for _ in range(repeat):
        adapter.open(path)
        start = time.perf_counter()
        for i in perm:
            touch(adapter.get(i))
        runs.append((time.perf_counter() - start) / gets * 1e6)
        adapter.close()
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--counts", help="the two scaling points, e.g. 100000,1000000")
    args = parser.parse_args()
    w1 = QUICK["W1"] if args.quick else W1.scaled(50_000)
    small, big = (10_000, 100_000) if args.quick else (100_000, 10_000_000)
    if args.counts:
        small, big = (int(c) for c in args.counts.split(","))
    gets = 2_000 if args.quick else 20_000
    out: dict = {"command": " ".join(["python benchmarks/zstd_targets.py", *sys.argv[1:]])}
    with tempfile.TemporaryDirectory(dir=os.environ.get("EVS_BENCH_DIR")) as work:
        data = Data(w1)
        raw = data.payload_bytes()
        plain, packed = os.path.join(work, "w1.evs"), os.path.join(work, "w1.evs.zst")
        write(plain, data)
        write(packed, data, compression="zstd")
        out["w1"] = {
            "records": len(data),
            "size_ratio": os.path.getsize(packed) / raw,
            "plain_get_us": get_us(plain, len(data), gets, args.repeat),
            "zstd_get_us": get_us(packed, len(data), gets, args.repeat),
            "arrayrecord_zstd_get_us": arrayrecord_get_us(data, work, gets, args.repeat),
        }
        print(out["w1"], flush=True)
        os.unlink(plain)
        scaling = {}
        for n in (small, big):
            path = os.path.join(work, f"s{n}.evs.zst")
            start = time.perf_counter()
            write(path, Data(scaling_workload(n)), compression="zstd")
            scaling[n] = {
                "write_s": time.perf_counter() - start,
                "open_ms": open_ms(path),
                "get_us": get_us(path, n, gets, args.repeat),
            }
            print(n, scaling[n], flush=True)
            os.unlink(path)
        out["scaling"] = {str(k): v for k, v in scaling.items()}
    r, s = out["w1"], scaling
    ar = r["arrayrecord_zstd_get_us"]
    rows = [
        ("W1 size / raw bytes", f"{r['size_ratio']:.3f}x", "<= 0.40x"),
        ("W1 zstd get / plain get", f"{r['zstd_get_us'] / r['plain_get_us']:.2f}x", "<= 2x"),
        (
            "W1 zstd get / ArrayRecord zstd get",
            "n/a" if ar is None else f"{r['zstd_get_us'] / ar:.2f}x",
            "<= 1x",
        ),
        (f"open at {big:,} records", f"{s[big]['open_ms']:.3f} ms", "< 2 ms"),
        (
            f"get at {big:,} / get at {small:,}",
            f"{s[big]['get_us'] / s[small]['get_us']:.2f}x",
            "<= 1.5x",
        ),
    ]
    lines = [
        "# zstd layer targets (issue 13)",
        "",
        f"`{out['command']}`; medians of {args.repeat} runs, one process, ratios within the run."
        f" W1: {len(data):,} records; gets: µs per random record, every field touched: plain "
        f"{r['plain_get_us']:.2f}, zstd {r['zstd_get_us']:.2f}, ArrayRecord zstd "
        + ("n/a" if ar is None else f"{ar:.2f}")
        + f". Scaling (W1-shaped small records, zstd): open {s[small]['open_ms']:.3f} ms and get "
        f"{s[small]['get_us']:.2f} µs at {small:,}; open {s[big]['open_ms']:.3f} ms and get "
        f"{s[big]['get_us']:.2f} µs at {big:,}.",
        "",
        "| row | measured | target |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
    ]
    name = "zstd_targets_quick" if args.quick else "zstd_targets"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2))
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
