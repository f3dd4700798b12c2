"""get_batch's column path on every source: the same batch as ds[i] stacked, whatever the
layouts, sources, alignments, checksum algorithm and indices; every damaged record caught
and named; and no work per record for fixed-shape fields (counted, not timed).

The oracle is tests/test_batch.py's ``expected``: ds[i] for every index, stacked per field.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evalue_store as evs
from evalue_store.container import FRAME_SIZE
from evalue_store.dataset import batch
from tests.test_batch import assert_batch, expected

# ----------------------------------------------------------------------------- property


def value_of(kind: str, rng: np.random.Generator, size: int):
    if kind == "f32":
        return rng.standard_normal(size, dtype=np.float32)
    if kind == "i64":
        return rng.integers(-(1 << 62), 1 << 62, (2, size), dtype=np.int64)
    if kind == "u8":
        return rng.integers(0, 256, size, dtype=np.uint8)
    if kind == "order":  # stored in a dim order
        return rng.standard_normal((size + 1, 2)).T
    if kind == "int":
        return int(rng.integers(-(1 << 63), 1 << 63, dtype=np.int64))
    if kind == "float":
        return float(rng.standard_normal())
    if kind == "bool":
        return bool(rng.integers(0, 2))
    if kind == "str":
        return "é" * size
    if kind == "bytes":
        return bytes(rng.integers(0, 256, size, dtype=np.uint8))
    return None


KINDS = ["f32", "i64", "u8", "order", "int", "float", "bool", "str", "bytes", "none"]
schema = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 40)), min_size=1, max_size=4)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kinds=schema,
    layouts=st.integers(1, 3),
    alignment=st.sampled_from([8, 64]),
    version=st.sampled_from(["1.0", "1.1"]),
    compression=st.sampled_from([None, "zstd"]),
    backend=st.sampled_from(["mmap", "pread"]),
    seed=st.integers(0, 1 << 16),
    picks=st.lists(st.integers(-200, 199), max_size=120),
)
def test_any_batch_is_ds_i_stacked(
    tmp_path, kinds, layouts, alignment, version, compression, backend, seed, picks
):
    """Records of up to three layouts (sizes vary by record), mixed in the file."""
    rng = np.random.default_rng(seed)
    path = tmp_path / f"p{seed}-{alignment}-{version}-{compression}-{backend}.evs"
    shift = rng.integers(0, 3, 200) % layouts
    records = [[value_of(k, rng, size + int(s)) for k, size in kinds] for s in shift]
    options = dict(alignment=alignment, compression=compression)
    if compression is None:
        options["format_version"] = version
    with evs.Writer(path, **options) as writer:
        writer.extend(records)
    with evs.open(path, backend=backend) as ds:
        for indices in (picks, list(range(0, 200, 2)), np.array(picks, np.int32)):
            assert_batch(ds.get_batch(indices), expected(ds, [i % 200 for i in indices]))


# ----------------------------------------------------------------------------- sources


def xor_records(n: int, rng: np.random.Generator) -> list:
    """ExecuTorch's XOR example: two float32 inputs and an int label."""
    x = rng.random((n, 2), dtype=np.float32)
    return [[x[i], int(rng.integers(0, 2))] for i in range(n)]


def w1_records(n: int, rng: np.random.Generator) -> list:
    return [
        [rng.integers(0, 50_000, 128), rng.standard_normal(16, dtype=np.float32), i, f"{i:06d}"]
        for i in range(n)
    ]


@pytest.fixture(scope="module", params=["xor", "w1"])
def files(request, tmp_path_factory):
    """One plain and one compressed file of the same records."""
    make = xor_records if request.param == "xor" else w1_records
    records = make(600, np.random.default_rng(11))
    paths = {}
    for compression in (None, "zstd"):
        path = tmp_path_factory.mktemp("src") / f"{request.param}-{compression}.evs"
        with evs.Writer(path, compression=compression) as writer:
            writer.extend(records)
            writer.commit()  # several index segments
            writer.extend(records[:100])
        paths[compression] = path
    return paths


