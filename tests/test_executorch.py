"""evalue_store.executorch against the real ExecuTorch runtime: programs exported at test time
(tests/et_programs.py), records packed into containers, trained from them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from executorch.extension.training import _load_for_executorch_for_training, get_sgd_optimizer
from torch.utils.data import DataLoader

import evalue_store as evs
from evalue_store.executorch import (
    Binding,
    InputMismatchError,
    Trainer,
    bind,
    read_method_inputs,
)
from evalue_store.torch import EValueDataset
from tests.et_programs import XorNet, export_model, export_xor, mlp_examples, xor_examples

N = 64
LR = 2.0


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """Exported once per module: XOR with a static batch of 4, and with batch 1..64."""
    root = tmp_path_factory.mktemp("pte")
    return {
        "static": str(export_xor(root / "xor4.pte", batch=4)),
        "dynamic": str(export_xor(root / "xor_dyn.pte", dynamic_max=64)),
    }


def pack(path, records, **writer) -> str:
    with evs.Writer(path, **writer) as w:
        w.extend(records)
    return str(path)


@pytest.fixture(scope="module")
def xor_file(tmp_path_factory):
    return pack(tmp_path_factory.mktemp("data") / "xor.evs", xor_examples(N, seed=1))


@pytest.fixture(scope="module")
def xor_lead_file(tmp_path_factory):
    records = xor_examples(N, seed=1, leading_one=True)
    return pack(tmp_path_factory.mktemp("data") / "xor1.evs", records)


def train_from_memory(program, records, orders, batch_size, lead):
    """The reference: ExecuTorch's API fed by hand from an in-memory list, in ``orders``."""
    module = _load_for_executorch_for_training(program)
    optimizer, losses = None, []
    for order in orders:
        for begin in range(0, len(order), batch_size):
            chosen = [records[i] for i in order[begin : begin + batch_size]]
            if len(chosen) < batch_size and not lead:
                break  # static batch: the last partial one is dropped
            if lead:
                x = torch.cat([torch.from_numpy(r[0]) for r in chosen])
                y = torch.cat([torch.from_numpy(r[1]) for r in chosen])
            else:
                x = torch.from_numpy(np.stack([r[0] for r in chosen]))
                y = torch.tensor([r[1] for r in chosen], dtype=torch.int64)
            loss = module.forward_backward("forward", [x, y])[0]
            if optimizer is None:
                optimizer = get_sgd_optimizer(module.named_parameters(), LR, 0, 0, 0, False)
            optimizer.step(module.named_gradients())
            losses.append(float(loss))
    return losses


def falls(losses, k=16):
    return np.mean(losses[-k:]) < 0.5 * np.mean(losses[:k])


# ------------------------------------------------------------------ method inputs


def test_method_inputs_static_and_dynamic(programs):
    static = read_method_inputs(programs["static"])
    assert [(s.dtype, s.sizes, s.dynamic) for s in static.inputs] == [
        (np.float32, (4, 2), False),
        (np.int64, (4,), False),
    ]
    assert static.static_batch == 4 and static.max_batch == 4
    dynamic = read_method_inputs(programs["dynamic"])
    assert [(s.sizes, s.dynamic) for s in dynamic.inputs] == [((64, 2), True), ((64,), True)]
    assert dynamic.static_batch is None and dynamic.max_batch == 64
    assert static.inputs[0].describe() == "float32 [4, 2]"
    assert dynamic.inputs[0].describe() == "float32 [<=64, <=2]"
    with pytest.raises(ValueError, match="no method 'train'"):
        read_method_inputs(programs["static"], "train")


# ------------------------------------------------------------------------ training


def test_static_batch_trains_like_memory_bit_for_bit(programs, xor_file):
    trainer = Trainer(programs["static"], xor_file, lr=LR, seed=3)
    losses = trainer.train(epochs=20)
    assert len(losses) == 20 * N // 4 and falls(losses)
    orders = [trainer.data.epoch_order(e, seed=3) for e in range(20)]
    assert not np.array_equal(orders[0], orders[1])  # shuffled, differently each epoch
    reference = train_from_memory(programs["static"], xor_examples(N, seed=1), orders, 4, False)
    assert losses == reference


def test_mlp_on_32x32_images_trains_from_a_container(tmp_path):
    """A larger program than XOR (1024 -> 256 -> 10, batch 32): its loss falls too."""
    program = str(export_model(tmp_path / "mlp.pte", "mlp", batch=32))
    data = pack(tmp_path / "mlp.evs", mlp_examples(128))
    trainer = Trainer(program, data, lr=0.1, seed=0)
    assert trainer.data.batch_size == 32
    losses = trainer.train(epochs=4)
    assert len(losses) == 16 and losses[0] > 2.0 and np.mean(losses[-4:]) < 0.5, losses


