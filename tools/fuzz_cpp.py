#!/usr/bin/env python3
"""libFuzzer campaign on the C++ reader (cpp/fuzz/fuzz_reader.cc, built by clang with
AddressSanitizer and UBSan): any bytes as a container image must give only error values,
never a crash, a sanitizer report, a leak, a hang or a huge allocation.

    python tools/fuzz_cpp.py [--seconds S] [--work DIR] [-- LIBFUZZER FLAGS...]

Seeds: tests/fuzz_corpus/container and recover (the first byte of an input picks verify on
or off, as in tools/fuzz.py). New coverage goes to DIR/corpus (outside the repository); a
crasher to DIR/crash-*, to be fixed in cpp/ and kept under tests/fuzz_corpus/container/.
Needs clang++ (Debian: apt-get install clang).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import native  # noqa: E402

SEEDS = [ROOT / "tests" / "fuzz_corpus" / t for t in ("container", "recover")]


def campaign(seconds: int, work: Path, extra: list[str] = ()) -> dict:
    """Run libFuzzer for ``seconds``; returns its exit code, runs, coverage and the log."""
    binary = native.build_libfuzzer() / "fuzz_reader"
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    cmd = [str(binary), f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048"]
    cmd += ["-print_final_stats=1", f"-artifact_prefix={work}/", *extra, str(corpus)]
    cmd += [str(s) for s in SEEDS]
    done = subprocess.run(cmd, capture_output=True, text=True, env=native.sanitizer_env())
    log = done.stderr
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
    cov = re.findall(r"cov: (\d+)", log)
    return {
        "returncode": done.returncode,
        "runs": int(runs.group(1)) if runs else 0,
        "coverage": int(cov[-1]) if cov else 0,
        "crashes": sorted(p.name for p in work.glob("crash-*")),
        "log": log,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--work", type=Path)
    parser.add_argument("extra", nargs="*", help="more libFuzzer flags (after --)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="evs-cpp-fuzz-"))
    result = campaign(args.seconds, work, args.extra)
    print(result.pop("log")[-3000:])
    print(result, "work:", work)
    sys.exit(result["returncode"])


if __name__ == "__main__":
    main()
