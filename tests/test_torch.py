"""PyTorch adapter: zero-copy tensors, collate, DataLoader coverage, rank/worker splits, resume."""

from __future__ import annotations

import functools
import pickle
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch extra not installed")

from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

import evalue_store as evs  # noqa: E402
from evalue_store.shards import ShardWriter  # noqa: E402
from evalue_store.torch import (  # noqa: E402
    EValueDataset,
    Padded,
    ShardedIterableDataset,
    as_torch,
    collate,
)

pytestmark = pytest.mark.filterwarnings("error")

N = 23  # shards of 5, 5, 5, 5, 3: nothing divides evenly


def record(i: int) -> list:
    bf16 = evs.float32_to_bfloat16(np.array([i, 0.5], np.float32))
    return [np.arange(i % 4 + 1), np.full(3, i, np.float32), i, f"id{i}", bf16]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("torch")
    with ShardWriter(root / "t-{:02d}.evs", max_records=5, durable=False) as w:
        w.extend(record(i) for i in range(N))
    return w.manifest_path


def ids_of(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch[2]]


# ----------------------------------------------------------------------------- map-style


def test_records_come_back_as_private_writable_tensors(shards):
    ds = EValueDataset(shards)
    assert len(ds) == N
    tokens, features, label, name, bf16 = ds[6]
    assert tokens.dtype == torch.int64 and tokens.tolist() == [0, 1, 2]
    assert features.dtype == torch.float32 and features.tolist() == [6.0] * 3
    assert (label, name) == (6, "id6")
    assert bf16.dtype == torch.bfloat16 and bf16.tolist() == [6.0, 0.5]
    # Small tensors are copies (big ones private mappings, tests/test_private.py): a
    # transform's in-place change reaches neither the reader's views nor a later sample.
    view = ds.data[6][0]  # the numpy view the reader hands out
    assert tokens.data_ptr() != view.ctypes.data
    tokens.add_(5)
    again = ds[6][0]
    assert again.tolist() == view.tolist() == [0, 1, 2]


def test_bfloat16_round_trip(tmp_path):
    want = torch.tensor(
        [0.0, -0.0, 1.0, -2.5, 3.0e38, 1.0e-40, float("inf"), float("nan")], dtype=torch.bfloat16
    )
    with evs.Writer(tmp_path / "bf.evs") as w:
        w.append([want.view(torch.int16).numpy().view(evs.BFLOAT16), want.reshape(2, 4)])
    got, matrix = EValueDataset(tmp_path / "bf.evs")[0]
    assert got.dtype == matrix.dtype == torch.bfloat16 and matrix.shape == (2, 4)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))  # bit for bit
    assert torch.equal(matrix.reshape(-1).view(torch.int16), want.view(torch.int16))


def test_lazily_conjugated_and_negated_tensors_are_stored_as_their_values(tmp_path):
    """x.conj() and x.conj().imag are ordinary tensors whose values differ from their memory
    until resolved (torch's conjugate and negative bits): append and extend_columns store
    the values; tensors with no data or no strided memory are an EncodeError."""
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    lazy = [z.conj(), z.conj().imag, torch.ones(2, dtype=torch.bfloat16).neg()]
    assert lazy[0].is_conj() and lazy[1].is_neg()
    with evs.Writer(tmp_path / "lazy.evs") as w:
        w.append(lazy)
        w.extend_columns({k: v.unsqueeze(0) for k, v in enumerate(lazy)})
    with evs.open(tmp_path / "lazy.evs") as ds:
        for record in ds:
            for got, want in zip(record, lazy):
                want = want.resolve_conj().resolve_neg()
                if want.dtype == torch.bfloat16:
                    want = want.view(torch.int16).numpy().view(evs.BFLOAT16)
                np.testing.assert_array_equal(got, want)
    with warnings.catch_warnings():  # (both are prototypes or deprecated in torch)
        warnings.simplefilter("ignore", UserWarning)
        nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
        quantized = torch.quantize_per_tensor(torch.rand(3), 0.1, 0, torch.quint8)
    cannot = {
        "meta device": torch.zeros(2, device="meta"),
        "sparse_coo": torch.eye(3).to_sparse(),
        "nested tensor": nested,
        "quint8": quantized,
    }
    with evs.Writer(tmp_path / "no.evs") as w:
        for why, value in cannot.items():
            with pytest.raises(evs.EncodeError, match=why):
                w.append([value])
            if why != "nested tensor":
                with pytest.raises(evs.EncodeError, match=why):
                    w.extend_columns({0: value.unsqueeze(0)})
    assert len(evs.open(tmp_path / "no.evs")) == 0