def counting_decodes(monkeypatch) -> list:
    calls: list = []
    decode = batch.decode_batch
    monkeypatch.setattr(batch, "decode_batch", lambda *a: calls.append(len(a[2])) or decode(*a))
    return calls


@pytest.mark.parametrize("source", ["mmap", "pread", "zstd"])
def test_every_source_decodes_by_column(files, source, monkeypatch):
    path = files["zstd" if source == "zstd" else None]
    calls = counting_decodes(monkeypatch)
    indices = np.random.default_rng(3).integers(-700, 700, 256)
    with evs.open(path, backend="pread" if source == "pread" else "mmap") as ds:
        assert ds.compressed == (source == "zstd")
        got = ds.get_batch(indices)
        assert calls == [256]  # one group, decoded column by column
        assert_batch(got, expected(ds, [int(i) % 700 for i in indices]))


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from tests.servers import s3_server

    with s3_server() as server:
        server.fs().mkdir("bkt")
        yield server


def test_remote_batch_decodes_by_column_in_two_rounds(files, s3, monkeypatch):
    """A remote batch: its index entries in one round, its records in another, then the
    column decoder (no record-by-record reads)."""
    name = files[None].name
    s3.fs().put_file(str(files[None]), f"bkt/{name}")
    ds = evs.open(f"s3://bkt/{name}", storage_options=s3.options)
    ds.get_batch([0, 1])
    calls = counting_decodes(monkeypatch)
    rounds = []
    pread_many = ds._source.reader.pread_many
    monkeypatch.setattr(
        ds._source.reader, "pread_many", lambda *a, **k: rounds.append(1) or pread_many(*a, **k)
    )
    indices = np.random.default_rng(4).permutation(700)[:200]
    got = ds.get_batch(indices)
    assert calls == [200] and len(rounds) == 2
    with evs.open(files[None]) as local:
        assert_batch(got, expected(local, indices))


class Reads:
    """Counts the reads a pread source makes."""

    def __init__(self, monkeypatch):
        import os

        self.count = 0
        real = os.preadv

        def preadv(*args):
            self.count += 1
            return real(*args)

        monkeypatch.setattr(os, "preadv", preadv)


def test_pread_batch_reads_in_one_pass(files, monkeypatch):
    """A batch of neighbouring records costs a few reads, not one (or two) per record."""
    with evs.open(files[None], backend="pread") as ds:
        ds.get_batch([0, 1])  # layout learned
        reads = Reads(monkeypatch)
        got = ds.get_batch(np.arange(40, 240))
        assert reads.count <= 4  # the index entries, the records (both coalesced)
        assert_batch(got, expected(ds, range(40, 240)))


# ----------------------------------------------------------------------------- damage


def flipped(path, tmp_path, i: int, at: int):
    """A copy of ``path`` with payload byte ``at`` of record ``i`` flipped."""
    with evs.open(path) as ds:
        offset = int(ds.entries()[i]["offset"])
    data = bytearray(path.read_bytes())
    data[offset + FRAME_SIZE + at] ^= 0x10
    copy = tmp_path / f"flip{i}-{at}.evs"
    copy.write_bytes(data)
    return copy


