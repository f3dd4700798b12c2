"""Remote random access through a local S3 server (issue 14): evalue_store's ranged reads
against MosaicML Streaming, which downloads whole shards, from the same server.

moto's standalone S3 server runs in a process of its own behind the tests' counting proxy
(tests/servers.py), which records every request and the body bytes sent: the figures are
what a client asked of the server, not what it reported. evalue_store is also measured over
HTTP from nginx serving the same shard files (its access log counts), a real server that
answers concurrent requests concurrently (moto answers one at a time).

Records are W1-like with a bigger token tensor (int64[512] tokens, float32[16], int, str;
about 4.3 KB each). The dataset is --mb big (default 200 MB: the issue's 1 GB does not fit
the shared 2-core machine's time budget, and bytes per record do not depend on it), stored
by both formats as shards of about --shard-mb (default 16 MB). moto copies a whole object
for every GET it answers (about 1 s per GET of a 200 MB object here), so its time per
request grows with the object and both formats pay it; shards keep it small. One process,
medians; the loopback servers have no network latency, so latencies are a floor, and
requests and bytes are the portable figures. Each client is warmed (session, connections)
before it is timed.

Run: python benchmarks/remote.py [--mb 200] [--reads 1000] [--shard-mb 16]
Writes benchmarks/results/remote.json and .md.
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
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import evalue_store as evs  # noqa: E402
from tests.servers import nginx, s3_server  # noqa: E402

RESULTS = Path(__file__).parent / "results"
RECORD_BYTES = 512 * 8 + 16 * 4 + 8 + 9


def record(i: int, rng: np.random.Generator) -> list:
    return [rng.integers(0, 50_000, 512), rng.random(16, dtype=np.float32), i % 10, f"ex-{i:06d}"]


class S3Counter:
    """GET requests and body bytes the proxy in front of moto saw."""

    def __init__(self, s3: Any):
        self.log = s3.log

    def mark(self) -> int:
        return len(self.log.seen)

    def since(self, mark: int) -> tuple[int, int]:
        seen = self.log.seen[mark:]
        return sum(s.method == "GET" for s in seen), sum(s.body_bytes for s in seen)


class NginxCounter:
    """GET requests and body bytes from nginx's access log."""

    def __init__(self, server: Any):
        self.server = server

    def mark(self) -> int:
        return len(self.server.requests())

    def since(self, mark: int) -> tuple[int, int]:
        seen = self.server.requests()[mark:]
        return sum(r[0].startswith("GET") for r in seen), sum(r[2] for r in seen)