@pytest.mark.parametrize(
    "bad",
    [
        [torch.zeros((1,) * 65)],
        [torch.zeros((1,) * 65, dtype=torch.bfloat16)],  # (through its int16 view)
        [[torch.zeros(2), torch.zeros((1,) * 65)]],
        [evs.Tensor(torch.zeros((1,) * 66))],
        {"x": torch.zeros((1,) * 65)},
    ],
)
def test_torch_tensors_over_rank_64_are_an_encode_error(tmp_path, bad):
    # Attack c01: torch's .numpy() raised its bare ValueError ("number of dimensions must
    # be within [0, 64]"), not the EncodeError numpy arrays get (FORMAT.md section 5: R <= 64).
    with evs.Writer(tmp_path / "r.evs") as w:
        with pytest.raises(evs.EncodeError, match="tensor rank 6[56] exceeds 64"):
            w.append(bad)
        with pytest.raises(evs.EncodeError, match="tensor rank 6[56] exceeds 64"):
            w.extend([bad])
        assert len(w) == 0


def test_tensor_lists_and_other_kinds(tmp_path):
    a, b = np.arange(3, dtype=np.int32), np.ones((2, 2), np.float64)
    with evs.Writer(tmp_path / "k.evs") as w:
        w.append([[a, b], [None, a], [1, 2], [0.5], [True], None, b"raw", 2.5, False])
    (pair, optional, ints, floats, bools, none, raw, real, flag) = EValueDataset(
        tmp_path / "k.evs"
    )[0]
    assert [t.dtype for t in pair] == [torch.int32, torch.float64]
    assert optional[0] is None and optional[1].tolist() == [0, 1, 2]
    assert (ints, floats, bools, none, raw, real, flag) == (
        [1, 2],
        [0.5],
        [True],
        None,
        b"raw",
        2.5,
        False,
    )
    assert as_torch([]) == [] and as_torch("s") == "s"


def test_compressed_and_pread_shards_give_the_same_tensors(shards, tmp_path):
    with ShardWriter(tmp_path / "z-{}.evs", max_records=10, compression="zstd") as w:
        w.extend(record(i) for i in range(N))
    plain = EValueDataset(shards)
    for other in (EValueDataset(w.manifest_path), EValueDataset(shards, backend="pread")):
        for i in (0, 9, 10, 22):
            for got, want in zip(other[i], plain[i]):
                assert torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want


def test_pickling_sends_the_shard_table_only(shards):
    for ds in (EValueDataset(shards), ShardedIterableDataset(shards)):
        ds.data[0]  # opens a shard: its mapping must not travel
        blob = pickle.dumps(ds)
        assert len(blob) < 2500, len(blob)
        assert len(pickle.loads(blob)) == len(ds)
    assert pickle.loads(pickle.dumps(EValueDataset(shards)))[22][3] == "id22"


def test_transform_applies_to_each_sample(shards):
    ds = EValueDataset(shards, transform=lambda r: {"tokens": r[0], "label": r[2]})
    assert ds[5]["label"] == 5
    batch = collate(ds.__getitems__([1, 2, 3]))
    assert isinstance(batch["tokens"], Padded) and batch["label"].tolist() == [1, 2, 3]


# ----------------------------------------------------------------------------- collate