def test_dynamic_batch_of_leading_one_records_trains_like_memory(programs, xor_lead_file):
    trainer = Trainer(programs["dynamic"], xor_lead_file, lr=LR, batch_size=10, seed=5)
    assert trainer.data.last == "keep" and len(trainer.data) == 7  # 6 x 10 + 4
    losses = trainer.train(epochs=40)
    assert len(losses) == 40 * 7 and falls(losses)
    orders = [trainer.data.epoch_order(e, seed=5) for e in range(40)]
    records = xor_examples(N, seed=1, leading_one=True)
    assert losses == train_from_memory(programs["dynamic"], records, orders, 10, True)


def test_resume_continues_exactly(programs, xor_file):
    straight = Trainer(programs["static"], xor_file, lr=LR, seed=7)
    expected = straight.train(epochs=3)
    first = Trainer(programs["static"], xor_file, lr=LR, seed=7)
    first.train(epochs=3, max_steps=21)  # stops mid-epoch 1
    state = first.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 5)
    resumed = Trainer(programs["static"], xor_file, lr=LR, seed=7)
    resumed.load_state_dict(state)
    resumed.train(epochs=3)
    assert resumed.losses == expected
    other = Trainer(programs["static"], xor_file, lr=LR, seed=8)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_same_container_feeds_eager_torch(programs, xor_file):
    binding = bind(xor_file, programs["dynamic"], batch_size=16)
    order = binding.epoch_order(0, seed=0)
    batches = [order[i : i + 16].tolist() for i in range(0, N, 16)]
    loader = DataLoader(EValueDataset(xor_file), batch_sampler=batches, collate_fn=binding.collate)
    for indices, (x, y) in zip(batches, loader):
        ex, ey = binding.read(indices)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert torch.equal(x, ex) and torch.equal(y, ey)
    torch.manual_seed(0)
    net = XorNet()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    losses = []
    for _ in range(40):
        for x, y in DataLoader(
            EValueDataset(xor_file), batch_size=16, shuffle=True, collate_fn=binding.collate
        ):
            loss = net(x, y)[0]
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert falls(losses)


# ------------------------------------------------------------------------- batches


def test_last_batch_drop_wrap_zeros(programs, tmp_path):
    records = xor_examples(10, seed=2)
    path = pack(tmp_path / "ten.evs", records)
    order = np.arange(10)[::-1].copy()
    drop = list(bind(path, programs["static"]).batches(order))
    assert [b.valid for b in drop] == [4, 4]
    wrap = list(bind(path, programs["static"], last="wrap").batches(order))
    assert [b.valid for b in wrap] == [4, 4, 2] and wrap[-1].indices.tolist() == [1, 0]
    x, y = wrap[-1].inputs
    assert x.shape == (4, 2)
    expected = np.stack([records[i][0] for i in (1, 0, 9, 8)])
    assert np.array_equal(x.numpy(), expected)
    assert y.tolist() == [records[i][1] for i in (1, 0, 9, 8)]
    zeros = list(bind(path, programs["static"], last="zeros").batches(order))
    x, y = zeros[-1].inputs
    assert x.shape == (4, 2) and not x[2:].any() and not y[2:].any()
    assert np.array_equal(x[:2].numpy(), expected[:2])
    keep = list(bind(path, programs["dynamic"], batch_size=4).batches(order))
    assert [tuple(b.inputs[0].shape) for b in keep] == [(4, 2), (4, 2), (2, 2)]


def test_reused_buffers_and_one_record_batches(programs, xor_lead_file):
    binding = bind(xor_lead_file, programs["dynamic"], batch_size=8)
    first = [next(binding.batches(reuse=True)).inputs[0] for _ in range(2)]
    assert first[0].data_ptr() == first[1].data_ptr()  # one buffer, no allocation
    fresh = [next(binding.batches()).inputs[0] for _ in range(2)]
    assert fresh[0].data_ptr() != fresh[1].data_ptr()
    records = xor_examples(N, seed=1, leading_one=True)
    order = binding.epoch_order(0)
    for batch in binding.batches(order, reuse=True):  # views of reads of many batches
        assert batch.indices.tolist() == order[: len(batch.indices)].tolist()
        order = order[len(batch.indices) :]
        expected = np.concatenate([records[i][0] for i in batch.indices])
        assert np.array_equal(batch.inputs[0].numpy(), expected)
    one = bind(xor_lead_file, programs["dynamic"], batch_size=1)
    x, y = one.read([5])
    assert np.array_equal(x.numpy(), records[5][0]) and y.tolist() == records[5][1].tolist()
    x.add_(1)  # a batch of one record is the record's own tensor, yet private
    assert np.array_equal(evs.open(xor_lead_file)[5][0], records[5][0])


