"""DataLoader throughput and worker memory: evalue_store vs the same data held in memory.

Workload W1: N x [int64[128] tokens, float32[16] features, int label, str id] (N = 200,000
unless ``--records``), in 8 shards. Every loader uses batch 64 and shuffling. Measured:

* records/s through ``DataLoader`` with 0 and 2 workers, timed after the first batch (worker
  start-up excluded); best of ``--repeats`` epochs, the candidates interleaved so that a
  busy machine slows them alike; and the CPU time of that epoch per batch, of the main
  process and its workers together (workers' from ``RUSAGE_CHILDREN`` once they exit),
  which a busy machine blurs less than wall time;
* memory added by one forked DataLoader worker (the Linux default) that reads every record
  once, measured in a fresh process per candidate: RSS growth; RSS minus file-backed pages
  (psutil ``rss - shared``, or VmRSS - RssFile from /proc/self/status); and private
  anonymous memory from /proc/self/smaps, which also counts inherited pages duplicated by
  copy-on-write (RSS does not: a shared page that becomes private is still one page).

Baselines: what a user writes for these fields in memory: a ``TensorDataset`` (tokens,
features, labels) plus a Python list of ids (a TensorDataset cannot hold strings), each
sample exactly what indexing them gives; measured twice, with torch's ``default_collate``
(what DataLoader uses unless told) and with ``evalue_store.torch.collate`` (what the
evalue_store loaders use, so that only the storage differs). Neither is always faster: in
workers default_collate sends each tensor through shared memory, ours small ones by value.
A loader's ratio is against the faster of the two. Also Hugging Face ``datasets`` (Arrow,
memory-mapped) when it imports. Results go to benchmarks/results/loader.json and loader.md.

Usage: python benchmarks/bench_loader.py [--records N] [--repeats R] [--work DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate

import evalue_store as evs
from evalue_store.shards import ShardWriter
from evalue_store.torch import EValueDataset, ShardedIterableDataset, collate

BATCH = 64
SHARDS = 8
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BASELINE = "in-memory TensorDataset, default_collate"
BASELINE_OURS = "in-memory TensorDataset, evalue_store collate"
BASELINES = (BASELINE, BASELINE_OURS)
EVALUE_MAP = "evalue_store EValueDataset"
EVALUE_ITERABLE = "evalue_store ShardedIterableDataset"
HF = "HF datasets (Arrow mmap)"


def import_note(module: str, what: str) -> str | None:
    """None if ``module`` imports, else why ``what`` is not measured."""
    try:
        __import__(module)
    except Exception as exc:  # not installed, or broken by what is installed next to it
        return f"{what}: `import {module}` failed ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def make_w1(n: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "tokens": rng.integers(0, 50_000, (n, 128), dtype=np.int64),
        "features": rng.standard_normal((n, 16), dtype=np.float32),
        "label": rng.integers(0, 1000, n, dtype=np.int64),
        "id": [f"rec-{i:09d}" for i in range(n)],
    }


class InMemory(Dataset):
    """The baseline: a TensorDataset plus the ids, yielding the same samples as the store."""

    def __init__(self, data: dict[str, Any]):
        self.tensors = TensorDataset(
            torch.from_numpy(data["tokens"]),
            torch.from_numpy(data["features"]),
            torch.from_numpy(data["label"]),
        )
        self.ids = data["id"]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> list:
        tokens, features, label = self.tensors[i]
        return [tokens, features, label, self.ids[i]]


class HFSamples(Dataset):
    """Hugging Face datasets (torch format), as a list per sample like the others."""

    def __init__(self, path: str):
        import datasets

        self.ds = datasets.load_from_disk(path).with_format("torch")

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> list:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list:
        rows = self.ds[indices]  # one batched Arrow query
        return [
            [rows["tokens"][k], rows["features"][k], int(rows["label"][k]), rows["id"][k]]
            for k in range(len(indices))
        ]


def manifest_path(work: str) -> str:
    return os.path.join(work, "w1.manifest.json")


def hf_path(work: str) -> str:
    return os.path.join(work, "hf")


def write_stores(data: dict[str, Any], work: str) -> str:
    """Write the evalue shards and (if installed) the HF dataset; returns the HF note."""
    n = len(data["id"])
    with ShardWriter(
        os.path.join(work, "w1-{:03d}.evs"),
        max_records=max(1, -(-n // SHARDS)),
        durable=False,
        overwrite=True,
    ) as w:
        for i in range(n):
            w.append([data["tokens"][i], data["features"][i], int(data["label"][i]), data["id"][i]])
    assert w.manifest_path == manifest_path(work)
    note = import_note("datasets", "HF datasets")
    if note is not None:
        return note
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_dict(data).save_to_disk(hf_path(work))
    return f"datasets {datasets.__version__}"


def make_dataset(name: str, work: str, data: dict[str, Any] | None, n: int) -> Dataset:
    if name in BASELINES:
        return InMemory(data if data is not None else make_w1(n))
    if name == EVALUE_MAP:
        return EValueDataset(manifest_path(work))
    if name == EVALUE_ITERABLE:
        return ShardedIterableDataset(manifest_path(work), batch_size=BATCH)
    return HFSamples(hf_path(work))


# ----------------------------------------------------------------------------- throughput


def collate_of(name: str) -> Any:
    return default_collate if name == BASELINE else collate


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def epoch_rate(ds: Dataset, workers: int, collate_fn: Any) -> tuple[float, float]:
    """(records/s, CPU µs per batch of all processes) of one epoch through a DataLoader,
    counted after its first batch (the workers' CPU time includes their start)."""
    children = cpu_seconds(resource.RUSAGE_CHILDREN)
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=not isinstance(ds, ShardedIterableDataset),  # that one shuffles itself
        num_workers=workers,
        collate_fn=collate_fn,
    )
    batches = iter(loader)
    next(batches)
    start, cpu, n, count = time.perf_counter(), time.process_time(), 0, 0
    for batch in batches:
        n += len(batch[3])
        count += 1
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    del batches  # its workers exit (and are waited for) here
    gc.collect()
    cpu += cpu_seconds(resource.RUSAGE_CHILDREN) - children
    return n / seconds, cpu / count * 1e6