def test_collate_output_structure(shards):
    ds = EValueDataset(shards)
    tokens, features, labels, names, bf16 = collate([ds[i] for i in (1, 2, 4)])
    assert isinstance(tokens, Padded)
    assert tokens.values.tolist() == [[0, 1, 0], [0, 1, 2], [0, 0, 0]]
    assert tokens.lengths.tolist() == [2, 3, 1] and tokens.lengths.dtype == torch.int64
    assert tokens.mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert features.shape == (3, 3) and features.dtype == torch.float32
    assert labels.dtype == torch.int64 and labels.tolist() == [1, 2, 4]
    assert names == ["id1", "id2", "id4"]
    assert bf16.dtype == torch.bfloat16 and bf16.shape == (3, 2)
    # same lengths: stacked by default, Padded when the field is named in `pad`
    assert isinstance(collate([ds[1], ds[5]])[0], torch.Tensor)
    fixed = collate([ds[1], ds[5]], pad={0}, pad_value=-1)
    assert isinstance(fixed[0], Padded) and fixed[0].mask.all()
    padded = collate([ds[0], ds[3]], pad={0}, pad_value=-1)[0]
    assert padded.values.tolist() == [[0, -1, -1, -1], [0, 1, 2, 3]]


def test_collate_scalars_and_mixed_fields():
    batch = collate([[True, 1.5, None, [1, 2], b"x", 1], [False, 2.0, None, [3], b"y", None]])
    assert batch[0].dtype == torch.bool and batch[1].dtype == torch.float64
    assert batch[2:] == [[None, None], [[1, 2], [3]], [b"x", b"y"], [1, None]]
    assert collate([torch.ones(2), torch.zeros(2)]).shape == (2, 2)  # bare values: field 0
    with pytest.raises(ValueError, match="only the first dimension"):
        collate([[torch.ones(2, 3)], [torch.ones(2, 4)]])
    with pytest.raises(evs.BatchError, match="field 0: tensors differ.*add it to `pad`"):
        collate([[torch.ones(2), 0], [torch.ones(3), 1]], pad={1})
    mixed = [[torch.ones(2, dtype=torch.int32), 0], [torch.ones(2, dtype=torch.int64), 1]]
    with pytest.raises(evs.BatchError, match="only the first dimension"):  # torch.stack would
        collate(mixed)  # promote the dtypes: collate refuses
    with pytest.raises(evs.BatchError, match="add it to `pad`"):
        collate(mixed, pad={1})
    with pytest.raises(evs.BatchError, match="numbers of fields"):
        collate([[1, 2], [1]])
    with pytest.raises(evs.BatchError, match="empty"):
        collate([])


def test_collate_refuses_pads_it_would_ignore_or_change():
    """A pad naming no field, or a pad_value the field's dtype cannot hold, raised nothing:
    the pad was ignored, or 1.5 stored as 1 in int tensors and 2 as True in bool ones."""
    ints = [[torch.arange(3)], [torch.arange(2)]]
    named = [{"tokens": torch.arange(3)}, {"tokens": torch.arange(2)}]
    with pytest.raises(evs.BatchError, match=r"pad names \[5\], which the samples do not"):
        collate(ints, pad={5})
    with pytest.raises(evs.BatchError, match="pad names \\['label'\\]"):
        collate(named, pad={"tokens", "label"})
    with pytest.raises(TypeError, match="collection of field names"):
        collate(named, pad="tokens")  # a str is a collection of its letters
    for value in (1.5, 2**63, float("nan"), -(2**63) - 1):
        with pytest.raises(evs.BatchError, match="field 0: pad_value .* does not fit"):
            collate(ints, pad_value=value)
    with pytest.raises(evs.BatchError, match="field 'tokens': pad_value 2 does not fit"):
        collate([{"tokens": torch.ones(n, dtype=torch.bool)} for n in (1, 2)], pad_value=2)
    with pytest.raises(evs.BatchError, match="does not fit its torch.float16"):
        collate([[torch.ones(n, dtype=torch.float16)] for n in (1, 2)], pad_value=1e6)
    with pytest.raises(TypeError, match="pad_value must be"):
        collate(ints, pad_value="0")
    assert collate(ints, pad_value=-7.0)[0].values[1].tolist() == [0, 1, -7]
    assert collate(named, pad={"tokens"}, pad_value=True)["tokens"].values[1, 2] == 1
    floats = collate([[torch.ones(n, dtype=torch.float16)] for n in (1, 2)], pad_value=0.1)
    assert floats[0].values[0, 1] == torch.tensor(0.1, dtype=torch.float16)  # rounded
    padded = collate([[torch.ones(n)] for n in (1, 2)], pad_value=float("-inf"))
    assert padded[0].values[0, 1] == float("-inf")
    # round 19 (session 14): a bool or float key named position 1; complex fields, ints past
    # int64 and tensors of no element with a dim near 2**62 raised torch's own errors
    for key in (True, 1.0):
        with pytest.raises(TypeError, match="by a str or a position"):
            collate([[torch.ones(1), torch.ones(n)] for n in (1, 2)], pad={key})
    complex_field = collate([[torch.ones(n, dtype=torch.complex64)] for n in (1, 2)])
    assert complex_field[0].values.tolist() == [[1, 0], [1, 1]]
    with pytest.raises(evs.BatchError, match="field 0: torch cannot hold these values"):
        collate([[2**63], [1]])
    empty = torch.empty((2**62, 0), dtype=torch.uint8)
    with pytest.raises(evs.BatchError, match="field 0: torch cannot hold these values"):
        collate([[empty], [empty]])


