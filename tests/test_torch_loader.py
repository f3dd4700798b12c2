"""DataLoader over EValueDataset: what reaches the training loop, through real workers.

The oracle is ``collate`` of the samples ``ds[i]`` in the main process. In a worker,
``collate`` builds tensors under ``SHARE_BYTES`` in ordinary memory and pickles them by
value, bigger ones in shared memory (docs/TRAINING.md): either way the main process must
get plain dicts/lists of writable tensors equal to the oracle, whatever the start method,
with persistent workers and with pin_memory; and a damaged record must fail the batch
naming the record.
"""

from __future__ import annotations

import functools
import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch extra not installed")

from torch.utils.data import DataLoader  # noqa: E402

import evalue_store as evs  # noqa: E402
from evalue_store.shards import ShardWriter  # noqa: E402
from evalue_store.torch import EValueDataset, Padded, collate  # noqa: E402
from evalue_store.torch.batching import SHARE_BYTES  # noqa: E402
from tests.test_batch import flip  # noqa: E402
from tests.test_batch import same_collated as assert_collated  # noqa: E402

N = 60
BIG = SHARE_BYTES // 4 // 4 + 1  # float32 values per record: a batch of 4 is over SHARE_BYTES


def record(i: int) -> dict:
    bf16 = evs.float32_to_bfloat16(np.array([i, -0.5], np.float32))
    return {
        "tokens": np.arange(8, dtype=np.int64) + i,
        "ragged": np.full(i % 3 + 1, i, np.int16),  # padded by collate
        "pair": [np.full(2, i, np.float32), np.zeros((1, 2), np.uint8)],  # a tensor list
        "bf16": bf16,
        "label": i,
        "weight": i / 2,
        "id": f"rec-{i}",
        "big": np.full(BIG, i, np.float32),
    }


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("loader")
    with ShardWriter(root / "l-{:02d}.evs", max_records=7, durable=False) as w:
        w.extend(record(i) for i in range(N))
    return w.manifest_path


def batches_of(loader) -> list:
    with warnings.catch_warnings():  # pin_memory without an accelerator warns and does not pin
        warnings.filterwarnings("ignore", "'pin_memory' argument is set as true")
        return list(loader)


@pytest.mark.parametrize("as_dict", [True, False])
@pytest.mark.parametrize(
    "workers, context, persistent, pin",
    [
        (0, None, False, False),
        (2, "fork", False, True),
        (2, "fork", True, False),
        (2, "spawn", True, True),
    ],
)
def test_batches_equal_collated_samples(manifest, as_dict, workers, context, persistent, pin):
    ds = EValueDataset(manifest, as_dict=as_dict)
    loader = DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context=context,
        persistent_workers=persistent,
        pin_memory=pin,
        collate_fn=collate,
    )
    orders = []
    for _ in range(2):  # persistent workers serve both epochs
        order = []
        for batch in batches_of(loader):
            assert type(batch) is (dict if as_dict else list)  # plain, not a worker's subclass
            fields = batch if as_dict else dict(zip(record(0), batch))
            ids = [int(name[4:]) for name in fields["id"]]
            assert_collated(batch, collate([ds[i] for i in ids]))
            ragged = fields["ragged"]  # Padded, or stacked when its lengths are equal
            ragged = ragged.values if isinstance(ragged, Padded) else ragged
            for column in (fields["tokens"], fields["big"], ragged):
                column.add_(1)  # writable, and no later read sees it
            assert fields["bf16"].dtype == torch.bfloat16
            assert isinstance(fields["pair"][0][0], torch.Tensor)
            order += ids
        assert sorted(order) == list(range(N))
        orders.append(order)
    assert orders[0] != orders[1]
    assert ds[5][0 if not as_dict else "tokens"][0] == 5  # the file's bytes, unchanged


def test_small_tensors_travel_by_value_big_ones_in_shared_memory(manifest):
    """The main process can tell: a tensor received through shared memory is_shared()."""
    ds = EValueDataset(manifest, as_dict=True)
    loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=collate)
    batch = next(iter(loader))
    assert batch["big"].is_shared() and batch["big"].nbytes >= SHARE_BYTES
    small = [batch["tokens"], batch["label"], batch["bf16"], *batch["ragged"], *batch["pair"][1]]
    assert not any(t.is_shared() for t in small)
    assert_collated(batch, collate([ds[i] for i in range(4)]))


def test_samples_through_a_transform_and_pad_names(manifest):
    """Samples collated one by one in a worker (a transform, a ``pad`` list) arrive alike."""

    ds = EValueDataset(manifest, transform=functools.partial(_drop, key="big"), as_dict=True)
    collate_fn = functools.partial(collate, pad={"tokens", "ragged"})
    loader = DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate_fn)
    for k, batch in enumerate(loader):
        assert type(batch) is dict and isinstance(batch["tokens"], Padded)
        assert_collated(batch, collate_fn([ds[i] for i in range(5 * k, 5 * k + 5)]))


def _drop(sample: dict, key: str) -> dict:
    return {name: value for name, value in sample.items() if name != key}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [4, 30])  # few, or many records per shard
def test_a_damaged_record_fails_its_batch_naming_it(tmp_path, workers, batch_size):
    with ShardWriter(tmp_path / "d-{:02d}.evs", max_records=15, durable=False) as w:
        w.extend(record(i) for i in range(N))
    flip(tmp_path / "d-02.evs", 4, 30)  # record 2 * 15 + 4, in its tokens
    ds = EValueDataset(w.manifest_path)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=collate)
    with pytest.raises(evs.FormatError, match=r"d-02\.evs.*record 4.*checksum"):
        list(loader)


def test_loader_benchmark_runs(tmp_path):
    """benchmarks/bench_loader.py, tiny: every loader measured, the table written."""
    from benchmarks import bench_loader

    bench_loader.main(["--records", "400", "--repeats", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "loader.json").read_text())
    rows = report["results"]
    assert bench_loader.BASELINE in rows and bench_loader.EVALUE_MAP in rows
    for row in rows.values():
        assert all(row[f"rec_per_s_{w}w"] > 0 and row[f"cpu_us_per_batch_{w}w"] > 0 for w in (0, 2))
    assert "worker_rss_growth_mib" in rows[bench_loader.EVALUE_MAP]  # the memory probe ran
    assert "| evalue_store EValueDataset |" in (tmp_path / "loader.md").read_text()


def test_instructions_benchmark_runs(tmp_path):
    """benchmarks/instructions.py, one case: callgrind counts it, the table is written."""
    from benchmarks import instructions

    cases = ["get:W2:floor", "get:W2:evalue_store_noverify"]
    instructions.main(["--only", *cases, "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "instructions.json").read_text())["results"]
    assert list(rows) == cases and all(row["instructions"] > 1000 for row in rows.values())
    assert "| get W2 evalue_store_noverify |" in (tmp_path / "instructions.md").read_text()
