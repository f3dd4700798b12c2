"""Packaging throughput with Ray Data (issue 14): ``EValueDatasink`` with one and with two
write tasks at a time, against ``ShardWriter`` in one process, on the same records.

Candidates, per workload (W1 and W2 of workloads.py, fewer records with --records/--images):

* ``ShardWriter``: ``ShardWriter(pattern, max_records=...)`` fed the records as lists (the
  single-process baseline);
* ``EValueDatasink, no Ray``: the sink's own code in this process, one write task's
  ``write`` fed all the Arrow blocks, then the manifest: Ray's share of the cost is the
  difference to the Ray rows;
* ``Ray Data, N write task(s)``: ``ds.write_datasink(EValueDatasink(...), concurrency=N)``
  on a local cluster of this machine's two cores (``ray.init(num_cpus=2)``), the dataset
  materialized in the object store before timing (reading the source is not
  packaging), the cluster warmed by one write first (worker start-up excluded).

records/s and MB/s of raw field bytes (``Data.payload_bytes``), median of --repeats, the
candidates interleaved so that a busy machine slows them alike; shards of --shard-records
records, durable (fsync) as by default. Writes benchmarks/results/ray_pack.{json,md}.

Run: python benchmarks/ray_pack.py [--records 200000] [--images 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import evalue_store as evs  # noqa: E402
from benchmarks.workloads import WORKLOADS, Data  # noqa: E402
from evalue_store.shards import ShardWriter  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def arrow_blocks(data: Data, rows: int) -> list:
    """The workload as Arrow tables of ``rows`` rows (tensor columns as Ray tensor columns)."""
    from ray.data.block import BlockAccessor

    names = [f.name for f in data.workload.fields]
    return [
        BlockAccessor.batch_to_block(
            {name: np.asarray(col[a : a + rows]) for name, col in zip(names, data.columns)}
        )
        for a in range(0, len(data), rows)
    ]


def shardwriter(records: list, out: str, shard_records: int) -> None:
    with ShardWriter(os.path.join(out, "part-{:05d}.evs"), max_records=shard_records) as w:
        w.extend(records)


def sink_without_ray(blocks: list, out: str, shard_records: int) -> None:
    from ray.data.datasource.datasink import WriteResult

    from evalue_store.ray import EValueDatasink

    sink = EValueDatasink(out, max_records=shard_records)
    sink.on_write_start()
    written = sink.write(blocks, types.SimpleNamespace(task_idx=0))
    sink.on_write_complete(WriteResult(sum(b.num_rows for b in blocks), 0, [written]))


def ray_write(ds, out: str, shard_records: int, tasks: int) -> None:
    from evalue_store.ray import EValueDatasink

    ds.write_datasink(EValueDatasink(out, max_records=shard_records), concurrency=tasks)


def measure(name: str, data: Data, args: argparse.Namespace, work: str) -> dict:
    import ray.data

    records = list(data)
    blocks = arrow_blocks(data, args.block_records)
    ds = ray.data.from_arrow(blocks).materialize()
    candidates = {
        "ShardWriter": lambda out: shardwriter(records, out, args.shard_records),
        "EValueDatasink, no Ray": lambda out: sink_without_ray(blocks, out, args.shard_records),
        "Ray Data, 1 write task": lambda out: ray_write(ds, out, args.shard_records, 1),
        "Ray Data, 2 write tasks": lambda out: ray_write(ds, out, args.shard_records, 2),
    }
    ray_write(ds, os.path.join(work, f"{name}-warm"), args.shard_records, 2)  # workers up
    times: dict[str, list[float]] = {c: [] for c in candidates}
    for r in range(args.repeats):
        for c, run in candidates.items():
            out = os.path.join(work, f"{name}-{r}-{len(times[c])}-{c.replace(' ', '_')}")
            start = time.perf_counter()
            run(out)
            times[c].append(time.perf_counter() - start)
            with evs.open_shards(out) as stored:
                assert len(stored) == len(data), (c, len(stored))
            shutil.rmtree(out)
    payload = data.payload_bytes()
    return {
        "records": len(data),
        "payload_bytes": payload,
        "blocks": len(blocks),
        "seconds": times,
        "results": {
            c: {
                "seconds": statistics.median(t),
                "records_per_s": len(data) / statistics.median(t),
                "mb_per_s": payload / statistics.median(t) / 1e6,
            }
            for c, t in times.items()
        },
    }


def report_md(report: dict) -> str:
    lines = [
        "# Packaging with Ray Data (benchmarks/ray_pack.py)",
        "",
        f"{report['machine']['cores']} cores, load average before/after "
        f"{report['machine']['load_before']} / {report['machine']['load_after']}; "
        f"ray {report['machine']['ray']}; shards of {report['shard_records']:,} records; "
        f"median of {report['repeats']} runs.",
        "",
    ]
    for name, w in report["workloads"].items():
        base = w["results"]["ShardWriter"]["records_per_s"]
        lines += [
            f"## {name}: {w['records']:,} records, {w['payload_bytes'] / 1e6:,.0f} MB, "
            f"{w['blocks']} blocks",
            "",
            "| candidate | records/s | MB/s | vs ShardWriter |",
            "|---|---:|---:|---:|",
        ]
        for c, r in w["results"].items():
            lines.append(
                f"| {c} | {r['records_per_s']:,.0f} | {r['mb_per_s']:,.1f} "
                f"| {r['records_per_s'] / base:.2f}x |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="W1 records")
    parser.add_argument("--images", type=int, default=1_000, help="W2 records")
    parser.add_argument("--shard-records", type=int, default=25_000)
    parser.add_argument("--block-records", type=int, default=0, help="0: 8 blocks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument("--name", default="ray_pack")
    args = parser.parse_args()

    import ray

    load_before = os.getloadavg()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=2 << 30,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    report: dict = {"repeats": args.repeats, "shard_records": args.shard_records, "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="ray_pack-") as work:
        for name, n in (("W1", args.records), ("W2", args.images)):
            data = Data(WORKLOADS[name].scaled(n))
            rows = args.block_records or -(-n // 8)
            report["workloads"][name] = measure(
                name, data, argparse.Namespace(**{**vars(args), "block_records": rows}), work
            )
            print(json.dumps({name: report["workloads"][name]["results"]}, indent=1))
    ray.shutdown()
    report["machine"] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(report_md(report))
    print(report_md(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