# ----------------------------------------------------------------------------- DataLoader


@pytest.mark.parametrize(
    "workers, context, persistent",
    [(0, None, False), (2, "fork", False), (2, "fork", True), (2, "spawn", True)],
)
def test_dataloader_reads_each_record_once_per_epoch(shards, workers, context, persistent):
    loader = DataLoader(
        EValueDataset(shards),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context=context,
        persistent_workers=persistent,
        collate_fn=collate,
    )
    orders = []
    for _ in range(2):
        batches = list(loader)
        assert isinstance(batches[0][0], Padded) or batches[0][0].ndim == 2
        assert batches[0][4].dtype == torch.bfloat16
        orders.append(ids_of(batches))
        assert sorted(orders[-1]) == list(range(N))
    assert orders[0] != orders[1]  # the sampler reshuffles


@pytest.mark.parametrize("workers, context", [(0, None), (2, "fork"), (2, "spawn")])
def test_dataloader_reads_the_commit_a_file_had_while_a_writer_appends(tmp_path, workers, context):
    """EValueDataset(path) of a file a live Writer commits to after it was opened: every
    read failed ("shard has 80 records, the index says 50"), in the main process and in
    fork and spawn workers (attacker finding, session 13, round 15, C01). The loader
    reads the 50 records the dataset was opened with."""
    with evs.Writer(tmp_path / "live.evs", durable=False) as w:
        w.extend(record(i) for i in range(50))
        w.commit()
        ds = EValueDataset(tmp_path / "live.evs")
        w.extend(record(i) for i in range(50, 80))
        w.commit()
        loader = DataLoader(
            ds,
            batch_size=10,
            num_workers=workers,
            multiprocessing_context=context,
            collate_fn=collate,
        )
        assert sorted(ids_of(loader)) == list(range(50))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_distributed_sampler_covers_every_record(shards, world):
    ds = EValueDataset(shards)
    seen = []
    for rank in range(world):
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=3)
        sampler.set_epoch(1)
        seen += ids_of(DataLoader(ds, batch_size=3, sampler=sampler, collate_fn=collate))
    # DistributedSampler pads by repeating records up to a multiple of the world size
    padding = -N % world
    assert set(seen) == set(range(N)) and len(seen) == N + padding


# ----------------------------------------------------------------------------- iterable


def simulate_loader(ds: ShardedIterableDataset, workers: int, batch: int, monkeypatch) -> list:
    """What DataLoader(ds, batch_size=batch, num_workers=workers) yields, without processes:
    each worker's stream cut into batches, then taken round-robin as DataLoader does."""
    import evalue_store.torch as adapter

    streams = []
    for w in range(workers):
        info = type("Info", (), {"id": w, "num_workers": workers})()
        monkeypatch.setattr(adapter, "get_worker_info", lambda info=info: info)
        items = [r[2] for r in ds]
        streams.append([items[i : i + batch] for i in range(0, len(items), batch)])
    monkeypatch.undo()
    out = []
    for j in range(max(map(len, streams))):
        for s in streams:
            if j < len(s):
                out += s[j]
    return out


