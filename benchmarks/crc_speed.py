"""The record checksum of evalue_store._native against the packages it replaces, and what a
verified read of a big record costs against one pass over its bytes.

1. One buffer per call, in cache (the same buffer repeated): ``_native.crc32c`` against
   ``crc32c.crc32c`` and ``_native.crc32`` against ``zlib.crc32``, per size.
2. Many ranges per call: ``_native.checksums`` of 256 ranges against 256 calls.
3. W2-like records from memory: N records of uint8[224, 224, 3] (150 KB) in a plain file
   (N x 150 KB, far beyond the CPU caches; in the page cache, every page mapped before
   timing), read in a random order: ``ds[i]`` verified and not, the checksum alone (ours,
   the crc32c package's), ``np.copyto`` of the payload (one read and one write pass).
4. W3-like: one 64 MiB tensor: verified and unverified get, against ``np.copyto`` of it.

Timed in thread CPU time (a shared machine's waits are not counted), variants interleaved
per repeat, medians reported. Results go to benchmarks/results/crc_speed.json and .md.

Usage: PYTHONPATH=src python benchmarks/crc_speed.py [--records N] [--repeats R]
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
import zlib
from typing import Any, Callable

import crc32c
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import evalue_store as evs  # noqa: E402
from evalue_store import _native  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")
SIZES = [0, 16, 64, 256, 1228, 4096, 16384, 150528, 1 << 20, 4 << 20]


def medians(fns: dict[str, Callable[[], Any]], repeats: int, per: int) -> dict[str, float]:
    """Median thread-CPU µs per unit of each function (run ``repeats`` times, interleaved;
    each call covers ``per`` units)."""
    runs: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.thread_time()
            fn()
            runs[name].append((time.thread_time() - start) / per * 1e6)
    return {k: statistics.median(v) for k, v in runs.items()}


def single_buffer(repeats: int) -> list[dict]:
    rows = []
    for size in SIZES:
        buf = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
        assert _native.crc32c(buf) == crc32c.crc32c(buf) and _native.crc32(buf) == zlib.crc32(buf)
        calls = max(20, 4_000_000 // max(size, 256))

        def loop(fn, calls=calls, buf=buf):
            return lambda: [fn(buf) for _ in range(calls)]

        fns = {
            "crc32c_pkg": loop(crc32c.crc32c),
            "crc32c_native": loop(_native.crc32c),
            "zlib_crc32": loop(zlib.crc32),
            "crc32_native": loop(_native.crc32),
        }
        rows.append({"size": size, **medians(fns, repeats, calls)})
    return rows


def many_ranges(repeats: int) -> list[dict]:
    rows = []
    data = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8)
    view = memoryview(data)

    def cases(size: int) -> dict[str, Callable[[], Any]]:
        starts = np.sort(np.random.default_rng(size).integers(0, len(data) - size, 256))
        listed = starts.tolist()
        return {
            "crc32c_pkg_loop": lambda: [crc32c.crc32c(view[s : s + size]) for s in listed],
            "checksums_crc32c": lambda: _native.checksums(data, starts, size, "crc32c"),
            "zlib_loop": lambda: [zlib.crc32(view[s : s + size]) for s in listed],
            "checksums_crc32": lambda: _native.checksums(data, starts, size, "crc32"),
        }

    for size in (64, 1228, 16384, 150528):
        rows.append({"size": size, **medians(cases(size), repeats, 256)})
    return rows


def w2(records: int, repeats: int, work: str) -> dict:
    path = os.path.join(work, "w2.evs")
    rng = np.random.default_rng(2)
    with evs.Writer(path, durable=False) as w:
        for lo in range(0, records, 250):
            n = min(250, records - lo)
            images = rng.integers(0, 256, (n, 224, 224, 3), dtype=np.uint8)
            w.extend_columns({0: images, 1: np.arange(lo, lo + n)})
    with evs.open(path) as ds, evs.open(path, verify=False) as raw:
        entries = ds.entries()
        starts = (entries["offset"] + 16).tolist()
        length = int(entries["length"][0])
        mapped = np.memmap(path, np.uint8, "r")
        view = memoryview(mapped)
        order = np.random.default_rng(3).permutation(records).tolist()
        out = np.empty(length, np.uint8)
        fns = {
            "get_verify": lambda: [ds[i][0][0, 0, 0] for i in order],
            "get_noverify": lambda: [raw[i][0][0, 0, 0] for i in order],
            "crc32c_native": lambda: [_native.crc32c(view[starts[i] :][:length]) for i in order],
            "crc32c_pkg": lambda: [crc32c.crc32c(view[starts[i] :][:length]) for i in order],
            "copyto": lambda: [np.copyto(out, mapped[starts[i] :][:length]) for i in order],
        }
        for fn in fns.values():
            fn()  # every page mapped
        result = medians(fns, repeats, records)
    os.remove(path)
    return {"records": records, "payload_bytes": length, **result}


def w3(repeats: int, work: str) -> dict:
    path = os.path.join(work, "w3.evs")
    tensor = np.random.default_rng(4).random(16 << 20, dtype=np.float32)  # 64 MiB
    with evs.Writer(path, durable=False) as w:
        for _ in range(4):
            w.append([tensor])
    del tensor
    out = np.empty(16 << 20, np.float32)
    with evs.open(path) as ds, evs.open(path, verify=False) as raw:
        views = [raw[i][0] for i in range(4)]
        k = iter(range(10**9))
        fns = {
            "get_verify": lambda: ds[next(k) % 4][0][0],
            "get_noverify": lambda: raw[next(k) % 4][0][0],
            "copyto": lambda: np.copyto(out, views[next(k) % 4]),
        }
        for fn in fns.values():
            fn()
        result = medians(fns, repeats * 4, 1)
    os.remove(path)
    return {"tensor_bytes": 64 << 20, **result}


def markdown(meta: dict, single: list, many: list, w2r: dict, w3r: dict) -> str:
    lines = [
        "# Record checksums: evalue_store._native against crc32c / zlib (thread CPU time)",
        "",
        f"{meta['machine']}; load average {meta['load_start']} at start, "
        f"{meta['load_end']} at end; medians of {meta['repeats']} interleaved runs.",
        "",
        "## One buffer per call, in cache (µs per call)",
        "",
        "| bytes | crc32c pkg | _native.crc32c | ratio | zlib.crc32 | _native.crc32 | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in single:
        lines.append(
            f"| {r['size']:,} | {r['crc32c_pkg']:.3f} | {r['crc32c_native']:.3f} | "
            f"{r['crc32c_pkg'] / r['crc32c_native']:.2f}x | {r['zlib_crc32']:.3f} | "
            f"{r['crc32_native']:.3f} | {r['zlib_crc32'] / r['crc32_native']:.2f}x |"
        )
    lines += [
        "",
        "ratio > 1: _native is faster.",
        "",
        "## 256 ranges of one buffer (µs per range)",
        "",
        "| bytes | crc32c pkg, a call each | checksums crc32c | zlib.crc32, a call each "
        "| checksums crc32 |",
        "|---|---|---|---|---|",
    ]
    for r in many:
        lines.append(
            f"| {r['size']:,} | {r['crc32c_pkg_loop']:.3f} | {r['checksums_crc32c']:.3f} | "
            f"{r['zlib_loop']:.3f} | {r['checksums_crc32']:.3f} |"
        )
    lines += [
        "",
        f"## W2-like: {w2r['records']:,} records of {w2r['payload_bytes']:,} bytes, random "
        "order, from memory (µs per record)",
        "",
        "| ds[i] verify=True | ds[i] verify=False | _native.crc32c of the payload "
        "| crc32c pkg of the payload | np.copyto of the payload |",
        "|---|---|---|---|---|",
        f"| {w2r['get_verify']:.2f} | {w2r['get_noverify']:.2f} | {w2r['crc32c_native']:.2f} "
        f"| {w2r['crc32c_pkg']:.2f} | {w2r['copyto']:.2f} |",
        "",
        "## W3-like: one 64 MiB tensor (µs per get)",
        "",
        "| get verify=True | get verify=False | np.copyto of it | verified / copyto |",
        "|---|---|---|---|",
        f"| {w3r['get_verify']:.0f} | {w3r['get_noverify']:.1f} | {w3r['copyto']:.0f} "
        f"| {w3r['get_verify'] / w3r['copyto']:.2f}x |",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=5000, help="W2 records (150 KB each)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default="crc_speed", help="results file name (no suffix)")
    args = parser.parse_args()
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "load_start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "repeats": args.repeats,
        "hardware_crc32c": _native.crc32c_hardware(),
    }
    single = single_buffer(args.repeats)
    many = many_ranges(args.repeats)
    with tempfile.TemporaryDirectory() as work:
        w2r = w2(args.records, max(3, args.repeats // 2), work)
        w3r = w3(args.repeats, work)
    meta["load_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = markdown(meta, single, many, w2r, w3r)
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{args.out}.md"), "w") as f:
        f.write(text)
    with open(os.path.join(RESULTS, f"{args.out}.json"), "w") as f:
        json.dump({"meta": meta, "single": single, "many": many, "w2": w2r, "w3": w3r}, f, indent=1)


if __name__ == "__main__":
    main()
