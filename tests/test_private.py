"""A change to a returned array never alters a later read (issue 11, item 11).

Promise: numpy arrays from reads are read-only (a write raises ValueError); tensors from the
torch adapter are writable, a change to one is seen by nobody else (not by later reads, not
by checksums), and big ones are still not copied from a plain mapped file.
"""

import gc
import os
import sys
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import evalue_store as evs
from evalue_store.buffers import MAP_BYTES
from evalue_store.torch import EValueDataset, ShardedIterableDataset, as_torch, collate

BIG = MAP_BYTES // 4 * 4  # float32 values in a tensor that gets its own mapping
SOURCES = ["mmap", "pread", "zstd", "zstd-small"]


def _records(n=6):
    rng = np.random.default_rng(1)
    return [
        [
            rng.standard_normal(BIG // 4).astype(np.float32) + k,  # big: mapped privately
            np.arange(16, dtype=np.float32) * k,  # small: copied
            np.full((3, 5), k, np.float32).T,  # a dim-order (transposed) tensor
            k,
        ]
        for k in range(n)
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("private")
    plain, packed = str(d / "a.evs"), str(d / "a.evs.zst")
    with evs.Writer(plain) as w:
        w.extend(_records())
    with evs.Writer(packed, compression="zstd") as w:
        w.extend(_records())
    small = str(d / "small.evs.zst")  # records in one cached frame, not assembled per read
    with evs.Writer(small, compression="zstd", frame_size=1 << 16) as w:
        w.extend([r[1:] for r in _records()])
    return {"mmap": plain, "pread": plain, "zstd": packed, "zstd-small": small}


def _open(files, source, verify=True):
    backend = "pread" if source == "pread" else "mmap"
    return evs.open(files[source], backend=backend, verify=verify)


def _written(ds):
    records = _records()
    return [r[1:] for r in records] if len(ds[0]) == 3 else records


def _same_as_written(ds):
    for got, want in zip(ds, _written(ds)):
        for g, w in zip(got[:3], want[:3]):
            if isinstance(w, np.ndarray):
                np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("source", SOURCES)
def test_numpy_arrays_are_read_only(files, source):
    ds = _open(files, source)
    for record in (ds[1], ds[[1]][0], ds[0:2][1], list(ds)[1]):
        for array in [v for v in record if isinstance(v, np.ndarray)]:
            assert not array.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                array[(0,) * array.ndim] = 7
            with pytest.raises(ValueError, match="read-only"):
                array -= array.mean()
            with pytest.raises(ValueError):
                array.flags.writeable = True  # cannot be switched back on
    assert not ds.entries().flags.writeable
    _same_as_written(ds)
    assert ds.verify().ok


def _exporters(value):
    """``value`` and what Python reaches from it through ``.base`` and ``memoryview.obj``."""
    seen = []
    while value is not None and not any(value is s for s in seen):
        seen.append(value)
        if isinstance(value, np.ndarray):
            value = value.base
        elif isinstance(value, memoryview):
            value = value.obj
        else:
            value = None
    return seen


@pytest.mark.parametrize("source", SOURCES)
def test_nothing_a_read_returns_leads_to_a_writable_buffer(files, source):
    # Attack c08: a.base.obj of a mapped file's array was the mapping (a mmap.mmap), whose
    # writable buffer np.frombuffer wrote into from pure Python: ds[i] then returned the
    # change. A scan of a compressed file's small frames did the same through the numpy
    # array it decompressed into (the next record of the scan, the next scan's first).
    ds = _open(files, source, verify=False)
    scan = iter(ds)
    reads = [ds[1], ds[[1]][0], ds[0:2][1], next(scan), [ds.raw(1)]]
    reached = []
    for value in [v for record in reads for v in record]:
        for obj in _exporters(value):
            try:
                raw = np.frombuffer(obj, np.uint8)
            except (TypeError, ValueError):  # not a buffer, or an empty one
                continue
            assert not raw.flags.writeable, type(obj)
            with pytest.raises((ValueError, BufferError)):
                raw.flags.writeable = True
            with pytest.raises(TypeError, match="read-only"):
                memoryview(obj).cast("B")[:1] = b"x"  # (raises before writing)
            reached.append(obj)
    assert reached  # the walk did reach the buffers
    for got, want in zip(scan, _written(ds)[1:]):  # the rest of the scan, then all again
        for g, w in zip(got, want):
            assert g.tobytes() == w.tobytes() if isinstance(w, np.ndarray) else g == w
    _same_as_written(ds)
    assert ds.verify().ok


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("source", SOURCES)
def test_in_place_change_of_torch_tensors_reaches_no_later_read(files, source, verify):
    backend = "pread" if source == "pread" else "mmap"
    ds = EValueDataset(files[source], backend=backend, verify=verify)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "non-writable tensors" would fail here
        for _ in range(2):  # two epochs: the second sees exactly what was written
            for i in range(len(ds)):
                sample = ds[i]
                for t in sample[:-1]:
                    assert isinstance(t, torch.Tensor)
                    t.sub_(t.mean()).mul_(-3)  # as a normalizing transform does
                batch = collate(ds.__getitems__([i, (i + 1) % len(ds)]))
                for t in batch:
                    t.add_(1000)
        reader = _open(files, source, verify=True)
        for i, want in enumerate(_written(reader)):
            for t, w in zip(ds[i][:-1], want[:-1]):
                np.testing.assert_array_equal(t.numpy(), w)
    _same_as_written(reader)  # a reader of the same process sees the file as written
    assert reader.verify().ok  # and nothing looks damaged


@pytest.mark.parametrize("source", SOURCES)
def test_as_torch_of_a_view_then_in_place_change(files, source):
    ds = _open(files, source)
    record = ds[2]
    tensors = [as_torch(a) for a in record[:-1]]
    for t in tensors:
        t.zero_()
    transposed, view = tensors[-1], record[-2]
    assert transposed.stride() == tuple(s // view.itemsize for s in view.strides)  # layout kept
    for view, want in zip(record, _written(ds)[2][:-1]):
        np.testing.assert_array_equal(view, want)  # the views did not change
    _same_as_written(ds)


def _file_mappings(path):
    """(start, end) of this process's mappings of ``path`` (Linux /proc)."""
    ino = os.stat(path).st_ino
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and int(fields[4]) == ino and fields[5] == os.path.realpath(path):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                spans.append((lo, hi))
    return spans


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_big_tensors_are_not_copied_and_changes_stay_private(files):
    ds = EValueDataset(files["mmap"])
    before = _file_mappings(files["mmap"])
    sample = ds[3]
    big, small = sample[0], sample[1]
    spans = _file_mappings(files["mmap"])
    address = big.data_ptr()
    # Its memory is a mapping of the file (not a heap copy), one that was not there before.
    inside = [s for s in spans if s[0] <= address < s[1]]
    assert inside and inside[0] not in before
    assert not any(s[0] <= small.data_ptr() < s[1] for s in spans)  # small ones are copied
    big.mul_(0)
    again = ds[3][0]
    assert again.data_ptr() != address
    np.testing.assert_array_equal(again.numpy(), _records()[3][0])
    del sample, big, again
    gc.collect()
    assert len(_file_mappings(files["mmap"])) <= len(before) + 1  # mappings go with tensors


def test_private_tensor_outlives_its_closed_dataset(files):
    ds = evs.open(files["mmap"])
    tensor = as_torch(ds[4][0])
    ds.close()
    tensor.add_(1)
    np.testing.assert_array_equal(tensor.numpy(), _records()[4][0] + 1)


def _normalize(sample):
    for t in sample:
        if isinstance(t, torch.Tensor):
            t.sub_(t.mean()).mul_(2).add_(1)  # not idempotent: a second pass would show
    return sample


@pytest.mark.parametrize("source", ["mmap", "zstd", "zstd-small"])
def test_dataloader_workers_transform_in_place_for_two_epochs(files, source):
    # Persistent workers read the same records again in epoch 2, from the same mapping
    # or frame cache the transform's changes would have reached.
    records = _records() if source != "zstd-small" else [r[1:] for r in _records()]
    width = 3 if source != "zstd-small" else 2
    want = [collate([_normalize(as_torch_all(r)) for r in records[k : k + 2]]) for k in (0, 2, 4)]
    ds = EValueDataset(files[source], transform=_normalize, verify=True)
    loader = DataLoader(
        ds, batch_size=2, num_workers=2, collate_fn=collate, persistent_workers=True
    )
    for _epoch in range(3):
        got = list(loader)
        assert len(got) == 3
        for g, w in zip(got, want):
            for a, b in zip(g[:width], w[:width]):
                torch.testing.assert_close(a, b)
    it = ShardedIterableDataset(files[source], shuffle=False, transform=_normalize, batch_size=2)
    stream = DataLoader(
        it, batch_size=2, num_workers=2, collate_fn=collate, persistent_workers=True
    )
    for _epoch in range(3):
        got = list(stream)
        for g, w in zip(got, want):
            torch.testing.assert_close(g[0], w[0])
    assert _open(files, "mmap").verify().ok and evs.open(files[source]).verify().ok


def as_torch_all(record):
    return [as_torch(np.array(v)) if isinstance(v, np.ndarray) else v for v in record]