@pytest.mark.parametrize("even", [False, True])
def test_iterable_split_over_ranks_and_workers_is_exact(shards, even, monkeypatch):
    for world in (1, 2, 3, 4):
        for workers in (1, 2, 3):
            for batch in (1, 4):
                seen = []
                for rank in range(world):
                    ds = ShardedIterableDataset(
                        shards, rank=rank, world_size=world, batch_size=batch, even=even, seed=7
                    )
                    ds.set_epoch(2)
                    got = simulate_loader(ds, workers, batch, monkeypatch)
                    assert got == list(ds.rank_order(2)), (world, workers, batch)
                    assert len(got) == len(ds)
                    seen += got
                assert len(seen) == len(set(seen))
                if even:
                    assert len(seen) == N // world * world
                else:
                    assert sorted(seen) == list(range(N))
                    sizes = [
                        len(ShardedIterableDataset(shards, rank=r, world_size=world))
                        for r in range(world)
                    ]
                    assert max(sizes) - min(sizes) <= 1


def test_iterable_order_is_deterministic_and_shuffled(shards):
    def order(epoch: int = 0, **kwargs) -> list[int]:
        ds = ShardedIterableDataset(shards, **kwargs)
        ds.set_epoch(epoch)
        return [r[2] for r in ds]

    base = order(seed=1)
    assert base == order(seed=1) and sorted(base) == list(range(N))
    assert base != order(seed=2) and base != order(seed=1, epoch=1)
    assert order(shuffle=False) == list(range(N))
    assert order(shuffle=False, rank=1, world_size=2) == list(range(11, 23))
    assert order(shuffle_buffer=0) != base  # shard + in-shard permutation only
    for rank in range(3):
        assert order(seed=4, epoch=5, rank=rank, world_size=3) == order(
            seed=4, epoch=5, rank=rank, world_size=3
        )


@pytest.mark.parametrize("context, persistent", [("fork", False), ("spawn", True)])
def test_iterable_through_real_workers(shards, context, persistent):
    per_epoch = {0: [], 1: []}
    loaders = []
    for rank in range(2):
        ds = ShardedIterableDataset(shards, rank=rank, world_size=2, batch_size=3, seed=5)
        loader = DataLoader(
            ds,
            batch_size=3,
            num_workers=2,
            multiprocessing_context=context,
            persistent_workers=persistent,
            collate_fn=collate,
        )
        loaders.append(loader)
        for epoch in (0, 1):
            ds.set_epoch(epoch)  # reaches persistent workers through shared memory
            got = ids_of(loader)
            assert got == list(ds.rank_order(epoch))
            per_epoch[epoch] += got
    for epoch, seen in per_epoch.items():
        assert sorted(seen) == list(range(N)), epoch
    assert per_epoch[0] != per_epoch[1]
    assert len(loaders[0]) == 4  # ceil(12 / 3)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_gives_exactly_the_remaining_records(shards, workers):
    def loader_for(ds):
        context = "fork" if workers else None
        return DataLoader(
            ds,
            batch_size=4,
            num_workers=workers,
            multiprocessing_context=context,
            collate_fn=collate,
        )

    make = functools.partial(
        ShardedIterableDataset, shards, rank=1, world_size=2, batch_size=4, seed=9, shuffle_buffer=3
    )
    reference = make()
    reference.set_epoch(3)
    full = ids_of(loader_for(reference))

    ds = make()
    ds.set_epoch(3)
    taken = []
    for step, batch in enumerate(loader_for(ds)):
        taken += ids_of([batch])
        if step == 1:
            break
    state = ds.state_dict() if workers == 0 else ds.state_dict(consumed=len(taken))
    assert state["position"] == 8 and state["epoch"] == 3
    state = pickle.loads(pickle.dumps(state))

    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(3)  # the usual loop call keeps the loaded position
    rest = ids_of(loader_for(resumed))
    assert taken + rest == full

    # a resumed run can be resumed again, here by plain iteration (no workers)
    again = make()
    again.load_state_dict(resumed.state_dict(consumed=4))
    assert [r[2] for r in again] == full[12:]

    resumed.set_epoch(4)  # the next epoch is whole again
    assert ids_of(loader_for(resumed)) == list(resumed.rank_order(4))


