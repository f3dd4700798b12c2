"""ExecuTorch training steps/s fed from a container against feeding from memory.

Programs (exported here, static batch): ExecuTorch's XOR example (float32 [B, 2] inputs) and
an MLP on 32x32 float32 images (1024 -> 128 -> 10), each at batch 32 and 256; int labels.
Every step is ``TrainingModule.forward_backward`` plus ExecuTorch's SGD step, over a
shuffled epoch order. Feeds, interleaved per repeat so that a busy machine slows them alike:

* ``container``: ``evalue_store.executorch.Binding.batches(order, reuse=True)`` over a plain
  file (``verify=True``, the default);
* ``memory``: the whole dataset as two torch tensors, each batch gathered with ``index_select``
  (the cheapest feed there is);
* ``memory-list``: a Python list of the records, each batch stacked with numpy (what a
  hand-written loop over in-memory records does).

Reported: median steps/s over ``--repeats`` runs of ``--steps`` steps, the container's ratio
to ``memory``, and the container's feed alone (batches/s without training). Results go to
benchmarks/results/executorch.json and .md.

Usage: PYTHONPATH=.:src python benchmarks/bench_executorch.py [--steps S] [--repeats R]
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


def timed(batches, step, steps: int) -> float:
    """Steps/s over ``steps`` steps (after one warm-up step)."""
    step(next(batches))
    start = time.perf_counter()
    for _ in range(steps):
        step(next(batches))
    return steps / (time.perf_counter() - start)


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


def run_case(model: str, batch: int, n: int, steps: int, repeats: int, work: str) -> dict:
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
    for _ in range(repeats):
        for name, make in makers.items():
            rates[name].append(timed(make(), step, steps))
        feed_only.append(timed(makers["container"](), lambda inputs: None, steps))
    result = {name: statistics.median(r) for name, r in rates.items()}
    result["container_feed_only"] = statistics.median(feed_only)
    result["ratio"] = result["container"] / result["memory"]
    return {"model": model, "batch": batch, "records": n, "steps": steps, **result}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# ExecuTorch training: steps/s fed from a container vs from memory",
        "",
        f"{meta['machine']}; executorch {meta['executorch']}, torch {meta['torch']}; "
        f"median of {meta['repeats']} runs of {rows[0]['steps']} steps each.",
        "",
        "| model | batch | container | memory (tensors) | memory (list) | container / memory "
        "| container feed alone (batches/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['container']:,.0f} | {r['memory']:,.0f} "
            f"| {r['memory-list']:,.0f} | {r['ratio']:.2f}x | {r['container_feed_only']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    import executorch  # noqa: F401  (version below)
    from importlib.metadata import version

    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "executorch": version("executorch"),
        "torch": torch.__version__,
        "repeats": args.repeats,
    }
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for model, n in (("xor", 8192), ("mlp", 4096)):
            for batch in (32, 256):
                rows.append(run_case(model, batch, n, args.steps, args.repeats, work))
                print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "executorch.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "executorch.md"), "w") as f:
        f.write(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