def test_named_fields_chosen_by_name(programs, tmp_path):
    records = [{"id": f"r{i}", "label": r[1], "input": r[0]} for i, r in enumerate(xor_examples(8))]
    path = pack(tmp_path / "named.evs", records)
    binding = bind(path, programs["static"], fields=("input", "label"))
    x, y = binding.read([0, 1, 2, 3])
    assert np.array_equal(x.numpy(), np.stack([r["input"] for r in records[:4]]))
    assert y.tolist() == [r["label"] for r in records[:4]]


def test_python_bools_become_the_inputs_dtype(programs, tmp_path):
    records = [[r[0], bool(r[1])] for r in xor_examples(8)]
    x, y = bind(pack(tmp_path / "bools.evs", records), programs["static"]).read([0, 1, 2, 3])
    assert y.dtype == torch.int64 and y.tolist() == [int(r[1]) for r in records[:4]]


# ------------------------------------------------------------------------ mismatches


def mismatch(tmp_path, program, records, **options) -> InputMismatchError:
    path = pack(tmp_path / "bad.evs", records)
    with pytest.raises(InputMismatchError) as info:
        bind(path, program, **options)
    assert isinstance(info.value, ValueError) and isinstance(info.value, evs.Error)
    return info.value


def test_wrong_dtype_names_record_field_and_expected(programs, tmp_path):
    records = xor_examples(12)
    records[7][0] = records[7][0].astype(np.float64)
    err = mismatch(tmp_path, programs["static"], records)
    assert (err.record, err.field) == (7, "field 0")
    assert "float32 [4, 2]" in err.expected and "float64" in err.found
    assert str(err).startswith("record 7, field 0: the program expects input 0 of 'forward'")
    records = xor_examples(12)
    records[3][1] = 1.0  # a float label for an int64 input
    err = mismatch(tmp_path, programs["static"], records)
    assert (err.record, err.field) == (3, "field 1") and "int64" in err.expected
    assert err.found == "a Python float"


def test_wrong_rank(programs, tmp_path):
    records = xor_examples(12)
    records[2][0] = records[2][0].reshape(1, 1, 2)
    err = mismatch(tmp_path, programs["static"], records)
    assert (err.record, err.field) == (2, "field 0") and "shape (1, 1, 2)" in err.found
    assert "shape (2,) or (1, 2)" in err.expected


def test_wrong_static_batch(programs, tmp_path):
    records = [[np.zeros((8, 2), np.float32), np.zeros(8, np.int64)]] * 3  # whole batches of 8
    err = mismatch(tmp_path, programs["static"], records)
    assert (err.record, err.field) == (0, "field 0") and "float32 [4, 2]" in err.expected
    path = pack(tmp_path / "ok.evs", xor_examples(8))
    with pytest.raises(ValueError, match="exactly 4: not 8"):
        bind(path, programs["static"], batch_size=8)
    with pytest.raises(ValueError, match="at most 64: not 65"):
        bind(path, programs["dynamic"], batch_size=65)
    with pytest.raises(ValueError, match="last must be one of"):
        bind(path, programs["static"], last="keep")


def test_over_the_dynamic_bound(programs, tmp_path):
    records = [[np.zeros(3, np.float32), 0]]
    err = mismatch(tmp_path, programs["dynamic"], records, batch_size=4)
    assert "<=2" in err.expected and "(3,)" in err.found


def test_missing_field(programs, tmp_path):
    records = [[r[0]] for r in xor_examples(4)]
    err = mismatch(tmp_path, programs["static"], records)
    assert (err.record, err.field) == (0, "field 1") and "input 1" in err.expected
    assert err.found == "a record of 1 values"
    named = [{"input": r[0], "target": r[1]} for r in xor_examples(4)]
    err = mismatch(tmp_path, programs["static"], named, fields=("input", "label"))
    assert (err.record, err.field) == (None, "field 'label'") and "int64 [4]" in err.expected
    assert "fields: ('input', 'target')" in err.found


def test_extra_field(programs, tmp_path):
    records = xor_examples(8)
    records[5].append("an id")
    err = mismatch(tmp_path, programs["static"], records)
    assert (err.record, err.field) == (5, "field 2")
    assert "3 values where 'forward' takes 2 inputs" in err.found


