"""ExecuTorch training steps/s fed from a container against feeding from memory.

Programs (exported here, static batch): ExecuTorch's XOR example (float32 [B, 2] inputs) and
an MLP on 32x32 float32 images (1024 -> 256 -> 10), each at batch 32 and 256; int labels.
Every step is ``TrainingModule.forward_backward`` plus ExecuTorch's SGD step, over a
shuffled epoch order. Feeds, interleaved per repeat so that a busy machine slows them alike:

* ``container``: ``evalue_store.executorch.Binding.batches(order, reuse=True)`` over a plain
  file (``verify=True``, the default);
* ``memory``: the whole dataset as two torch tensors, each batch gathered with ``index_select``
  (the cheapest feed there is);
* ``memory-list``: a Python list of the records, each batch stacked with numpy (what a
  hand-written loop over in-memory records does).

Reported: median steps/s over ``--repeats`` runs of ``--seconds`` (at most ``--steps``
steps) each, the container's ratio to ``memory``, and the container's feed alone (batches/s
without training). Results go to benchmarks/results/executorch.json and .md.

With ``--cpp``, the same programs and container files in C++ too (needs g++):
cpp/examples/train_batches.cc linked to the wheel's libexecutorch.so, its batches read with
the C++ reader against gathered from in-memory arrays (interleaved, ``--repeats`` runs of
about ``--seconds`` each), the feed's CPU ns per record in each, and the reader's own cost
per record (cpp/tools/evs_bench.cc: open, then read every record, in order and shuffled).

Usage: PYTHONPATH=.:src python benchmarks/bench_executorch.py [--seconds S] [--repeats R]
[--cpp]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import evalue_store as evs  # noqa: E402
from evalue_store.executorch import bind, load_training_module  # noqa: E402
from tests.et_programs import export_model  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")
SHAPES = {"xor": (2,), "mlp": (32, 32)}
CLASSES = {"xor": 2, "mlp": 10}


def records(model: str, n: int) -> list[list]:
    rng = np.random.default_rng(0)
    x = rng.random((n, *SHAPES[model]), dtype=np.float32)
    y = rng.integers(0, CLASSES[model], n)
    return [[x[i], int(y[i])] for i in range(n)]


class Steps:
    """A TrainingModule and its SGD optimizer, stepped on whatever batches it is fed."""

    def __init__(self, program: str):
        from executorch.extension.training import get_sgd_optimizer

        self.module = load_training_module(program)
        self.sgd = get_sgd_optimizer
        self.optimizer = None

    def __call__(self, inputs: list[torch.Tensor]) -> None:
        self.module.forward_backward("forward", inputs)
        if self.optimizer is None:
            self.optimizer = self.sgd(self.module.named_parameters(), 0.01, 0, 0, 0, False)
        self.optimizer.step(self.module.named_gradients())


def cycle_orders(n: int, seed: int = 0):
    epoch = 0
    while True:
        yield np.random.default_rng([seed, epoch]).permutation(n)
        epoch += 1


def timed(batches, step, seconds: float, max_steps: int) -> tuple[float, int]:
    """(steps/s, steps) over ``seconds`` or ``max_steps`` steps, whichever ends first, after
    one warm-up step."""
    step(next(batches))
    steps, start = 0, time.perf_counter()
    while steps < max_steps and (steps < 3 or time.perf_counter() - start < seconds):
        step(next(batches))
        steps += 1
    return steps / (time.perf_counter() - start), steps


def feeds(binding, data: list[list], tensors: list[torch.Tensor], batch: int, n: int):
    def container():
        for order in cycle_orders(n):
            for b in binding.batches(order, reuse=True):
                yield b.inputs

    def memory():
        for order in cycle_orders(n):
            index = torch.from_numpy(order)
            for begin in range(0, n - batch + 1, batch):
                chosen = index[begin : begin + batch]
                yield [t.index_select(0, chosen) for t in tensors]

    def memory_list():
        for order in cycle_orders(n):
            for begin in range(0, n - batch + 1, batch):
                chosen = [data[i] for i in order[begin : begin + batch]]
                x = torch.from_numpy(np.stack([r[0] for r in chosen]))
                yield [x, torch.tensor([r[1] for r in chosen], dtype=torch.int64)]

    return {"container": container, "memory": memory, "memory-list": memory_list}


def run_case(model: str, batch: int, n: int, args: argparse.Namespace, work: str) -> dict:
    program = str(export_model(os.path.join(work, f"{model}{batch}.pte"), model, batch=batch))
    data = records(model, n)
    path = os.path.join(work, f"{model}.evs")
    if not os.path.exists(path):
        with evs.Writer(path) as w:
            w.extend(data)
    binding = bind(path, program)
    tensors = [
        torch.from_numpy(np.stack([r[0] for r in data])),
        torch.tensor([r[1] for r in data], dtype=torch.int64),
    ]
    step = Steps(program)
    makers = feeds(binding, data, tensors, batch, n)
    rates: dict[str, list[float]] = {name: [] for name in makers}
    feed_only: list[float] = []
    counts = []
    for _ in range(args.repeats):
        for name, make in makers.items():
            rate, steps = timed(make(), step, args.seconds, args.steps)
            rates[name].append(rate)
            counts.append(steps)
        feed_only.append(timed(makers["container"](), lambda inputs: None, 1.0, args.steps)[0])
    result = {name: statistics.median(r) for name, r in rates.items()}
    result["container_feed_only"] = statistics.median(feed_only)
    result["ratio"] = result["container"] / result["memory"]
    return {"model": model, "batch": batch, "records": n, "min_steps": min(counts), **result}


def cpp_train(program: str, data: str, steps: int, memory: bool) -> tuple[float, float, float]:
    """(steps/s, steps per CPU second, feed CPU ns per record) of one train_batches run."""
    from tests import native

    cmd = [str(native.build_executorch() / "train_batches"), program, data, str(steps), "0.01"]
    done = subprocess.run(cmd + (["memory"] if memory else []), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}")
    tail = {k: float(v) for k, v in (line.split() for line in done.stdout.splitlines()[-3:])}
    return tail["steps_per_s"], tail["cpu_steps_per_s"], tail["feed_ns_per_record"]


def cpp_case(model: str, batch: int, n: int, args: argparse.Namespace, work: str) -> dict:
    """The C++ side of ``run_case`` over the files it left in ``work``."""
    from tests import native

    program, data = (os.path.join(work, f) for f in (f"{model}{batch}.pte", f"{model}.evs"))
    rate, _, _ = cpp_train(program, data, 20, memory=False)  # calibration: steps for --seconds
    steps = max(20, min(int(rate * args.seconds), 200_000))
    runs: dict[str, list[tuple[float, float, float]]] = {"container": [], "memory": []}
    for _ in range(args.repeats):
        for name in runs:
            runs[name].append(cpp_train(program, data, steps, memory=name == "memory"))
    out: dict[str, Any] = {"steps": steps}
    for name, values in runs.items():
        out[name] = statistics.median(v[0] for v in values)
        out[f"cpu_{name}"] = statistics.median(v[1] for v in values)
        out[f"feed_ns_{name}"] = statistics.median(v[2] for v in values)
    out["ratio"] = out["container"] / out["memory"]
    out["cpu_ratio"] = out["cpu_container"] / out["cpu_memory"]
    bench = native.build("release") / "evs_bench"
    done = subprocess.run([str(bench), data, "11"], capture_output=True, text=True, check=True)
    read = json.loads(done.stdout)
    read.pop("sink")
    return {
        **out,
        "read": read,
        "record_bytes": os.path.getsize(data) // n,
    }


def cpp_markdown(rows: list[dict]) -> str:
    lines = [
        "",
        "## C++ (cpp/examples/train_batches.cc, the wheel's libexecutorch.so)",
        "",
        "Steps/s: wall time of the training loop; CPU: steps per second of the loop "
        "thread's CPU time (what a shared machine's load does not change). Feed: the "
        "thread's CPU time gathering a batch (reading included) per record. Reader alone "
        "(cpp/tools/evs_bench.cc, CPU time): open, then read(i) of every record with its "
        "checksum, each tensor touched.",
        "",
        "| model | batch | container | memory (arrays) | container / memory "
        "| CPU: container / memory | feed ns/rec container | feed ns/rec memory "
        "| reader ns/rec in order | shuffled | no checksum | open µs | bytes/rec |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        c, r = row["cpp"], row["cpp"]["read"]
        lines.append(
            f"| {row['model']} | {row['batch']} | {_rate(c['container'])} | "
            f"{_rate(c['memory'])} | {c['ratio']:.2f}x | {c['cpu_ratio']:.2f}x | "
            f"{c['feed_ns_container']:,.0f} | "
            f"{c['feed_ns_memory']:,.0f} | {r['ns_per_record']:,.0f} | "
            f"{r['ns_per_record_random']:,.0f} | {r['ns_per_record_no_crc']:,.0f} | "
            f"{r['open_us']:,.1f} | {c['record_bytes']} |"
        )
    return "\n".join(lines) + "\n"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# ExecuTorch training: steps/s fed from a container vs from memory",
        "",
        f"{meta['machine']}; executorch {meta['executorch']}, torch {meta['torch']}; "
        f"median of {meta['repeats']} runs of up to {meta['seconds']} s each "
        f"(at least {min(r['min_steps'] for r in rows)} steps). {meta['note']}",
        "",
        "| model | batch | container | memory (tensors) | memory (list) | container / memory "
        "| container feed alone (batches/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rates = [_rate(r[k]) for k in ("container", "memory", "memory-list")]
        lines.append(
            f"| {r['model']} | {r['batch']} | {' | '.join(rates)} | {r['ratio']:.2f}x "
            f"| {_rate(r['container_feed_only'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--steps", type=int, default=2000, help="at most, per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--note", default="", help="a line about the machine's load")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--cpp", action="store_true", help="the C++ loop too (needs g++)")
    args = parser.parse_args(argv)
    from importlib.metadata import version

    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "executorch": version("executorch"),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "seconds": args.seconds,
        "note": args.note,
    }
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for model, n in (("xor", 8192), ("mlp", 4096)):
            for batch in (32, 256):
                rows.append(run_case(model, batch, n, args, work))
                if args.cpp:
                    rows[-1]["cpp"] = cpp_case(model, batch, n, args, work)
                print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "executorch.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    text = markdown(rows, meta) + (cpp_markdown(rows) if args.cpp else "")
    with open(os.path.join(args.out, "executorch.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
