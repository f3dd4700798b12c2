#!/usr/bin/env python3
"""Replay power cuts at every point of many commits; check no committed record is lost.

Each run records every write, truncate and fsync a workload makes (commits of many sizes,
index merges, a metadata change, reopening with mode "a", an aborted batch, optionally a
record past the write buffer), then rebuilds the file as a power cut could leave it after
each of those calls: the fsynced bytes, plus any subset of the pages written since, some of
them torn sector by sector, at the fsynced or the newest length. Every state is opened,
read, recovered and appended to (tests/crashsim.py says exactly what is checked). The
compressed runs include one whose first commit is big enough for the writer to train its
dictionary and rebuild the file under a temporary name, renamed over the first.

Usage::

    python tools/crash_states.py --seeds 20 --subsets 40          # the README's figure

The exit status is 1 if any state lost a committed record or opened the wrong commit.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_crash_states import explore  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="runs per configuration")
    parser.add_argument("--subsets", type=int, default=40, help="random subsets per point")
    args = parser.parse_args(argv)
    total = commits = failures = 0
    start = time.monotonic()
    for compression in (None, "zstd"):
        # zstd, first=200: the writer trains its dictionary and rebuilds the file at once
        for scale, first in [(1, 0), (2, 0), (4, 0)] + [(1, 200)] * bool(compression):
            for big in (False, True):
                for seed in range(args.seeds):
                    with tempfile.TemporaryDirectory() as tmp:
                        try:
                            states, n = explore(
                                Path(tmp), compression, args.subsets, seed, big, scale, first
                            )
                        except AssertionError as exc:
                            failures += 1
                            print(
                                f"FAIL {compression or 'plain'} scale={scale} first={first} "
                                f"big={big} seed={seed}: {exc}"
                            )
                            continue
                    total += states
                    commits += n
        print(f"{compression or 'plain'}: {total:,} states so far", flush=True)
    elapsed = time.monotonic() - start
    print(
        f"{total:,} crash states explored over {commits:,} commits in {elapsed:.0f} s; "
        f"{failures} runs lost a committed record or opened the wrong commit"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
