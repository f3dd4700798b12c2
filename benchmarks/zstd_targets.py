"""The zstd layer's targets (issue 13, item 4), measured in one run: W1 size against the raw
bytes, W1 random get against our plain get (and ArrayRecord zstd's, when installed), open at
10M records, and get at 10M records against get at 100k.

Run: python benchmarks/zstd_targets.py [--quick] [--counts 100000,10000000] [--keep DIR]
(quick: 2k W1 records, 10k/100k points; --keep: scaling files are written to DIR once and
reused by later runs). Besides the defaults, W1 is also measured with the defaults before
(4 KiB frames, no dictionary; 8 KiB at level 3 before issue 13), with 2 KiB frames and no
dictionary, and with a dictionary given; the scaling points are also
measured with no frame cache (every get decompresses), which isolates the lookup cost from
the cache's hit rate, and warm: after 50,000 other gets, when nearly all of the file is in the
process's page tables (the first gets after an open fault pages in, a cost that grows with
the file and is paid once per open). Times are wall-clock and CPU (process) time: on a
shared machine the CPU time is the steadier of the two.
Writes benchmarks/results/zstd_targets.json and .md (quick: zstd_targets_quick.*).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
    """The records, written column by column (the bytes are those of appending each)."""
    columns = {k: col for k, col in enumerate(data.columns)}
    with evs.Writer(path, durable=False, **options) as w:
        w.extend_columns(columns)


def get_us(
    path: str, n: int, gets: int, repeat: int, warmup: int = 0, **options
) -> tuple[float, float, float]:
    """Medians over ``repeat`` runs of (wall µs, CPU µs, page faults) per random get, every
    field touched, each run a fresh open: the first gets after it are cold (the file's
    pages are not yet in the process's page tables: a fault each, which maps 64 KiB around
    the page). ``warmup``: random gets made (other records) before the timed ones, after
    which most of the mapping is in the page tables, as in a long training run."""
    perm = np.random.default_rng(3).integers(0, n, gets).tolist()
    before = np.random.default_rng(5).integers(0, n, warmup).tolist()
    wall, cpu, faults = [], [], []
    for _ in range(repeat):
        with evs.open(path, **options) as ds:
            for i in before:
                touch(ds[i])
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start, start_cpu = time.perf_counter(), time.process_time()
            for i in perm:
                touch(ds[i])
            wall.append((time.perf_counter() - start) / gets * 1e6)
            cpu.append((time.process_time() - start_cpu) / gets * 1e6)
            faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / gets)
    return statistics.median(wall), statistics.median(cpu), statistics.median(faults)


def open_ms(path: str, repeat: int = 21) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        evs.open(path).close()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def arrayrecord_zstd(data: Data, work: str) -> tuple | None:
    """``data`` written by ArrayRecord zstd (benchmarks/adapters/arrayrecord.py) under
    ``work``: (adapter, path), or None when it is not installed."""
    from benchmarks.adapters import Unavailable

    try:
        from benchmarks.adapters.arrayrecord import ArrayRecordZstd
    except Unavailable:
        return None
    adapter = ArrayRecordZstd(data.workload.fields)
    path = Path(work) / "ar"
    adapter.write(iter(data), path)
    return adapter, path


def arrayrecord_get_us(data: Data, work: str, gets: int, repeat: int) -> tuple | None:
    """The same gets from ArrayRecord zstd: (wall, CPU) µs and the size ratio, or None when
    it is not installed."""
    written = arrayrecord_zstd(data, work)
    if written is None:
        return None
    adapter, path = written
    size = sum(f.stat().st_size for f in path.iterdir()) / data.payload_bytes()
    perm = np.random.default_rng(3).integers(0, len(data), gets).tolist()
    wall, cpu = [], []
    for _ in range(repeat):
        adapter.open(path)
        start, start_cpu = time.perf_counter(), time.process_time()
        for i in perm:
            touch(adapter.get(i))
        wall.append((time.perf_counter() - start) / gets * 1e6)
        cpu.append((time.process_time() - start_cpu) / gets * 1e6)
        adapter.close()
    return statistics.median(wall), statistics.median(cpu), size


W1_FILES = {  # name: Writer options (None: plain)
    "plain": None,
    "zstd": {},  # the defaults: 2 KiB frames, level 1, a dictionary trained on the first frames
    "zstd_2k_nodict": {"dictionary": None},
    "zstd_4k_nodict": {"frame_size": 4 << 10, "dictionary": None},  # the defaults before
    "zstd_8k_level3": {"frame_size": 8 << 10, "level": 3, "dictionary": None},  # before issue 13
    "zstd_dictionary": "dictionary",  # train_dictionary on 1 in 1,000 records (16 KiB)
}


def w1_point(data: Data, work: str, gets: int, repeat: int) -> dict:
    raw = data.payload_bytes()
    sizes, times = {}, {}
    for name, options in W1_FILES.items():
        path = os.path.join(work, f"w1_{name}.evs")
        if options is None:
            write(path, data)
        else:
            if options == "dictionary":
                sample = [data.record(i) for i in range(0, len(data), max(1, len(data) // 1000))]
                options = {"dictionary": evs.train_dictionary(sample, size=16 << 10)}
            write(path, data, compression="zstd", **options)
        sizes[name] = os.path.getsize(path) / raw
    runs: dict[str, list] = {name: [] for name in W1_FILES}
    for _ in range(repeat):  # interleaved, after every file is written: the load is shared
        for name in W1_FILES:
            runs[name].append(get_us(os.path.join(work, f"w1_{name}.evs"), len(data), gets, 1))
    for name, got in runs.items():
        times[name] = tuple(statistics.median(x) for x in zip(*got))
    ar = arrayrecord_get_us(data, work, gets, repeat)
    if ar is not None:
        times["arrayrecord_zstd"], sizes["arrayrecord_zstd"] = ar[:2], ar[2]
    for name in W1_FILES:
        os.unlink(os.path.join(work, f"w1_{name}.evs"))
    return {"records": len(data), "size_ratio": sizes, "get_us": times}


GET_KINDS = ("get_us", "uncached_get_us", "warm_get_us", "warm_uncached_get_us")

# Random gets before the warm figures: each touches two places of the file (its locator
# group, its frame); a 662 MB file (10M records) has ~10,000 regions of 64 KiB, nearly all
# mapped after 50,000 gets.
WARMUP = 50_000


def scaling_point(n: int, keep: str, gets: int, repeat: int) -> dict:
    path = os.path.join(keep, f"s{n}.evs.zst")
    out: dict = {}
    if not os.path.exists(path):
        start = time.perf_counter()
        write(path + ".part", Data(scaling_workload(n)), compression="zstd")
        os.replace(path + ".part", path)
        out["write_s"] = time.perf_counter() - start
    out["file_bytes"] = os.path.getsize(path)
    out["open_ms"] = open_ms(path)
    out["get_us"] = get_us(path, n, gets, repeat)
    out["uncached_get_us"] = get_us(path, n, gets, repeat, cache_bytes=1)
    out["warm_get_us"] = get_us(path, n, gets, repeat, warmup=WARMUP)
    out["warm_uncached_get_us"] = get_us(path, n, gets, repeat, warmup=WARMUP, cache_bytes=1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--counts", help="the two scaling points, e.g. 100000,1000000")
    parser.add_argument("--keep", help="directory the scaling files are kept in and reused")
    args = parser.parse_args()
    w1 = QUICK["W1"] if args.quick else W1.scaled(50_000)
    small, big = (10_000, 100_000) if args.quick else (100_000, 10_000_000)
    if args.counts:
        small, big = (int(c) for c in args.counts.split(","))
    gets = 2_000 if args.quick else 20_000
    out: dict = {"command": " ".join(["python benchmarks/zstd_targets.py", *sys.argv[1:]])}
    with tempfile.TemporaryDirectory(dir=os.environ.get("EVS_BENCH_DIR")) as work:
        data = Data(w1)
        out["w1"] = w1_point(data, work, gets, args.repeat)
        print(out["w1"], flush=True)
        scaling = {}
        for n in (small, big):
            scaling[n] = scaling_point(n, args.keep or work, gets, args.repeat)
            print(n, scaling[n], flush=True)
            if not args.keep:
                os.unlink(os.path.join(work, f"s{n}.evs.zst"))
        out["scaling"] = {str(k): v for k, v in scaling.items()}
    name = "zstd_targets_quick" if args.quick else "zstd_targets"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2))
    (RESULTS / f"{name}.md").write_text(report(out, args.repeat, small, big) + "\n")
    print(report(out, args.repeat, small, big))


def report(out: dict, repeat: int, small: int, big: int) -> str:
    r, s = out["w1"], out["scaling"]
    sizes, t = r["size_ratio"], r["get_us"]
    ar = t.get("arrayrecord_zstd")

    def triple(v: list | None) -> str:
        if v is None:
            return "–"
        return " / ".join([f"{v[0]:.2f}", f"{v[1]:.2f}", *([f"{v[2]:.2f}"] if len(v) > 2 else [])])

    def ratio(a: tuple, b: tuple | None) -> str:
        return "n/a" if b is None else f"{a[0] / b[0]:.2f}x wall, {a[1] / b[1]:.2f}x CPU"

    lo, hi = s[str(small)], s[str(big)]
    rows = [
        ("W1 size / raw bytes", f"{sizes['zstd']:.3f}x", "<= 0.40x"),
        ("W1 zstd get / plain get", ratio(t["zstd"], t["plain"]), "<= 2x"),
        ("W1 zstd get / ArrayRecord zstd get", ratio(t["zstd"], ar), "<= 1x"),
        (f"open at {big:,} records", f"{hi['open_ms']:.3f} ms", "< 2 ms"),
        (f"get at {big:,} / get at {small:,}", ratio(hi["get_us"], lo["get_us"]), "<= 1.5x"),
        (
            f"uncached get at {big:,} / at {small:,}",
            ratio(hi["uncached_get_us"], lo["uncached_get_us"]),
            "(no frame cache)",
        ),
        (
            f"warm get at {big:,} / at {small:,}",
            ratio(hi["warm_get_us"], lo["warm_get_us"]),
            f"(after {WARMUP:,} other gets)",
        ),
        (
            f"warm uncached get at {big:,} / at {small:,}",
            ratio(hi["warm_uncached_get_us"], lo["warm_uncached_get_us"]),
            "(after them, no frame cache)",
        ),
    ]
    names = [*W1_FILES, *(["arrayrecord_zstd"] if ar else [])]
    lines = [
        "# zstd layer targets (issue 13)",
        "",
        f"`{out['command']}`; medians of {repeat} runs, one process, ratios within the run. "
        f"W1: {r['records']:,} records, 20,000 random gets (each run a fresh open), every "
        "field touched. Scaling: W1-shaped small records, zstd defaults.",
        "",
        "| row | measured | target |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
        "| W1 file | size / raw | get µs wall | get µs CPU |",
        "|---|---|---|---|",
        *(f"| {k} | {sizes[k]:.3f}x | {t[k][0]:.2f} | {t[k][1]:.2f} |" for k in names),
        "",
        "Each get figure: µs wall / µs CPU / page faults per get. Cold: the first 20,000 "
        f"gets after open; warm: 20,000 after {WARMUP:,} others.",
        "",
        "| records | file MB | open ms | get, cold | get, cold, no cache | get, warm "
        "| get, warm, no cache |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {int(k):,} | {v['file_bytes'] / 1e6:.1f} | {v['open_ms']:.3f} | "
            + " | ".join(triple(v.get(f)) for f in GET_KINDS)
            + " |"
            for k, v in s.items()
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
