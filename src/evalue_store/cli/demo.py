"""``demo``: pack a built-in sample, read it back, verify it and show it."""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import numpy as np

from .info import info_report, print_head, print_info
from .pack import expand_inputs, pack_files
from .registry import command
from .render import EXIT_OK, EXIT_PROBLEMS, PROG, CliError, open_dataset

DEMO_RECORDS = 300


def demo_record(i: int) -> dict[str, Any]:
    """Record ``i`` of the built-in W1-like sample (tokens, features, label, id)."""
    rng = np.random.default_rng(i)
    return {
        "tokens": rng.integers(0, 32_000, 128, dtype=np.int64),
        "features": rng.standard_normal(16).astype(np.float32),
        "label": int(rng.integers(0, 10)),
        "id": f"w1-{i:05d}",
    }


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="DIR", help="where to put the demo (default: a new temp dir)")


@command(
    "demo",
    f"pack a built-in sample of {DEMO_RECORDS} W1-like records, read, verify and show it",
    "evalue-store demo --dir /tmp/evs-demo",
    _demo_args,
)
def cmd_demo(args: argparse.Namespace) -> int:
    folder = args.dir or tempfile.mkdtemp(prefix="evalue-store-demo-")
    samples = os.path.join(folder, "samples")
    os.makedirs(samples, exist_ok=True)
    for i in range(DEMO_RECORDS):
        np.savez(os.path.join(samples, f"{i:05d}.npz"), **demo_record(i))
    print(f"1. wrote {DEMO_RECORDS} sample .npz files to {samples}")
    out = os.path.join(folder, "demo.evs")
    pack = argparse.Namespace(
        **vars(args),
        sources=[samples],
        output=out,
        dtype="float32",
        append=False,
        force=True,
        format_version="1.1",
    )
    pack.metadata = {"dataset": "evalue-store demo (W1-like)"}
    written, size = pack_files(expand_inputs(pack), pack)
    print(f"2. packed them: {PROG} pack {samples} -o {out}  ({written} records, {size:,} bytes)")
    with open_dataset(out) as ds:
        for i, record in enumerate(ds):
            want = demo_record(i)
            same = [np.array_equal(record[0], want["tokens"])]
            same.append(np.array_equal(record[1], want["features"]))
            if not all(same) or record[2:] != [want["label"], want["id"]]:
                raise CliError(out, f"record {i} does not match sample {i}", EXIT_PROBLEMS)
        print(f"3. read back all {len(ds)} records: identical to the samples")
        report = ds.verify()
        if not report.ok:
            raise CliError(out, "; ".join(report.problems) or "bad records", EXIT_PROBLEMS)
        print(f"4. {PROG} verify {out}: OK, {report.bytes_checked:,} bytes checked")
        print(f"\n5. {PROG} info {out}")
        print_info(*info_report(ds))
        print(f"\n6. {PROG} head {out} -n 2")
        print_head(ds, 2)
    print(f"\nthe demo file is {os.path.abspath(out)}")
    print(f"next: {PROG} stats {out} --html {os.path.join(folder, 'report.html')}")
    return EXIT_OK