def ours(count: Any, url: str, opts: dict | None, n: int, reads: list[int]) -> dict:

    def opener() -> Any:
        return evs.open_shards(url, storage_options=opts)

    out: dict[str, Any] = {}
    opener().shard(0)  # the client's session and connections
    mark = count.mark()
    t = time.perf_counter()
    ds = opener()
    out["open_manifest_ms"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    ds.shard(1)
    out["open_shard_ms"] = (time.perf_counter() - t) * 1e3
    out["open_requests"], out["open_bytes"] = count.since(mark)
    ds.validate()  # every shard open: what follows is the cost of records alone
    cold, warm, per_bytes = [], [], []
    for i in reads[:200]:
        mark = count.mark()
        t = time.perf_counter()
        ds[i]
        cold.append(time.perf_counter() - t)
        per_bytes.append(count.since(mark)[1])
    for i in reads[:200]:
        t = time.perf_counter()
        ds[i]
        warm.append(time.perf_counter() - t)
    out["get_cold_ms"] = statistics.median(cold) * 1e3
    out["get_warm_us"] = statistics.median(warm) * 1e6
    out["bytes_per_cold_get"] = statistics.median(per_bytes)
    batches = []
    for k in range(3):
        fresh = opener()
        fresh.validate()
        idx = np.random.default_rng(10 + k).choice(n, 256, replace=False)
        mark = count.mark()
        t = time.perf_counter()
        fresh[idx]
        batches.append((time.perf_counter() - t, *count.since(mark)))
    out["batch256_ms"] = statistics.median(b[0] for b in batches) * 1e3
    out["batch256_requests"] = statistics.median(b[1] for b in batches)
    out["batch256_bytes"] = statistics.median(b[2] for b in batches)
    out.update(first_and_total(count, opener, reads))
    return out


def first_and_total(count: Any, opener: Any, reads: list[int]) -> dict:
    """Time to the first record (open included) and for all of ``reads`` one by one, and
    the bytes the server sent, from a fresh reader."""
    mark = count.mark()
    t = time.perf_counter()
    ds = opener()
    ds[reads[0]]
    first = time.perf_counter() - t
    for i in reads[1:]:
        ds[i]
    total = time.perf_counter() - t
    requests, nbytes = count.since(mark)
    return {
        "first_record_ms": first * 1e3,
        "random_reads_s": total,
        "random_reads_requests": requests,
        "random_reads_bytes": nbytes,
    }


def mosaic(
    s3: Any, local_dir: Path, records: Any, reads: list[int], tmp: Path, shard_bytes: int
) -> dict:
    try:
        from benchmarks.adapters.mds import streaming  # stubs torchvision as the adapter does
    except Exception as exc:
        return {"unavailable": f"{exc!r}"}
    columns = {"tokens": "ndarray:int64:512", "features": "ndarray:float32:16"}
    columns.update({"label": "int", "id": "str"})
    out_dir = local_dir / "mds"
    with streaming.MDSWriter(
        out=str(out_dir), columns=columns, progress_bar=False, size_limit=shard_bytes
    ) as w:
        for r in records():
            w.write(dict(zip(["tokens", "features", "label", "id"], r)))
    fs = s3.fs()
    for p in sorted(out_dir.iterdir()):
        fs.put_file(str(p), f"bkt/mds/{p.name}")
    os.environ.update(
        S3_ENDPOINT_URL=s3.proxy.url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    cache = tmp / "mds-cache"
    streaming.base.util.clean_stale_shared_memory()
    import boto3

    boto3.client("s3", endpoint_url=s3.proxy.url).head_object(Bucket="bkt", Key="mds/index.json")

    def opener() -> Any:
        return streaming.StreamingDataset(
            remote="s3://bkt/mds", local=str(cache), shuffle=False, batch_size=1
        )

    result = first_and_total(S3Counter(s3), opener, reads)
    result["shards"] = len(list(out_dir.glob("*.mds")))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--reads", type=int, default=1000)
    p.add_argument("--shard-mb", type=int, default=16)
    args = p.parse_args()
    n = args.mb * 1_000_000 // RECORD_BYTES
    tmp = Path(tempfile.mkdtemp(prefix="evs-remote-bench-"))

    def records() -> Any:
        rng = np.random.default_rng(0)
        return (record(i, rng) for i in range(n))

    reads = np.random.default_rng(1).choice(n, args.reads, replace=False).tolist()
    try:
        with s3_server(own_process=True) as s3:
            s3.fs().mkdir("bkt")
            shard_bytes = args.shard_mb << 20
            with evs.ShardWriter(tmp / "evs" / "part-{:04d}.evs", max_bytes=shard_bytes) as w:
                w.extend(records())
            fs = s3.fs()
            size = 0
            for p in sorted((tmp / "evs").iterdir()):
                size += p.stat().st_size
                fs.put_file(str(p), f"bkt/evs/{p.name}")
            result = {
                "records": n,
                "object_bytes": size,
                "shards": len(list((tmp / "evs").glob("*.evs"))),
                "record_bytes": RECORD_BYTES,
                "reads": args.reads,
                "evalue_store": ours(
                    S3Counter(s3), "s3://bkt/evs/part.manifest.json", s3.options, n, reads
                ),
                "mosaicml_streaming": mosaic(s3, tmp, records, reads, tmp, shard_bytes),
            }
        (tmp / "nginx").mkdir()
        with nginx(tmp / "evs", tmp / "nginx") as server:
            url = f"{server.url}/part.manifest.json"
            result["evalue_store_http"] = ours(NginxCounter(server), url, None, n, reads)
        result.update(
            {
                "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            }
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "remote.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "remote.md").write_text(report(result))
    print(report(result))


def report(r: dict) -> str:
    e, m, h = r["evalue_store"], r["mosaicml_streaming"], r["evalue_store_http"]
    mb = r["object_bytes"] / 1e6
    lines = [
        f"# Remote reads through a local S3 server (moto): {r['records']:,} records, {mb:.0f} MB, "
        f"{r['shards']} shards",
        "",
        "| evalue_store | S3 (moto) | HTTP (nginx) |",
        "|---|---|---|",
        _pair("open: manifest + one shard", e, h, _open),
        _pair("ds[i] cold (median)", e, h, _cold),
        _pair("ds[i] warm (median)", e, h, lambda x: f"{x['get_warm_us']:.0f} µs"),
        _pair("batch of 256 random", e, h, _batch),
        "",
        f"{r['reads']:,} random records one by one, from a fresh reader (shards open or "
        "download on first use):",
        "",
        "| | time to first record | total | GETs | bytes transferred |",
        "|---|---|---|---|---|",
        _row("evalue_store, S3", e),
        _row("evalue_store, HTTP (nginx)", h),
    ]
    if "unavailable" in m:
        lines.append(f"| MosaicML Streaming | unavailable: {m['unavailable']} | | | |")
    else:
        lines.append(_row(f"MosaicML Streaming ({m['shards']} shards)", m))
    return "\n".join(lines) + "\n"


def _pair(name: str, s3: dict, http: dict, cell: Any) -> str:
    return f"| {name} | {cell(s3)} | {cell(http)} |"


def _open(x: dict) -> str:
    ms = x["open_manifest_ms"] + x["open_shard_ms"]
    return f"{ms:.1f} ms, {x['open_requests']} GETs, {x['open_bytes']:,} B"


def _cold(x: dict) -> str:
    return f"{x['get_cold_ms']:.2f} ms, {x['bytes_per_cold_get']:,.0f} B"


def _batch(x: dict) -> str:
    ms, gets, nbytes = x["batch256_ms"], x["batch256_requests"], x["batch256_bytes"]
    return f"{ms:.0f} ms, {gets:.0f} GETs, {nbytes:,.0f} B"


def _row(name: str, x: dict) -> str:
    return (
        f"| {name} | {x['first_record_ms']:.1f} ms | {x['random_reads_s']:.2f} s | "
        f"{x['random_reads_requests']} | {x['random_reads_bytes'] / 1e6:.1f} MB |"
    )


if __name__ == "__main__":
    main()
