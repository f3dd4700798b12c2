"""The benchmark harness itself: every adapter available here must return exactly the records
that were written (the comparison is only fair if every format stores the same data).

Only the --quick smoke runs in the test suite; real benchmarks never do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmark_round_trips_the_same_records(tmp_path):
    adapters = "floor,npz,evalue_store,evalue_store_noverify,evalue_store_zstd"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run.py"),
            "--quick",
            "--check",
            "--adapters",
            adapters,
            "--library",
            "worktree",
            "--results-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = (tmp_path / "quick.md").read_text()
    for name in adapters.split(","):
        assert f"| {name} |" in report, name
