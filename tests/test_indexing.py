"""Indexing follows numpy's rules for a 1-D array, on every dataset type (issue 11, item 10).

The expected records come from indexing ``np.arange(n)`` with the same index: whatever numpy
accepts (of the kinds a sequence of records can honour), the datasets accept with the same
meaning; what numpy rejects, they reject with TypeError or IndexError.
"""

import numpy as np
import pytest
import torch

import evalue_store as evs
from evalue_store.torch import EValueDataset

N = 10


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("idx")
    plain = str(d / "a.evs")
    with evs.Writer(plain) as w:
        w.extend([[i, np.full(3, i)] for i in range(N)])
    packed = str(d / "a.evs.zst")
    with evs.Writer(packed, compression="zstd") as w:
        w.extend([[i, np.full(3, i)] for i in range(N)])
    with evs.ShardWriter(str(d / "s-{:03d}.evs"), max_records=3) as w:  # 4 shards: 3+3+3+1
        w.extend([[i, np.full(3, i)] for i in range(N)])
    return {"plain": plain, "zstd": packed, "shards": str(d / "s.manifest.json")}


def _datasets(paths):
    return [
        ("plain", evs.open(paths["plain"]), lambda r: r[0]),
        ("pread", evs.open(paths["plain"], backend="pread"), lambda r: r[0]),
        ("zstd", evs.open(paths["zstd"]), lambda r: r[0]),
        ("shards", evs.open_shards(paths["shards"]), lambda r: r[0]),
        ("torch", EValueDataset(paths["shards"]), lambda r: r[0]),
    ]


MANY = [
    slice(None),
    slice(2, 8, 3),
    slice(None, None, -1),
    slice(-3, None),
    [5, 3, 9],
    [-1, 0, -N],
    [],
    range(2, 5),
    np.array([1, 1, 7]),
    np.array([2, 3], np.uint8),
    np.array([-2], np.int16),
    torch.tensor([3, 1]),
    torch.tensor([6]),  # a 1-element 1-D tensor is a list of one, as in numpy
    np.arange(N) % 4 == 0,  # a mask
    [i in (2, 5) for i in range(N)],
    torch.arange(N) > 7,
]
ONE = [(4,), 3, -1, np.int64(4), np.uint16(2), np.array(3), np.array(-2, np.int8), torch.tensor(3)]


@pytest.mark.parametrize("index", ONE, ids=repr)
def test_one_record_for_any_integer(paths, index):
    expected = int(np.arange(N)[index[0] if isinstance(index, tuple) else np.asarray(index)])
    for name, ds, key in _datasets(paths):
        assert key(ds[index]) == expected, name


@pytest.mark.parametrize("index", MANY, ids=repr)
def test_many_records_as_numpy_selects_them(paths, index):
    np_index = index.numpy() if isinstance(index, torch.Tensor) else index
    expected = np.arange(N)[np_index]
    expected = np.atleast_1d(expected).tolist()
    for name, ds, key in _datasets(paths):
        got = ds[index]
        assert isinstance(got, list), name
        assert [key(r) for r in got] == expected, name


def test_mask_with_two_true_values_returns_two_records(paths):
    mask = np.zeros(N, bool)
    mask[[2, 7]] = True
    for name, ds, key in _datasets(paths):
        assert [key(r) for r in ds[mask]] == [2, 7], name
        assert [key(r) for r in ds.get_many(mask)] == [2, 7] if name != "torch" else True


WRONG_KIND = [
    "12",
    "1",
    b"1",
    True,
    False,
    np.True_,
    np.array(True),
    torch.tensor(True),
    1.0,
    np.float64(2),
    np.array(2.0),
    [1.0, 2.0],
    np.array([0.5]),
    np.array([]),  # empty arrays of other dtypes: numpy refuses them too (a list [] is fine)
    np.array([], object),
    np.array([], str),
    torch.tensor([]),
    ["a"],
    None,
    {1, 2},
    {1: 2},
    (i for i in range(2)),
    np.zeros((2, 2), np.int64),
    [[1, 2], [3, 4]],
    [[1], [2, 3]],
    slice(1.5, 3),
    object(),
]


def _every_dataset_raises(paths, index, error: type[Exception]) -> None:
    for _name, ds, _ in _datasets(paths):
        with pytest.raises(error):
            ds[index]


@pytest.mark.parametrize("index", WRONG_KIND, ids=repr)
def test_wrong_kinds_raise_type_error(paths, index):
    _every_dataset_raises(paths, index, TypeError)


def test_a_slice_step_of_zero_is_a_usage_error(paths):
    """Python's slice.indices raised its bare ValueError (round 19 remark, session 14)."""
    _every_dataset_raises(paths, slice(None, None, 0), evs.UsageError)


OUT_OF_RANGE = [
    N,
    -N - 1,
    2**70,
    np.uint64(2**63 + 5),
    np.array(N),
    torch.tensor(-N - 1),
    [0, N],
    [2**70],
    np.array([N], np.uint64),
    np.array([2**64 - 1], np.uint64),
    torch.tensor([N]),
    np.ones(N - 1, bool),  # masks of the wrong length: IndexError, as numpy
    np.ones(N + 1, bool),
    [True, False],
    (1, 2),  # two indices for one dimension
]


@pytest.mark.parametrize("index", MANY, ids=repr)
def test_get_many_and_get_batch_take_what_indexing_takes_for_several(paths, index):
    """README: a slice, an integer sequence or a mask selects records for ``ds[...]`` and
    ``ds.get_many`` alike, and ``get_batch`` takes indices as ``get_many`` does."""
    np_index = index.numpy() if isinstance(index, torch.Tensor) else index
    expected = np.atleast_1d(np.arange(N)[np_index]).tolist()
    for name, ds, key in _datasets(paths)[:4]:
        assert [key(r) for r in ds.get_many(index)] == expected, name
        if expected:
            assert ds.get_batch(index)[0].tolist() == expected, name


@pytest.mark.parametrize("index", OUT_OF_RANGE, ids=repr)
def test_out_of_range_and_wrong_length_raise_index_error(paths, index):
    _every_dataset_raises(paths, index, IndexError)


def test_get_many_takes_sequences_only(paths):
    for name, ds, key in _datasets(paths)[:4]:
        assert [key(r) for r in ds.get_many(np.array([4, -1]))] == [4, N - 1], name
        for bad in ("12", 3, [1.5], np.ones(3, bool)):
            with pytest.raises((TypeError, IndexError)):
                ds.get_many(bad)


def test_raw_and_locate_take_one_integer(paths):
    ds = evs.open(paths["plain"])
    assert bytes(ds.raw(np.array(2))) == bytes(ds.raw(2))
    for bad in (True, "2", 2.0, [2]):
        with pytest.raises(TypeError):
            ds.raw(bad)
    sharded = evs.open_shards(paths["shards"])
    assert sharded.locate(torch.tensor(4)) == (1, 1)
    with pytest.raises(TypeError):
        sharded.locate(True)


def test_torch_dataset_tensor_index_is_one_sample(paths):
    ds = EValueDataset(paths["shards"])
    sample = ds[torch.tensor(3)]
    assert sample[0] == 3 and isinstance(sample[1], torch.Tensor)
    assert [s[0] for s in ds[torch.tensor([3, 4])]] == [3, 4]
