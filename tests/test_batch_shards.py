"""ShardedDataset.get_batch over many shards: a batch is what ds[i] gives, stacked.

A batch with few records per shard is read record by record and stacked; one with many
per shard is decoded shard by shard and merged. Both must give exactly ``expected`` (ds[i]
for each index, stacked: tests/test_batch.py), and a damaged record must raise what ds[i]
raises for it, naming its shard and its record there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import evalue_store as evs
from evalue_store.dataset.batch import GROUP_RECORDS
from evalue_store.shards import ShardWriter
from evalue_store.torch import EValueDataset, collate
from tests.test_batch import assert_batch, assert_same_value, expected, flip, w1

SHARD = 40  # records per shard
N = 12 * SHARD


def write_shards(root, compression=None, as_dicts=True) -> str:
    rng = np.random.default_rng(11)
    with ShardWriter(
        root / "s-{:02d}.evs", max_records=SHARD, durable=False, compression=compression
    ) as w:
        for i in range(N):
            record = w1(i, rng)  # ids of 1 to 3 digits: several layouts
            w.append(record if as_dicts else list(record.values()))
    return w.manifest_path


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> str:
    return write_shards(tmp_path_factory.mktemp("shards"))


def thin(n: int, seed: int = 0) -> np.ndarray:
    """n random records of the N, spread over every shard (fewer than GROUP_RECORDS per
    shard for n < 12 * GROUP_RECORDS)."""
    return np.random.default_rng(seed).choice(N, n, replace=False)


INDEX_SETS = [
    thin(64),
    thin(12 * GROUP_RECORDS + 24, seed=1),  # many per shard: decoded shard by shard
    [5, N - 1, 5, -1, -N, 2 * SHARD],  # repeated, negative
    np.arange(N - 1, 0, -37, dtype=np.uint16),
    [SHARD + 3],
]


@pytest.mark.parametrize("backend", ["mmap", "pread"])
@pytest.mark.parametrize("as_dict", [False, True])
@pytest.mark.parametrize("which", range(len(INDEX_SETS)))
def test_batches_over_many_shards_are_ds_i_stacked(manifest, backend, as_dict, which):
    indices = INDEX_SETS[which]
    positions = [int(i) % N for i in indices]
    with evs.open_shards(manifest, backend=backend, as_dict=as_dict) as sds:
        got = sds.get_batch(indices)
    with evs.open_shards(manifest) as oracle:  # ds[i] gives lists: what expected stacks
        assert_batch(got, expected(oracle, positions))


def test_unnamed_and_compressed_shards(tmp_path):
    plain = write_shards(tmp_path / "plain", as_dicts=False)
    packed = write_shards(tmp_path / "zstd", compression="zstd", as_dicts=False)
    for indices in (thin(64), thin(300, seed=2)):
        with evs.open_shards([plain, packed]) as sds:  # plain and compressed shards mixed
            both = np.concatenate([indices, indices + N])
            got = sds.get_batch(both)
            assert isinstance(got, list) and len(got) == 4
            assert_batch(got, expected(sds, both))


def test_shards_closed_while_a_batch_is_read(manifest):
    """With max_open=1 every shard but the last is closed by the time the batch is
    stacked: what was read from it stays valid."""
    with evs.open_shards(manifest, max_open=1) as sds:
        indices = thin(64)
        got = sds.get_batch(indices)
        with evs.open_shards(manifest) as fresh:
            assert_batch(got, expected(fresh, indices))


def test_out_buffers_on_a_batch_over_many_shards(manifest):
    indices = thin(64)
    tokens = torch.empty((64, 128), dtype=torch.int64)
    with evs.open_shards(manifest) as sds:
        got = sds.get_batch(indices, out={"tokens": tokens, 1: np.empty((64, 16), np.float32)})
        assert got["tokens"] is tokens
        want = expected(sds, indices)
        assert_same_value(tokens.numpy(), want["tokens"])
        assert_same_value(got["features"], want["features"])
        with pytest.raises(ValueError, match="out for field 'id': its values do not stack"):
            sds.get_batch(indices, out={"id": np.empty(64)})


@pytest.mark.parametrize("many", [False, True])
def test_a_damaged_record_is_named(tmp_path, many):
    """The batch raises what ds[i] raises for the record: its checksum mismatch, naming
    the shard's path and the record's number in it."""
    manifest = write_shards(tmp_path)
    shard = tmp_path / "s-03.evs"
    flip(shard, 7, 100)  # inside the tokens of record 3 * SHARD + 7
    damaged = 3 * SHARD + 7
    indices = list(thin(12 * GROUP_RECORDS + 40, seed=3)) if many else list(thin(63))
    indices = [i for i in indices if i != damaged] + [damaged]
    with evs.open_shards(manifest) as sds:
        with pytest.raises(evs.FormatError, match="checksum") as caught:
            sds.get_batch(indices)
        assert caught.value.record == 7 and caught.value.path == str(shard)
        with pytest.raises(evs.FormatError) as single:
            sds[damaged]
        assert str(single.value) == str(caught.value)
        rest = indices[:-1]
        assert_batch(sds.get_batch(rest), expected(sds, rest))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_shards_naming_fields_in_another_order_batch_under_their_own_names(tmp_path, compression):
    """Two shards whose writers' first dicts had the same keys in another order (parallel
    jobs): a batch labelled every shard's values with the first shard's names, so `label`
    held the weights, silently, in get_batch and in every DataLoader batch (attacker
    finding, session 14, round 19, C11). Each value now goes under its own name, as ds[i]
    gives it; names that are not the same set are a BatchError."""
    a, b, c = (tmp_path / f"{n}.evs" for n in "abc")
    with evs.Writer(a, compression=compression) as w:
        w.extend({"label": i, "weight": np.full(3, 10.0 * i)} for i in range(40))
    with evs.Writer(b, compression=compression) as w:
        w.extend({"weight": np.full(3, 1000.0 + i), "label": 100 + i} for i in range(40))
    ds = evs.open_shards([a, b], as_dict=True)
    for indices in (list(range(0, 80, 3)), list(range(40, 80)), [45, 2], list(range(80))):
        want = [ds[i] for i in indices]
        got = ds.get_batch(indices)
        assert got["label"].tolist() == [r["label"] for r in want]
        assert got["weight"].tolist() == [r["weight"].tolist() for r in want]
        label = np.empty(len(indices), np.int64)
        assert ds.get_batch(indices, out={"label": label})["label"] is label
        assert label.tolist() == [r["label"] for r in want]
        samples = EValueDataset([a, b], as_dict=True).__getitems__(indices)
        assert collate(samples)["label"].tolist() == [r["label"] for r in want]
    with evs.Writer(c, compression=compression) as w:
        w.extend({"label": i, "mass": 1.0} for i in range(5))
    mixed = evs.open_shards([a, c], as_dict=True)
    with pytest.raises(evs.BatchError, match=r"shard 1 \(.*c.evs\) names its fields"):
        mixed.get_batch([0, 41])
    assert mixed.get_batch([0, 1])["label"].tolist() == [0, 1]  # shard 0 alone: fine
