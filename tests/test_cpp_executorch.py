"""The C++ reader feeding ExecuTorch's runtime (issue 15 item 2): a C++ program linked
against the executorch wheel's libexecutorch.so trains ExecuTorch's XOR training program
(exported here, at test time) from a container Python wrote, tensors wrapped in place on the
file mapping (cpp/include/evalue_store/executorch.h)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from tests import native

XOR_X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
XOR_Y = np.array([0, 1, 1, 0], np.int64)


def export_xor(path: Path) -> None:
    """ExecuTorch's XOR example (executorch.extension.training.examples.XOR) exported as a
    joint forward-backward training program, as its export_model.py does."""
    import torch
    from executorch.exir import to_edge
    from executorch.extension.training.examples.XOR.model import Net, TrainingNet
    from torch.export import export
    from torch.export.experimental import _export_forward_backward

    torch.manual_seed(0)
    net = TrainingNet(Net())
    example = (torch.randn(1, 2), torch.ones(1, dtype=torch.int64))
    program = _export_forward_backward(export(net, example, strict=True))
    path.write_bytes(to_edge(program).to_executorch().buffer)


@pytest.fixture(scope="session")
def xor_program(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("xor") / "xor.pte"
    export_xor(path)
    return path


@pytest.fixture(scope="session")
def train_xor() -> Path:
    return native.build_executorch() / "train_xor"


def xor_container(path: Path, n: int = 1000) -> None:
    """XOR examples as an Android app builds them: [x float32 [1, 2], y int64 [1]]."""
    picks = np.random.default_rng(0).integers(0, 4, n)
    with evs.Writer(path) as w:
        for k in picks:
            w.append([XOR_X[k : k + 1].copy(), XOR_Y[k : k + 1].copy()])


def run(train_xor: Path, program: Path, data: Path, *extra: str) -> tuple[list[float], float]:
    done = subprocess.run(
        [str(train_xor), str(program), str(data), "4000", "0.5", *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert lines[-2].startswith("steps_per_s ")
    return [float(x) for x in lines[:-2]], float(lines[-2].split()[1])


def test_cpp_trains_the_xor_program_from_a_container(tmp_path, xor_program, train_xor):
    data = tmp_path / "xor.evs"
    xor_container(data)
    losses, _ = run(train_xor, xor_program, data)
    assert len(losses) == 4000
    first, last = np.mean(losses[:200]), np.mean(losses[-200:])
    assert first > 0.5 and last < 0.1, (first, last)
    # Fed from process memory in the same order, the run is bit for bit the same.
    memory, _ = run(train_xor, xor_program, data, "memory")
    assert memory == losses
    # And so is ExecuTorch's own Python training loop (TrainingModule + its SGD) over the
    # same records: the C++ loop (its SGD included) computes what ExecuTorch does.
    assert np.array_equal(np.float32(losses), python_losses(xor_program, data, 4000, 0.5))


def python_losses(program: Path, data: Path, steps: int, lr: float) -> np.ndarray:
    import torch
    from executorch.extension.training import (
        _load_for_executorch_for_training,
        get_sgd_optimizer,
    )

    module = _load_for_executorch_for_training(str(program))
    optimizer = None
    losses = []
    with evs.open(data) as ds:
        for step in range(steps):
            x, y = ds[step % len(ds)]
            out = module.forward_backward("forward", [torch.tensor(x), torch.tensor(y)])
            losses.append(out[0].item())
            if optimizer is None:  # parameters exist once forward_backward has run
                optimizer = get_sgd_optimizer(module.named_parameters(), lr, 0, 0, 0, False)
            optimizer.step(module.named_gradients())
    return np.float32(losses)


def test_training_refuses_a_damaged_container_with_its_error(tmp_path, xor_program, train_xor):
    data = tmp_path / "xor.evs"
    xor_container(data, 10)
    blob = bytearray(data.read_bytes())
    with evs.open(data) as ds:
        at = int(ds.entries()["offset"][3]) + 40  # inside record 3's payload
    blob[at] ^= 1
    data.write_bytes(blob)
    done = subprocess.run(
        [str(train_xor), str(xor_program), str(data), "8", "0.5"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "record checksum mismatch (record 3" in done.stderr