@pytest.mark.parametrize("version", ["1.0", "1.1"])  # CRC-32, CRC-32C
def test_every_flipped_byte_of_a_small_record_is_named(tmp_path, version):
    """Records with few value bytes are checked by the table method: every byte of the
    payload, flipped, is caught and blamed on its record exactly as ds[i] blames it."""
    path = tmp_path / "xor.evs"
    with evs.Writer(path, format_version=version) as writer:
        writer.extend(xor_records(200, np.random.default_rng(5)))
    with evs.open(path) as ds:
        length = int(ds.entries()[77]["length"])
    for at in range(length):
        copy = flipped(path, tmp_path, 77, at)
        with evs.open(copy, backend="mmap") as ds:
            with pytest.raises(evs.FormatError) as single:
                ds[77]
            for indices in (range(64, 192), [77] * 70, list(range(199, 63, -1))):
                with pytest.raises(evs.FormatError) as caught:
                    ds.get_batch(indices)
                assert caught.value.record == 77 and str(caught.value) == str(single.value)
        copy.unlink()


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_damaged_record_in_a_batch_is_named(files, tmp_path, backend):
    path = files[None]
    with evs.open(path) as ds:
        length = int(ds.entries()[300]["length"])
    copy = flipped(path, tmp_path, 300, length - 1)  # a value byte, last in the payload
    with evs.open(copy, backend=backend) as ds:
        with pytest.raises(evs.FormatError) as single:
            ds[300]
        with pytest.raises(evs.FormatError) as caught:
            ds.get_batch(np.arange(200, 400))
        assert caught.value.record == 300 and str(caught.value) == str(single.value)
    with evs.open(copy, backend=backend, verify=False) as ds:
        assert_batch(ds.get_batch(np.arange(200, 400)), expected(ds, range(200, 400)))


# ----------------------------------------------------------------------------- indices


@pytest.mark.parametrize(
    "indices",
    [
        [],
        [-1, -1, -700, 0],
        [np.int64(5), np.int32(-3), np.uint8(7)],
        np.array([699, 3, 3, 350], np.uint16),
        torch.tensor([2, -2, 2]),
        range(690, 700),
    ],
)
def test_odd_indices(files, indices):
    with evs.open(files[None]) as ds:
        want = [int(i) % len(ds) for i in indices]
        assert_batch(ds.get_batch(indices), expected(ds, want))
        mask = np.zeros(len(ds), bool)
        mask[want] = True
        assert_batch(ds.get_batch(mask), expected(ds, sorted(set(want))))
    with evs.open(files[None]) as ds, pytest.raises(IndexError):
        ds.get_batch([0, 700])


# ----------------------------------------------------------------------------- no per-record work


def calls_during(fn) -> Counter:
    """Every Python function and builtin called (from Python) while ``fn`` runs."""
    seen: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call":
            seen[frame.f_code.co_name] += 1
        elif event == "c_call":
            seen[getattr(arg, "__qualname__", repr(arg))] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_fixed_shape_batches_do_no_work_per_record(tmp_path):
    """For tensors and numbers (checksums verified), a batch of 512 makes exactly the calls
    a batch of 64 makes: a loop over the records, or an object built per record, would show
    up as calls that grow with the batch."""
    path = tmp_path / "fixed.evs"
    rng = np.random.default_rng(8)
    with evs.Writer(path) as writer:
        for i, (x, label) in enumerate(xor_records(2000, rng)):
            writer.append([x, label, float(i), i % 3 == 0, np.arange(3, dtype=np.int16) + i])
    order = np.random.default_rng(9).permutation(2000)
    from evalue_store.torch import EValueDataset

    with evs.open(path) as ds:
        ds.get_batch(order[:64])  # the layout and its checksum tables are made once
        small = calls_during(lambda: ds.get_batch(order[:64]))
        big = calls_during(lambda: ds.get_batch(order[64:576]))
        assert small == big and sum(big.values()) < 200
    loader = EValueDataset(path)
    loader.__getitems__(order[:64].tolist())
    small = calls_during(lambda: loader.__getitems__(order[:64]))
    big = calls_during(lambda: loader.__getitems__(order[64:576]))
    assert small == big


def test_batch_benchmark_runs(tmp_path):
    """benchmarks/bench_batch.py, tiny: every row measured, the table written."""
    from benchmarks import bench_batch

    bench_batch.main(
        ["--repeats", "1", "--batches", "2", "--records", "300", "--out", str(tmp_path)]
    )
    rows = json.loads((tmp_path / "batch.json").read_text())["rows"]
    assert [(r["workload"], r["batch"]) for r in rows] == [
        ("W1", 32),
        ("W1", 256),
        ("XOR", 32),
        ("XOR", 256),
    ]
    assert all(r["get_batch"] > 0 and r["ds[i]"] > 0 for r in rows)
    assert "ds[i] / get_batch" in (tmp_path / "batch.md").read_text()
