"""ExecuTorch training programs exported at test time (needs the ``[executorch]`` extra).

Tests that train from a container (the Python ones and the C++ reader's) need a real ``.pte``
with a joint forward/backward graph; exporting it here keeps binary programs out of the
repository and ties them to the installed ExecuTorch. The XOR network is the one ExecuTorch
ships as its training example (2 -> 10 -> sigmoid -> 2, cross-entropy loss as the first
output); the MLP is a slightly larger one for benchmarks.

Command line, for non-Python tests:
``python -m tests.et_programs OUT.pte [--model xor|mlp] [--batch B] [--dynamic MAX]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from executorch.exir import to_edge
from torch import nn
from torch.export import Dim, export
from torch.export.experimental import _export_forward_backward


class XorNet(nn.Module):
    """ExecuTorch's XOR training example: returns (loss, predicted class)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 10)
        self.linear2 = nn.Linear(10, 2)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, input: torch.Tensor, label: torch.Tensor):
        logits = self.linear2(torch.sigmoid(self.linear(input)))
        return self.loss(logits, label), logits.detach().argmax(dim=1)


class MlpNet(nn.Module):
    """A 32x32 single-channel image classifier (1024 -> 256 -> 10): returns (loss, class)."""

    def __init__(self, hidden: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32 * 32, hidden)
        self.fc2 = nn.Linear(hidden, classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, image: torch.Tensor, label: torch.Tensor):
        logits = self.fc2(torch.relu(self.fc1(image.flatten(1))))
        return self.loss(logits, label), logits.detach().argmax(dim=1)


MODELS = {"xor": (XorNet, (2,)), "mlp": (MlpNet, (32, 32))}


def export_training(
    module: nn.Module,
    example_inputs: Sequence[torch.Tensor],
    path: str | Path,
    *,
    dynamic_max: int | None = None,
) -> Path:
    """Export ``module`` (loss first among its outputs) with its backward graph to ``path``.

    With ``dynamic_max``, dimension 0 of every input is one bounded dynamic batch dimension
    (1..dynamic_max); otherwise every shape is fixed to the example's.
    """
    dynamic_shapes = None
    if dynamic_max is not None:
        batch = Dim("batch", min=1, max=dynamic_max)
        dynamic_shapes = tuple({0: batch} for _ in example_inputs)
    program = export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=True)
    program = _export_forward_backward(program)
    path = Path(path)
    path.write_bytes(to_edge(program).to_executorch().buffer)
    return path


def export_model(
    path: str | Path,
    model: str = "xor",
    *,
    batch: int = 1,
    dynamic_max: int | None = None,
    seed: int = 0,
) -> Path:
    """Export a fresh ``model`` (weights from ``torch.manual_seed(seed)``) taking inputs
    float32 [batch, *shape] and int64 labels [batch]; dynamic in batch with ``dynamic_max``
    (``batch`` is then only the example size used for tracing)."""
    cls, shape = MODELS[model]
    torch.manual_seed(seed)
    module = cls()
    if dynamic_max is not None:
        batch = min(max(batch, 2), dynamic_max)  # a batch of 1 would be specialized away
    inputs = (torch.zeros(batch, *shape), torch.zeros(batch, dtype=torch.int64))
    return export_training(module, inputs, path, dynamic_max=dynamic_max)


def export_xor(
    path: str | Path, *, batch: int = 1, dynamic_max: int | None = None, seed: int = 0
) -> Path:
    """The XOR program: input float32 [batch, 2], label int64 [batch]."""
    return export_model(path, "xor", batch=batch, dynamic_max=dynamic_max, seed=seed)


def xor_examples(n: int, *, seed: int = 0, leading_one: bool = False) -> list[list]:
    """``n`` XOR records ``[x, label]``: x float32 [2] in {0,1}^2 and label a Python int, or,
    with ``leading_one``, x [1, 2] and label int64 [1] (how the Android app builds them)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2, size=(n, 2))
    records = []
    for a, b in bits:
        x = np.array([a, b], dtype=np.float32)
        label = int(a ^ b)
        if leading_one:
            records.append([x.reshape(1, 2), np.array([label], dtype=np.int64)])
        else:
            records.append([x, label])
    return records


def mlp_examples(n: int, *, seed: int = 0) -> list[list]:
    """``n`` learnable records for the MLP, ``[x float32 [32, 32], label int]``: each class
    is a fixed random image, each example its class's image plus as much Gaussian noise."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((10, 32, 32), dtype=np.float32)
    labels = rng.integers(0, 10, n)
    x = images[labels] + rng.standard_normal((n, 32, 32), dtype=np.float32)
    return [[x[i], int(labels[i])] for i in range(n)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export an ExecuTorch training program.")
    parser.add_argument("out")
    parser.add_argument("--model", choices=sorted(MODELS), default="xor")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dynamic", type=int, default=None, metavar="MAX")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    export_model(args.out, args.model, batch=args.batch, dynamic_max=args.dynamic, seed=args.seed)


if __name__ == "__main__":
    main()
