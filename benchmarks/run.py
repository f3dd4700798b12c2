"""Benchmark entry point: ``python benchmarks/run.py [--quick] [--check]`` (see README.md)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
