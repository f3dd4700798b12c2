"""Instructions per read, counted by valgrind's callgrind: a figure a busy machine cannot blur.

Each case runs in a child process under ``valgrind --tool=callgrind``, collecting only
inside one ``functools.reduce`` call that performs the operation N times (set up, imports
and warm-up are not counted); the result is instructions per operation. With
``--cache-sim`` callgrind also simulates the caches and reports L1 instruction and data
misses per operation (the CPU's own counters are not available here): a read that runs more
distinct code than another misses the instruction cache more, which costs time that the
instruction count does not show.

Cases (same records as benchmarks/run.py; the floor and evalue_store through their
benchmark adapters, so the code is run.py's):

* ``get``: one random record, as run.py's get without ``touch``; and ``get+touch``, with it
  (run.py's figure): W1 and W2, floor / evalue_store / evalue_store_noverify /
  evalue_store_zstd (its defaults);
* ``batch``: what a DataLoader calls per batch of 64 shuffled W1 records over 8 shards:
  ``collate(EValueDataset.__getitems__(indices))``, against an in-memory TensorDataset's
  samples through torch's ``default_collate`` (as benchmarks/bench_loader.py).

Usage: python benchmarks/instructions.py [--cache-sim] [--only CASE...] [--out DIR] [--name NAME]
Needs valgrind. Results: <out>/<name>.json and .md (default benchmarks/results/instructions).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks.*, as run.py does
RESULTS = HERE / "results"
GETS = 4000  # operations counted per get case
BATCHES = 100  # per batch case
RECORDS = {"W1": 4000, "W2": 300}
ADAPTERS = ("floor", "evalue_store", "evalue_store_noverify", "evalue_store_zstd")


# ----------------------------------------------------------------------------- the child


def child(case: str, work: Path, count: int) -> None:
    """Set up ``case`` in ``work`` (written by ``prepare``), warm it, then run it ``count``
    times inside functools.reduce (what callgrind collects)."""
    kind, workload, name = case.split(":")
    rng = np.random.default_rng(0)
    if kind == "batch":
        op = batch_op(name, work)
        keys = [rng.choice(RECORDS["W1"], 64, replace=False).tolist() for _ in range(count)]
    else:
        from benchmarks.adapters import load_adapter
        from benchmarks.workloads import WORKLOADS, touch

        fields = WORKLOADS[workload].fields
        adapter = load_adapter(name, fields)
        adapter.open(work / workload / name.replace("_noverify", ""))
        get = adapter.get
        n = RECORDS[workload]
        keys = [int(i) for i in rng.integers(0, n, count)]
        if kind == "get":
            op = get
        else:
            op = lambda i: touch(get(i))  # noqa: E731
        for i in range(n):  # every record once: layouts learned, pages mapped
            touch(get(i))
    for key in keys[: min(count, 50)]:
        op(key)
    functools.reduce(lambda _, key: op(key), keys, None)


def batch_op(name: str, work: Path) -> Any:
    from torch.utils.data import default_collate

    from benchmarks.bench_loader import InMemory, make_w1, manifest_path
    from evalue_store.torch import EValueDataset, collate

    if name == "TensorDataset":
        ds = InMemory(make_w1(RECORDS["W1"]))
        return lambda indices: default_collate([ds[i] for i in indices])
    loader = EValueDataset(manifest_path(str(work / "shards")))
    return lambda indices: collate(loader.__getitems__(indices))


# ----------------------------------------------------------------------------- the parent


def prepare(work: Path) -> None:
    """The records of every case: W1 and W2 for the adapters, W1 in 8 shards."""
    from benchmarks.adapters import load_adapter
    from benchmarks.bench_loader import make_w1, write_stores
    from benchmarks.workloads import WORKLOADS, Data

    for workload, n in RECORDS.items():
        w = WORKLOADS[workload].scaled(n)
        for name in (a for a in ADAPTERS if not a.endswith("_noverify")):
            load_adapter(name, w.fields).write(iter(Data(w)), work / workload / name)
    (work / "shards").mkdir()
    write_stores(make_w1(RECORDS["W1"]), str(work / "shards"))


COUNTERS = {"Ir": "instructions", "I1mr": "I1 misses", "D1mr": "D1 read misses"}


def count(case: str, work: Path, n: int, cache_sim: bool) -> dict[str, float]:
    """Events per operation of ``case``, from callgrind's totals of the reduce call."""
    out = work / f"callgrind.{case.replace(':', '_')}"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--toggle-collect=functools_reduce",
        f"--callgrind-out-file={out}",
        *(["--cache-sim=yes"] if cache_sim else []),
        sys.executable,
        __file__,
        "--child",
        case,
        "--work",
        str(work),
        "--count",
        str(n),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(command, check=True, capture_output=True, env=env)
    text = out.read_text()
    events = re.search(r"^events: (.*)$", text, re.M).group(1).split()
    totals = [int(x) for x in re.search(r"^totals: (.*)$", text, re.M).group(1).split()]
    return {COUNTERS[event]: total / n for event, total in zip(events, totals) if event in COUNTERS}


def cases() -> list[tuple[str, int]]:
    found = [
        (f"{kind}:{workload}:{name}", GETS)
        for workload in RECORDS
        for kind in ("get", "get+touch")
        for name in ADAPTERS
    ]
    return found + [(f"batch:W1:{name}", BATCHES) for name in ("TensorDataset", "EValueDataset")]


def run(cache_sim: bool, only: list[str] | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="instructions-"))
    try:
        prepare(work)
        rows = {}
        for case, n in cases():
            if only and case not in only:
                continue
            rows[case] = count(case, work, n, cache_sim)
            print(case, {k: round(v) for k, v in rows[case].items()}, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "method": "valgrind callgrind, events inside one functools.reduce over N operations",
        "gets_per_case": GETS,
        "batches_per_case": BATCHES,
        "records": RECORDS,
        "cache_sim": cache_sim,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "valgrind": subprocess.run(
                ["valgrind", "--version"], capture_output=True, text=True
            ).stdout.strip(),
        },
        "results": rows,
    }


def to_markdown(report: dict) -> str:
    rows = report["results"]
    counters = list(next(iter(rows.values())))
    lines = [
        "# Instructions per read (benchmarks/instructions.py)",
        "",
        f"{report['method']}; {report['gets_per_case']} random gets, "
        f"{report['batches_per_case']} batches of 64. Records: W1 x{report['records']['W1']}, "
        f"W2 x{report['records']['W2']}. {report['machine']['valgrind']}, Python "
        f"{report['machine']['python']}. Ratio: against the floor's same case (gets) or the "
        "in-memory TensorDataset's (batches).",
        "",
        "| case | " + " | ".join(counters) + " | ratio (instructions) |",
        "|---" * (len(counters) + 2) + "|",
    ]
    for case, row in rows.items():
        kind, workload, name = case.split(":")
        base = rows.get(f"{kind}:{workload}:" + ("TensorDataset" if kind == "batch" else "floor"))
        ratio = f"{row['instructions'] / base['instructions']:.2f}" if base else "–"
        cells = " | ".join(f"{row[c]:,.0f}" for c in counters)
        lines.append(f"| {kind} {workload} {name} | {cells} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache-sim", action="store_true", help="also L1 misses (slower)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="instructions")
    parser.add_argument("--only", nargs="+", help="these cases only (e.g. get:W2:floor)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.work, args.count)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    report = run(args.cache_sim, args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"{args.name}.md").write_text(to_markdown(report))
    print(to_markdown(report))


if __name__ == "__main__":
    main()
