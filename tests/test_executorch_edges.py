"""evalue_store.executorch at its edges, against the real ExecuTorch runtime: padded last
batches, the ``fields`` / ``batch_size`` arguments, indices and orders as the dataset takes
them (the findings of an attack on the adapter, one test each)."""

from __future__ import annotations

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.executorch import Trainer, bind
from tests.et_programs import export_xor, xor_examples


@pytest.fixture(scope="module")
def xor4(tmp_path_factory) -> str:
    """The XOR program with a static batch of 4."""
    return str(export_xor(tmp_path_factory.mktemp("pte") / "xor4.pte", batch=4))


def pack(path, records) -> str:
    with evs.Writer(path) as w:
        w.extend(records)
    return str(path)


@pytest.mark.parametrize("lead", [False, True])
def test_zeros_pads_a_last_batch_of_one_record(xor4, tmp_path, lead):
    """last="zeros" with one record left over: that record, then zeros (it raised
    "cannot reshape array of size 2 into shape (4,2)": the one-record path took the
    padded batch for a batch of one)."""
    records = xor_examples(5, seed=3, leading_one=lead)
    path = pack(tmp_path / "five.evs", records)
    binding = bind(path, xor4, last="zeros")
    for reuse in (False, True):
        batches = list(binding.batches(reuse=reuse))
        assert [b.valid for b in batches] == [4, 1] and batches[-1].indices.tolist() == [4]
        x, y = (t.numpy() for t in batches[-1].inputs)
        assert x.shape == (4, 2) and y.shape == (4,)
        assert np.array_equal(x[:1], records[4][0].reshape(1, 2)) and not x[1:].any()
        assert int(y[0]) == int(np.asarray(records[4][1]).reshape(-1)[0]) and not y[1:].any()
    losses = Trainer(xor4, path, last="zeros", seed=1).train(epochs=2)
    assert len(losses) == 4 and all(np.isfinite(losses))