# ----------------------------------------------------------------------------- memory


def private_anonymous() -> int | None:
    """Private pages of anonymous mappings (heap, copy-on-write copies), from smaps.

    File-backed mappings are left out (their dirty page-cache pages show as private dirty),
    and so are shared-memory files, where DataLoader puts batches.
    """
    try:
        f = open("/proc/self/smaps")
    except OSError:
        return None
    total, anonymous = 0, False
    with f:
        for line in f:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5:  # a mapping's header line
                path = head[5].strip() if len(head) > 5 else ""
                anonymous = path in ("", "[heap]", "[stack]") or path.startswith("[anon:")
            elif anonymous and head[0] in ("Private_Dirty:", "Private_Clean:"):
                total += int(head[1]) * 1024
    return total


def memory() -> dict[str, Any]:
    """RSS, RSS minus file-backed pages, and private anonymous bytes of this process."""
    try:
        import psutil
    except ImportError:
        with open("/proc/self/status") as f:
            fields = {k: v for k, _, v in (line.partition(":") for line in f)}
        rss, file = (int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssFile"))
        out = {"rss": rss, "anon": rss - file, "source": "/proc/self/status"}
    else:
        info = psutil.Process().memory_info()
        out = {"rss": info.rss, "anon": info.rss - info.shared, "source": "psutil"}
    private = private_anonymous()
    if private is not None:
        out["private_anon"] = private
    return out


class MemoryProbe(Dataset):
    """Wraps a dataset; index -1 returns the worker's memory growth since its first read."""

    def __init__(self, inner: Dataset):
        self.inner = inner
        self.base: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.inner)

    def __getitems__(self, indices: list[int]) -> list:
        if indices == [-1]:
            now = memory()
            growth = {k: v - self.base[k] for k, v in now.items() if k != "source"}
            return [{**growth, "source": now["source"]}]
        if self.base is None:
            self.base = memory()
        getitems = getattr(self.inner, "__getitems__", None)  # what DataLoader would call
        return getitems(indices) if getitems else [self.inner[i] for i in indices]


def probe_collate(batch: Any) -> Any:
    return batch[0] if isinstance(batch, list) and isinstance(batch[0], dict) else collate(batch)


def worker_growth(ds: Dataset) -> dict[str, Any]:
    """Memory growth of one forked worker that reads every record once."""
    n = len(ds)
    batches = [list(range(i, min(i + BATCH, n))) for i in range(0, n, BATCH)] + [[-1]]
    gc.collect()  # so the parent frees nothing while the worker runs
    loader = DataLoader(
        MemoryProbe(ds),
        batch_sampler=batches,
        num_workers=1,
        multiprocessing_context="fork",
        collate_fn=probe_collate,
    )
    *_, report = loader
    return report


