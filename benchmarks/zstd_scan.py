"""Sequential scan and get_batch of compressed files, in one process (CPU time).

W1 records written plain, zstd with the defaults (2 KiB frames: one record per frame, a
dictionary), and zstd with 64 KiB frames (several records per frame); each is scanned
(``for r in ds``, every field touched), read by ``ds[i]`` at random and by ``get_batch`` of
256 random records, every run a fresh open (the reads after 256 others, which learn the
records' structures as a long run has); the same scan of ArrayRecord zstd
(benchmarks/adapters/arrayrecord.py) when it is installed. Medians of interleaved runs.

Run: python benchmarks/zstd_scan.py [--records 20000] [--repeat 5]
Writes benchmarks/results/zstd_scan.json and .md.
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
from typing import Any

import numpy as np

import evalue_store as evs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.measure import touch_batch  # noqa: E402
from benchmarks.workloads import W1, Data, touch  # noqa: E402
from benchmarks.zstd_targets import arrayrecord_zstd  # noqa: E402

RESULTS = Path(__file__).parent / "results"
FILES = {  # name: Writer options (None: plain)
    "plain": None,
    "zstd": {},
    "zstd_64k": {"frame_size": 64 << 10},
}
BATCH = 256


def cpu_us(run, count: int) -> float:
    start = time.process_time()
    run()
    return (time.process_time() - start) / count * 1e6


def scan(path: str, n: int) -> float:
    with evs.open(path) as ds:
        return cpu_us(lambda: [touch(r) for r in ds], n)


def gets(path: str, warm: list[int], order: list[int]) -> float:
    with evs.open(path) as ds:
        [touch(ds[i]) for i in warm]  # the structures learned, as in a long run
        return cpu_us(lambda: [touch(ds[i]) for i in order], len(order))


def batches(path: str, warm: list[int], order: list[int]) -> float:
    with evs.open(path) as ds:
        ds.get_batch(warm)
        chunks = [order[k : k + BATCH] for k in range(0, len(order), BATCH)]
        return cpu_us(lambda: [touch_batch(ds.get_batch(c)) for c in chunks], len(order))


def arrayrecord(data: Data, work: str) -> Any:
    written = arrayrecord_zstd(data, work)
    if written is None:
        return None
    adapter, path = written

    def run() -> float:
        adapter.open(path)
        try:
            return cpu_us(lambda: [touch(r) for r in adapter.scan()], len(data))
        finally:
            adapter.close()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.records
    data = Data(W1.scaled(n))
    warm, order = np.split(np.random.default_rng(3).integers(0, n, BATCH * 9), [BATCH])
    warm, order = warm.tolist(), order.tolist()
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("EVS_BENCH_DIR")) as work:
        paths = {}
        for name, options in FILES.items():
            paths[name] = os.path.join(work, f"{name}.evs")
            compressed = {} if options is None else {"compression": "zstd", **options}
            with evs.Writer(paths[name], durable=False, **compressed) as w:
                w.extend_columns(dict(enumerate(data.columns)))
        ar = arrayrecord(data, work)
        for _ in range(args.repeat):  # interleaved: the machine's load is shared
            for name, path in paths.items():
                runs.setdefault(f"{name} scan", []).append(scan(path, n))
                runs.setdefault(f"{name} ds[i]", []).append(gets(path, warm, order))
                runs.setdefault(f"{name} get_batch", []).append(batches(path, warm, order))
            if ar is not None:
                runs.setdefault("arrayrecord_zstd scan", []).append(ar())
    us = {k: statistics.median(v) for k, v in runs.items()}
    out = {
        "command": " ".join(["python benchmarks/zstd_scan.py", *sys.argv[1:]]),
        "records": n,
        "cpu_us_per_record": us,
        "load": os.getloadavg(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "zstd_scan.json").write_text(json.dumps(out, indent=2))
    (RESULTS / "zstd_scan.md").write_text(report(out, args.repeat) + "\n")
    print(report(out, args.repeat))


def report(out: dict, repeat: int) -> str:
    us = out["cpu_us_per_record"]
    ar = us.get("arrayrecord_zstd scan")
    rows = []
    for name in FILES:
        scan_us = us[f"{name} scan"]
        vs = f"{ar / scan_us:.2f}x" if ar else "n/a"
        get_us, batch_us = us[f"{name} ds[i]"], us[f"{name} get_batch"]
        rows.append(
            f"| {name} | {scan_us:.2f} ({1e6 / scan_us:,.0f}/s) | {vs} | {get_us:.2f} "
            f"| {batch_us:.2f} | {batch_us / get_us:.2f}x |"
        )
    lines = [
        "# Scan and get_batch of compressed files",
        "",
        f"`{out['command']}`: W1, {out['records']:,} records; CPU µs per record, medians of "
        f"{repeat} interleaved runs in one process, each a fresh open (load {out['load'][0]:.1f})."
        f" ArrayRecord zstd scan: {f'{ar:.2f} µs' if ar else 'not installed'}.",
        "",
        "| file | scan µs (rate) | ArrayRecord zstd scan / this | ds[i] µs | get_batch µs "
        "| get_batch / ds[i] |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
