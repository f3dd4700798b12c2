"""The benchmark harness itself: every adapter available here must return exactly the records
that were written (the comparison is only fair if every format stores the same data).

Only the --quick smoke runs in the test suite; real benchmarks never do.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import _skip_reason
from benchmarks.report import readme_ratios, readme_table
from benchmarks.workloads import get_workload

ROOT = Path(__file__).resolve().parents[1]


def run_quick(results_dir: Path, *options: str) -> dict:
    """``benchmarks/run.py --quick`` on the working tree; returns the results JSON."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run.py"),
            "--quick",
            *options,
            "--library",
            "worktree",
            "--results-dir",
            str(results_dir),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((results_dir / "quick.json").read_text())


def test_quick_benchmark_round_trips_the_same_records(tmp_path):
    adapters = "floor,npz,evalue_store,evalue_store_noverify,evalue_store_zstd"
    results = run_quick(tmp_path, "--check", "--adapters", adapters, "--workloads", "W1,W2,W3")
    report = (tmp_path / "quick.md").read_text()
    for name in adapters.split(","):
        assert f"| {name} |" in report, name
    table = readme_table(results, "W1")
    assert len(table.splitlines()) == 2 + len(adapters.split(","))
    assert "| **evalue_store** `verify=False` |" in table
    ratios = readme_ratios(results, "W1")
    assert "| **evalue_store** zstd / best peer |" in ratios and "| *best peer* | npz |" in ratios


def test_quick_scaling_reports_every_point(tmp_path):
    options = ("--adapters", "floor,evalue_store", "--workloads", "scaling")
    report = run_quick(tmp_path, *options)["scaling"]
    for series, key in (("records", "get_p50_us"), ("sizes_results", "write_mb_s")):
        for adapter in ("floor", "evalue_store"):
            points = report[series][adapter]
            assert len(points) == 2, (series, adapter, points)
            assert all(p["status"] == "ok" and p[key] > 0 for p in points.values()), points
    markdown = (tmp_path / "quick.md").read_text()
    assert "### open ms by records" in markdown
    assert "### write MB/s by record bytes" in markdown


def test_scaling_skips_a_point_whose_write_would_exceed_the_limit():
    small, big = get_workload("S1000", True), get_workload("S100000", True)
    record_bytes = 32 + 8 + 8 + 10  # int64[4], float32[2], int, a string counted as 10
    previous = {"status": "ok", "workload": "S1000", "write_s": 1.0}
    previous["approx_bytes"] = 1000 * record_bytes
    assert _skip_reason(previous, big, limit_s=50.0).startswith("writing would take ~100 s")
    assert _skip_reason(previous, big, limit_s=150.0) == ""
    assert _skip_reason(None, small, limit_s=1.0) == ""
    failed = {"status": "error", "workload": "S1000"}
    assert _skip_reason(failed, big, limit_s=1e9) == "failed at S1000"