def probe_in_fresh_process(name: str, work: str, n: int) -> dict[str, Any]:
    """Run worker_growth in a new process, so the parent's history cannot blur it."""
    out = subprocess.run(
        [sys.executable, __file__, "--probe", name, "--work", work, "--records", str(n)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- main


def run(n: int, repeats: int, work: str) -> dict:
    load_before = os.getloadavg()
    data = make_w1(n)
    hf_note = write_stores(data, work)
    names = [BASELINE, BASELINE_OURS, EVALUE_MAP, EVALUE_ITERABLE]
    if os.path.isdir(hf_path(work)):
        names.append(HF)
    datasets = {name: make_dataset(name, work, data, n) for name in names}
    rows: dict[str, dict[str, Any]] = {name: {} for name in names}
    for _ in range(repeats):
        for workers in (0, 2):
            for name, ds in datasets.items():
                rate, cpu = epoch_rate(ds, workers, collate_of(name))
                row = rows[name]
                row[f"rec_per_s_{workers}w"] = max(row.get(f"rec_per_s_{workers}w", 0.0), rate)
                key = f"cpu_us_per_batch_{workers}w"
                row[key] = min(row.get(key, float("inf")), cpu)
    del datasets, data
    for name in names:
        if name not in (EVALUE_ITERABLE, BASELINE_OURS):  # the same store / data as another
            growth = probe_in_fresh_process(name, work, n)
            rows[name]["memory_source"] = growth.pop("source")
            rows[name].update({f"worker_{k}_growth_mib": v / 2**20 for k, v in growth.items()})
        print(name, rows[name], flush=True)
    store_bytes = sum(
        os.path.getsize(os.path.join(work, f)) for f in os.listdir(work) if f.endswith(".evs")
    )
    return {
        "workload": f"W1: {n:,} x [int64[128] tokens, float32[16] features, int label, str id]",
        "records": n,
        "batch_size": BATCH,
        "repeats": repeats,
        "evalue_store_bytes": store_bytes,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "evalue_store": evs.__version__,
            "hf": hf_note,
            "load_average_before_after": [load_before, os.getloadavg()],
        },
        "not_measured": [
            note
            for note in (
                None if os.path.isdir(hf_path(work)) else hf_note,
                import_note("streaming", "mosaicml-streaming (MDS)"),
            )
            if note
        ],
        "results": rows,
    }


def best_baseline(results: dict, workers: int) -> tuple[float, float]:
    """(records/s, CPU µs per batch) of the faster in-memory baseline for ``workers``."""
    rows = [results[name] for name in BASELINES if name in results]
    return (
        max(row[f"rec_per_s_{workers}w"] for row in rows),
        min(row[f"cpu_us_per_batch_{workers}w"] for row in rows),
    )


def to_markdown(report: dict) -> str:
    results = report["results"]
    machine = report["machine"]
    loads = " / ".join(
        ", ".join(f"{x:.2f}" for x in load) for load in machine["load_average_before_after"]
    )
    lines = [
        "# DataLoader throughput and worker memory (benchmarks/bench_loader.py)",
        "",
        f"{report['workload']}; batch {report['batch_size']}, shuffled; "
        "`evalue_store.torch.collate` for every loader but the first baseline "
        f"(torch's default_collate); best of {report['repeats']} epochs "
        f"(candidates interleaved), timed after the first batch. Store: {SHARDS} shards, "
        f"{report['evalue_store_bytes'] / 2**20:.0f} MiB, in the page cache. Machine: "
        f"{machine['cpus']} CPUs, Python {machine['python']}, torch {machine['torch']}, "
        f"{machine['hf']}; load average (1/5/15 min) before / after: {loads}.",
        "",
        "Ratio = records/s divided by the faster in-memory baseline's, and that baseline's CPU "
        "time per batch divided by this loader's (both: 1.00 = as fast, above = faster). CPU "
        "time counts the main process and its workers; a busy machine blurs it less than "
        "records/s.",
        "",
        "| loader | 0 workers rec/s | ratio | CPU µs/batch | ratio | 2 workers rec/s | ratio "
        "| CPU µs/batch | ratio | worker RSS growth MiB | RSS - file MiB | private anon MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    best = {workers: best_baseline(results, workers) for workers in (0, 2)}
    for name, row in results.items():
        cells = []
        for workers in (0, 2):
            rate, cpu = row[f"rec_per_s_{workers}w"], row[f"cpu_us_per_batch_{workers}w"]
            base_rate, base_cpu = best[workers]
            cells += [
                f"{rate:,.0f}",
                f"{rate / base_rate:.2f}",
                f"{cpu:,.0f}",
                f"{base_cpu / cpu:.2f}",
            ]
        growth = [
            f"{row[f'worker_{k}_growth_mib']:.1f}" if f"worker_{k}_growth_mib" in row else "n/a"
            for k in ("rss", "anon", "private_anon")
        ]
        lines.append("| " + " | ".join([name, *cells, *growth]) + " |")
    lines += [
        "",
        "Worker memory: one forked worker reads every record once (sequential batches), in a "
        "fresh process per loader; growth from its first read to its last. RSS - file = RSS "
        "minus file-backed pages (psutil `rss - shared`, or VmRSS - RssFile). Private anon = "
        "private pages of anonymous mappings (/proc/self/smaps): heap growth plus inherited "
        "pages that copy-on-write duplicated, which RSS does not show. File-backed pages of "
        "the store are page cache: shared by all workers and reclaimable. The iterable "
        "dataset reads the same store as EValueDataset, and the second baseline holds the "
        "same data as the first, so their memory is not measured again.",
        "",
        *(
            ["Not measured: " + "; ".join(report["not_measured"]) + ".", ""]
            if report["not_measured"]
            else []
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", help="scratch directory (default: a temporary one)")
    parser.add_argument("--out", default=RESULTS, help="where loader.json/.md go")
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # internal: one memory probe
    args = parser.parse_args(argv)
    if args.probe:
        ds = make_dataset(args.probe, args.work, None, args.records)
        print(json.dumps(worker_growth(ds)))
        return
    work = args.work or tempfile.mkdtemp(prefix="bench_loader-")
    os.makedirs(work, exist_ok=True)
    try:
        report = run(args.records, args.repeats, work)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "loader.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "loader.md"), "w") as f:
        f.write(to_markdown(report))
    print(to_markdown(report))


if __name__ == "__main__":
    main()
