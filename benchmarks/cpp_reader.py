"""C++ reader benchmark (issue 15 item 4): reading overhead per small record, and steps/s of
ExecuTorch's XOR training program fed from a container against fed from memory, in C++.

    PYTHONPATH=src:. python benchmarks/cpp_reader.py [--records N] [--steps N] [--out FILE]

One run, medians of the C++ timers (cpp/tools/evs_bench.cc, cpp/examples/train_xor.cc);
ratios are within the run. Needs g++, and for the training part the executorch wheel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import evalue_store as evs
from tests import native


def small_records(path: Path, n: int, version: str = "1.1") -> None:
    """XOR examples as an app builds them: [x float32 [1, 2], y int64 [1]] (~200 B frames)."""
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
    y = np.array([0, 1, 1, 0], np.int64)
    picks = np.random.default_rng(0).integers(0, 4, n)
    with evs.Writer(path, format_version=version) as w:
        for k in picks:
            w.append([x[k : k + 1].copy(), y[k : k + 1].copy()])


def mixed_records(path: Path, n: int, version: str = "1.1") -> None:
    """Four values of the common kinds: a float32 [32] tensor, an Int, a String, a Double."""
    rng = np.random.default_rng(1)
    with evs.Writer(path, format_version=version) as w:
        for i in range(n):
            w.append([rng.random(32, dtype=np.float32), i, f"r{i}", 0.5 * i])


def read_overhead(work: Path, records: int) -> dict:
    bench = native.build("release") / "evs_bench"
    out = {}
    cases = [
        (f"{name}_v{version}", make, version)
        for name, make in (("xor_2_values", small_records), ("mixed_4_values", mixed_records))
        for version in ("1.0", "1.1")
    ]  # checksums: zlib CRC-32, CRC-32C
    for name, make, version in cases:
        path = work / f"{name}.evs"
        make(path, records, version)
        done = subprocess.run([str(bench), str(path), "15"], capture_output=True, text=True)
        done.check_returncode()
        result = json.loads(done.stdout)
        result.pop("sink")
        result["frame_bytes"] = path.stat().st_size // records
        out[name] = result
    return out


def training(work: Path, steps: int, rounds: int = 5) -> dict:
    if native.executorch_root() is None:
        return {"skipped": "the executorch wheel is not installed"}
    from tests.test_cpp_executorch import export_xor

    program = work / "xor.pte"
    export_xor(program)
    data = work / "xor.evs"
    small_records(data, 1000)
    train = native.build_executorch() / "train_xor"
    rates: dict[str, list[float]] = {"container": [], "memory": []}
    for _ in range(rounds):  # interleaved, so machine load hits both alike
        for mode in rates:
            cmd = [str(train), str(program), str(data), str(steps), "0.5"]
            done = subprocess.run(
                cmd + (["memory"] if mode == "memory" else []), capture_output=True, text=True
            )
            done.check_returncode()
            rates[mode].append(float(done.stdout.split()[-1]))
    container, memory = (statistics.median(rates[m]) for m in ("container", "memory"))
    return {
        "steps": steps,
        "steps_per_s_container": round(container),
        "steps_per_s_memory": round(memory),
        "container_over_memory": round(container / memory, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        report = {
            "read": read_overhead(work, args.records),
            "train_xor": training(work, args.steps),
        }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
