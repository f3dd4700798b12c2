"""Offline verification speed: `ds.verify()` (what `evalue-store verify` runs) against one
pass over the same bytes, plain and compressed, and the bytes it reads.

Workload W1 (N x [int64[128] tokens, float32[16] features, int label, str id], N = 50,000
unless ``--records``), written once plain and once compressed (zstd defaults), in three
commits. Measured, medians of ``--repeats`` runs, each a fresh open:

* verify's wall time and rate (records/s, MB/s of the file);
* the floor for a plain file: reading it once and checksumming every byte with CRC-32C
  (``evalue_store.checksums``), what any verifier must at least do; for a compressed file:
  stock ``zstd -t -D DICT`` (decompress every frame and check its content checksum, nothing
  else), which checks less than verify (no record, index or padding) and is the peer a user
  would try first;
* bytes read from the file by the process during verify (``/proc/self/io`` rchar), opened
  with ``backend="pread"`` and a 64 KiB frame cache, as a multiple of the file's size: what a
  remote verify downloads.

Results go to benchmarks/results/verify.json and verify.md.

Usage: python benchmarks/bench_verify.py [--records N] [--repeats R] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import evalue_store as evs
from evalue_store.container import crc32c

RESULTS = Path(__file__).parent / "results"


def write(path: Path, n: int, compression: str | None) -> None:
    rng = np.random.default_rng(0)
    with evs.Writer(path, compression=compression, durable=False) as w:
        for part in np.array_split(np.arange(n), 3):
            w.extend_columns(
                {
                    0: rng.integers(0, 50000, (len(part), 128)),
                    1: rng.random((len(part), 16), dtype=np.float32),
                    2: part % 10,
                    3: [f"ex-{i:08d}" for i in part],
                }
            )
            w.commit()


def bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def time_verify(path: Path, repeats: int) -> float:
    taken = []
    for _ in range(repeats):
        with evs.open(path) as ds:
            t0 = time.perf_counter()
            report = ds.verify()
            taken.append(time.perf_counter() - t0)
        assert report.ok, report
    return statistics.median(taken)


def read_ratio(path: Path) -> float:
    with evs.open(path, backend="pread", cache_bytes=1 << 16) as ds:
        before = bytes_read()
        ds.verify()
        return (bytes_read() - before) / path.stat().st_size


def time_floor(path: Path, compressed: bool, repeats: int, work: Path) -> float:
    taken = []
    if not compressed:
        for _ in range(repeats):
            t0 = time.perf_counter()
            crc32c(path.read_bytes())
            taken.append(time.perf_counter() - t0)
        return statistics.median(taken)
    command = ["zstd", "-q", "-t", str(path)]
    dictionary = evs.read_dictionary(path)
    if dictionary:
        (work / "d.dict").write_bytes(dictionary)
        command[2:2] = ["-D", str(work / "d.dict")]
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(command, check=True)
        taken.append(time.perf_counter() - t0)
    return statistics.median(taken)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="evs-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for name, compression in (("plain", None), ("zstd", "zstd")):
            path = work / ("w1.evs" if compression is None else "w1.evs.zst")
            write(path, args.records, compression)
            size = path.stat().st_size
            verify_s = time_verify(path, args.repeats)
            floor_s = time_floor(path, compression is not None, args.repeats, work)
            rows.append(
                {
                    "file": name,
                    "records": args.records,
                    "file_mb": size / 1e6,
                    "verify_s": verify_s,
                    "verify_rec_s": args.records / verify_s,
                    "verify_mb_s": size / 1e6 / verify_s,
                    "floor": "read + CRC-32C" if compression is None else "zstd -t",
                    "floor_s": floor_s,
                    "ratio_to_floor": verify_s / floor_s,
                    "bytes_read_over_size": read_ratio(path),
                }
            )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "verify.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "# verify speed (benchmarks/bench_verify.py)",
        "",
        f"W1, {args.records:,} records in three commits; medians of {args.repeats} runs.",
        "",
        "| file | MB | verify s | records/s | MB/s | floor | floor s | verify / floor "
        "| bytes read / file size |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['file']} | {r['file_mb']:.1f} | {r['verify_s']:.3f} | "
            f"{r['verify_rec_s']:,.0f} | {r['verify_mb_s']:.0f} | {r['floor']} | "
            f"{r['floor_s']:.3f} | {r['ratio_to_floor']:.2f}x | {r['bytes_read_over_size']:.2f} |"
        )
    (RESULTS / "verify.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
