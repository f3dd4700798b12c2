"""get_batch against ds[i] in a loop, per record, for tiny fixed-layout records.

Workloads: W1 records (benchmarks/workloads.py: int64[128], float32[16], an int, a short
string) and ExecuTorch's XOR example records (float32[2] and an int label), in plain files
read with the default ``verify=True``; batches of 32 and 256 random indices. The two reads
are interleaved per repeat, timed in thread CPU time (a shared machine's waits are not
counted), and the medians over ``--repeats`` reported with their ratio. Results go to
benchmarks/results/batch.json and .md.

Usage: PYTHONPATH=.:src python benchmarks/bench_batch.py [--repeats R] [--batches N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import evalue_store as evs  # noqa: E402
from benchmarks.workloads import W1, Data  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def w1_records(n: int) -> list:
    return list(Data(W1.scaled(n)))


def xor_records(n: int) -> list:
    rng = np.random.default_rng(0)
    x = rng.random((n, 2), dtype=np.float32)
    y = rng.integers(0, 2, n)
    return [[x[i], int(y[i])] for i in range(n)]


def per_record_us(read: Any, batches: list[np.ndarray]) -> float:
    start = time.thread_time()
    for indices in batches:
        read(indices)
    return (time.thread_time() - start) / sum(map(len, batches)) * 1e6


def run_case(name: str, path: str, batch: int, args: argparse.Namespace) -> dict:
    with evs.open(path) as ds:
        rng = np.random.default_rng(batch)
        batches = [rng.integers(0, len(ds), batch) for _ in range(args.batches)]
        reads = {
            "get_batch": ds.get_batch,
            "ds[i]": lambda indices: [ds[i] for i in indices.tolist()],
        }
        times: dict[str, list[float]] = {k: [] for k in reads}
        for read in reads.values():
            read(batches[0])  # layouts and checksum tables are made once
        for _ in range(args.repeats):
            for k, read in reads.items():
                times[k].append(per_record_us(read, batches))
    result = {k: statistics.median(v) for k, v in times.items()}
    ratio = result["ds[i]"] / result["get_batch"]
    return {"workload": name, "batch": batch, **result, "ratio": ratio}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# get_batch vs ds[i] per record (verify=True, thread CPU time)",
        "",
        f"{meta['machine']}; median of {meta['repeats']} interleaved runs of "
        f"{meta['batches']} random batches each. {meta['note']}",
        "",
        "| workload | batch | get_batch µs/rec | ds[i] µs/rec | ds[i] / get_batch |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['batch']} | {r['get_batch']:.2f} | {r['ds[i]']:.2f} "
            f"| {r['ratio']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batches", type=int, default=40, help="per run")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--note", default="", help="a line about the machine's load")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "repeats": args.repeats,
        "batches": args.batches,
        "note": args.note,
    }
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, make in (("W1", w1_records), ("XOR", xor_records)):
            path = os.path.join(work, f"{name}.evs")
            with evs.Writer(path) as writer:
                writer.extend(make(args.records))
            for batch in (32, 256):
                rows.append(run_case(name, path, batch, args))
                print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "batch.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "batch.md"), "w") as f:
        f.write(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