def test_records_must_agree_on_layout(programs, tmp_path):
    records = xor_examples(8)
    records[4][0] = records[4][0].reshape(1, 2)  # fits alone, but not stacked with (2,)
    err = mismatch(tmp_path, programs["dynamic"], records, batch_size=8)
    assert err.record == 4 and "the same in every record (shape (2,))" in err.expected


def test_per_batch_check_names_the_record(programs, tmp_path):
    records = xor_examples(12)
    records[6][0] = records[6][0].astype(np.float64)
    records[9][1] = "nine"
    path = pack(tmp_path / "late.evs", records)
    binding = Binding(path, programs["static"], check="first")  # only record 0 checked now
    with pytest.raises(InputMismatchError) as info:
        list(binding.batches())
    assert (info.value.record, info.value.field) == (6, "field 0")
    assert "float64" in info.value.found
    with pytest.raises(InputMismatchError) as info:
        list(binding.batches(start=2))  # records 8..11
    assert (info.value.record, info.value.field, info.value.found) == (9, "field 1", "a Python str")
    sample = [torch.zeros(2, dtype=torch.float64), 1]
    with pytest.raises(InputMismatchError, match="sample 0 of the batch"):
        binding.collate([sample])


# --------------------------------------------------------------------------- README


def test_readme_block_runs(programs, tmp_path, monkeypatch):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Training on device with ExecuTorch") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "pip install 'evalue_store[executorch]'" in section.split("```python")[0]
    monkeypatch.chdir(tmp_path)
    shutil.copy(programs["static"], "xor.pte")  # the XOR program, batch 4
    scope = {"examples": xor_examples(64, leading_one=True)}
    exec(compile(code, "README", "exec"), scope)
    assert falls(scope["losses"]) and scope["state"]["epoch"] == 20
    records = xor_examples(12)
    records[7][0] = records[7][0].astype(np.float64)
    with pytest.raises(InputMismatchError) as info:
        bind(pack(tmp_path / "bad.evs", records), "xor.pte")
    assert str(info.value) in " ".join(section.split())  # the message quoted in the README


# --------------------------------------------------------------------------- CLI


def cli(capsys, *argv) -> tuple[int, str, str]:
    from evalue_store.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_verify_pte_reports_the_fit(programs, xor_file, capsys):
    code, out, _ = cli(capsys, "verify", xor_file, "--pte", programs["static"])
    assert code == 0, out
    assert "every record fits 'forward'" in out
    assert "input 0, float32 [4, 2]: field 0" in out and "input 1, int64 [4]: field 1" in out
    assert f"{N // 4} batches of 4" in out
    code, out, _ = cli(capsys, "verify", xor_file, "--pte", programs["dynamic"], "--json")
    check = json.loads(out)["program_check"]
    assert code == 0 and check["fits"] and check["batch_size"] == 64 and check["batches"] == 1
    assert [i["expects"] for i in check["inputs"]] == ["float32 [<=64, <=2]", "int64 [<=64]"]


def test_cli_verify_pte_names_the_record_that_does_not_fit(programs, tmp_path, capsys):
    records = xor_examples(12)
    records[9][1] = np.ones(1, np.int32)  # the program's label input is int64
    path = pack(tmp_path / "bad.evs", records)
    code, out, _ = cli(capsys, "verify", path, "--pte", programs["static"])
    assert code == 1
    assert "record 9, field 1: the program expects input 1 of 'forward', int64 [4]" in out
    code, out, _ = cli(capsys, "verify", path, "--pte", programs["static"], "--json")
    report = json.loads(out)
    assert code == 1 and not report["ok"] and report["records"] == 12
    assert not report["program_check"]["fits"]
    assert report["program_check"]["mismatch"].startswith("record 9, field 1:")


def test_cli_verify_pte_usage_errors_name_the_program(programs, xor_file, tmp_path, capsys):
    pte = programs["static"]
    code, _, err = cli(capsys, "verify", xor_file, "--pte", pte, "--method", "train")
    assert code == 2 and f"{pte}: the program has no method 'train'" in err
    code, _, err = cli(capsys, "verify", xor_file, "--pte", pte, "--batch-size", "8")
    assert code == 2 and "takes batches of exactly 4" in err
    code, _, err = cli(capsys, "verify", xor_file, "--pte", tmp_path / "none.pte")
    assert code == 2 and "No such file" in err


def test_cli_verify_pte_waits_for_a_sound_file(programs, tmp_path, capsys):
    path = pack(tmp_path / "x.evs", xor_examples(8))
    with open(path, "r+b") as f:  # damage the last record's bytes
        f.seek(-200, 2)
        byte = f.read(1)
        f.seek(-200, 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, out, _ = cli(capsys, "verify", path, "--pte", programs["static"])
    assert code == 1 and f"not checked against {programs['static']}" in out