def test_state_dict_guards(shards):
    ds = ShardedIterableDataset(shards, seed=1)
    with pytest.raises(ValueError, match="consumed="):
        ds.state_dict()
    assert ds.state_dict(consumed=0)["position"] == 0
    with pytest.raises(ValueError, match="outside"):
        ds.state_dict(consumed=N + 1)
    for odd in (2.5, True, "3", None.__class__):  # a count computed with / is a float
        with pytest.raises(TypeError, match="whole number of records"):
            ds.state_dict(consumed=odd)
    assert ds.state_dict(consumed=np.int64(3))["position"] == 3
    state = ds.state_dict(consumed=5)
    for other in (
        ShardedIterableDataset(shards, seed=2),
        ShardedIterableDataset(shards, seed=1, world_size=2, rank=0),
        ShardedIterableDataset(shards, seed=1, shuffle_buffer=8),
    ):
        with pytest.raises(ValueError, match="not be exact"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        ds.load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="rank"):
        ShardedIterableDataset(shards, rank=2, world_size=2)


def test_rank_and_world_come_from_torch_distributed(shards, tmp_path):
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        ds = ShardedIterableDataset(shards)
        assert (ds.rank, ds.world_size) == (0, 1)
        explicit = ShardedIterableDataset(shards, rank=1, world_size=3)
        assert (explicit.rank, explicit.world_size) == (1, 3)
    finally:
        dist.destroy_process_group()


def test_an_open_dataset_or_shards_are_sources_with_their_own_as_dict(tmp_path):
    """README: EValueDataset takes what open_shards takes, or an open ShardedDataset; an
    open Dataset is its file. Their as_dict is the default; contradicting it is an error
    saying so."""
    path = tmp_path / "t.evs"
    with evs.Writer(path) as w:
        w.append({"x": np.arange(3), "y": 1})
    for make in (EValueDataset, ShardedIterableDataset):
        listed = next(iter(make(evs.open(path))))
        assert isinstance(listed, list) and torch.equal(listed[0], torch.arange(3))
        for source in (evs.open(path, as_dict=True), evs.open_shards(path, as_dict=True)):
            assert set(next(iter(make(source)))) == {"x", "y"}
        assert set(next(iter(make(evs.open_shards(path, as_dict=True), as_dict=True)))) == {
            "x",
            "y",
        }
        with pytest.raises(ValueError, match="as_dict=False contradicts"):
            make(evs.open_shards(path, as_dict=True), as_dict=False)


@pytest.mark.parametrize(
    "indices",
    [
        [True, False, True, True],  # len(ds) bools: was read as a mask (records 0, 2, 3)
        [np.True_] * 4,
        [True, False],  # another length: was an IndexError about a mask
        [0, True],  # one bool among ints
        [torch.tensor(True), 1],
        np.ones(4, bool),
        torch.ones(4, dtype=torch.bool),
    ],
)
def test_getitems_refuses_bools_as_ds_true_does(tmp_path, indices):
    """A sampler yielding bools: DataLoader's grouped read took a batch of exactly len(ds)
    bools as a boolean mask and returned other records than named, where ds[True] is a
    TypeError (attacker finding, session 13, round 15, C04). __getitems__ takes a batch of
    indices, never a mask, with or without a transform."""
    with evs.Writer(tmp_path / "b.evs", durable=False) as w:
        w.extend([np.full(2, i), i] for i in range(4))
    for transform in (None, lambda sample: sample):
        ds = EValueDataset(tmp_path / "b.evs", transform)
        with pytest.raises(TypeError, match="a bool is not a record index"):
            ds.__getitems__(indices)
        loader = DataLoader(ds, sampler=list(indices), batch_size=len(indices), collate_fn=collate)
        with pytest.raises(TypeError, match="a bool is not a record index"):
            next(iter(loader))
    assert ds.__getitems__([np.int64(3), 0])[0][1] == 3  # integers of any kind still are


def test_java_big_endian_tensors_become_tensors():
    """evalue_store.java gives tensors in Java's byte order (big-endian), which
    torch.from_numpy refuses: as_torch raised its ValueError (round 19 remark, session 14)."""
    for array in (np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(-2, 2, dtype=np.int64)):
        loaded = evs.java.loads(evs.java.dumps(array))
        assert not loaded.dtype.isnative
        tensor = as_torch(loaded)
        assert tensor.dtype == torch.from_numpy(array).dtype
        assert torch.equal(tensor, torch.from_numpy(array))
