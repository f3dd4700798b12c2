"""The README's code blocks run as written (a user copies them first)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def block(after: str) -> str:
    """The first ```python block after the line ``after``."""
    match = re.search(re.escape(after) + r".*?```python\n(.*?)```", README, re.S)
    assert match, f"README has no python block after {after!r}"
    return match.group(1)


@pytest.mark.parametrize(
    "heading",
    [
        "## API tour",
        "### Named records",
        "### Batches and columns",
        "### Compression",
        "train it on chosen records:",
        "### Java interchange",
    ],
)
def test_readme_block_runs(tmp_path, monkeypatch, heading):
    monkeypatch.chdir(tmp_path)
    records = [[np.arange(128), np.zeros(16, np.float32), i, f"k{i}"] for i in range(1200)]
    if heading != "### Compression":  # the dictionary block writes over the compressed file
        records = records[:1000]
    # Later blocks use the names the API tour imported, as a reader going down the page has.
    exec(compile(block(heading), heading, "exec"), {"records": records, "np": np, "evs": evs})


def test_readme_training_block_runs(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="the torch extra is not installed")
    monkeypatch.chdir(tmp_path)
    records = [[np.arange(8) + i, np.zeros(4, np.float32), i, f"k{i}"] for i in range(300)]
    scope = {"records": records}
    exec(compile(block("## Training with PyTorch"), "training", "exec"), scope)
    remaining = sum(len(batch[2]) for batch in scope["stream"])
    assert remaining == 300 - 3 * 64  # resumed exactly after the three batches taken


def test_readme_names_the_torch_extra_and_fits_a_small_machine():
    """A reader who copies the training block needs the extra, and CI has 2 cores."""
    training = README[README.index("## Training with PyTorch") :]
    assert "pip install 'evalue_store[torch]'" in training.split("```python")[0]
    workers = [int(n) for n in re.findall(r"num_workers=(\d+)", README)]
    assert workers and max(workers) <= 2, workers


def test_torch_adapter_without_torch_says_what_to_install():
    code = "import sys; sys.modules['torch'] = None; import evalue_store.torch"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "ImportError: evalue_store.torch needs PyTorch, which is not installed: "
        "pip install 'evalue_store[torch]'"
    ), proc.stderr
