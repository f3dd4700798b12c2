"""The fast paths give exactly what the generic code gives.

A scan (``for rec in ds``) and ``ds[i]`` of a plain file through a mapping read a record
in one compiled call (``_native.Mapped``, see test_native_mapped) once its layout is
learned, or inline in Python (Layout.decode), each tensor one row of an array per tensor
spec over the mapping; a compressed scan decodes runs of same-layout records column by
column (Layout.decode_run); the writer encodes columns of same-layout records at once
(Writer.extend_columns).
The oracle is the generic decoder (``decode_payload``) and the pread backend, whose scan
reads record by record. Damaged records must fail at the same record with the same error.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import evalue_store as evs
from evalue_store.buffers import FileMap
from evalue_store.codec import decode_payload
from evalue_store.container import ENTRY_SIZE, FRAME_SIZE, crc32c
from evalue_store.dtypes import CODE_TO_DTYPE


def assert_identical(got, want):
    """Same types, values, dtypes, shapes, strides and flags; floats bit for bit."""
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert (got.dtype, got.shape, got.strides) == (want.dtype, want.shape, want.strides)
        assert got.flags.c_contiguous == want.flags.c_contiguous
        assert got.flags.writeable == want.flags.writeable
        assert got.ctypes.data % 8 == want.ctypes.data % 8
        assert got.tobytes() == want.tobytes()
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_identical(g, w)
    elif isinstance(want, float):
        assert struct.pack("<d", got) == struct.pack("<d", want)
    else:
        assert got == want


def in_mapping(array: np.ndarray) -> bool:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, FileMap)


def reference(path) -> list[list]:
    """Every record decoded one by one by the generic decoder, from the file's bytes."""
    data = memoryview(path.read_bytes())  # read-only, as every read's arrays are
    with evs.open(path, backend="pread") as ds:
        entries, alignment = ds.entries(), ds.alignment
    return [decode_payload(data, int(e["offset"]), int(e["length"]), alignment) for e in entries]


def outcome(path, indexed: bool = False, **options) -> tuple[list, str | None]:
    """The records a scan (or reads of ds[0], ds[1]... if ``indexed``) yields, and the
    error that ended it (None if it finished)."""
    got = []
    with evs.open(path, **options) as ds:
        try:
            for values in (ds[i] for i in range(len(ds))) if indexed else ds:
                got.append(values)
        except evs.FormatError as exc:
            return got, str(exc)
    return got, None


def assert_scans_agree(path) -> None:
    """The mapped scan gives what reading record by record gives, and what the pread
    backend's scan gives (the same error too, at the same file offset), with and without
    verify."""
    for verify in (True, False):
        fast_records, fast_error = outcome(path, verify=verify)
        for indexed, backend in ((True, "mmap"), (False, "pread")):
            records, error = outcome(path, indexed, verify=verify, backend=backend)
            assert fast_error == error, backend  # pread too: errors name file offsets
            assert len(fast_records) == len(records)
            for fast, slow in zip(fast_records, records):
                assert_identical(fast, slow)


def w1_records(n: int, seed: int = 0) -> list[list]:
    rng = np.random.default_rng(seed)
    return [
        [
            rng.integers(0, 50_000, 128),
            rng.standard_normal(16, dtype=np.float32),
            int(rng.integers(0, 1000)),
            f"ex-{i:06d}",
        ]
        for i in range(n)
    ]


# ----------------------------------------------------------------------------- round trips

DTYPES = [dt for dt in CODE_TO_DTYPE.values() if dt.fields is None]
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
arrays = st.one_of(
    st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(dt, shapes)),
    hnp.arrays(np.dtype("<u2"), shapes).map(lambda a: a.view(evs.BFLOAT16)),
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=3)).map(lambda a: a.T),
    hnp.arrays(np.dtype(">i4"), shapes),
)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=6),
    arrays,
    st.lists(st.integers(-5, 5), max_size=3),
)
structures = st.lists(st.lists(values, max_size=5), min_size=1, max_size=4)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    structures,
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 30), st.booleans()), max_size=8),
    st.sampled_from([8, 64, 4096]),
)
def test_scan_matches_generic_decoder(tmp_path_factory, kinds, plan, alignment):
    """Runs of one record repeated, records that break a run, commits between them."""
    path = tmp_path_factory.mktemp("fast") / "data.evs"
    written = []
    with evs.Writer(path, alignment=alignment) as writer:
        for which, repeat, commit in plan:
            record = kinds[which % len(kinds)]
            for _ in range(repeat):
                writer.append(record)
                written.append(record)
            if commit:
                writer.commit()
    want = reference(path)
    assert len(want) == len(written)
    with evs.open(path) as ds:
        got = list(ds)
        by_index = [ds[i] for i in range(-len(ds), 0)]  # ds[i] of a mapped file: its fast path
    for g, w, one in zip(got, want, by_index):
        assert_identical(g, w)
        assert_identical(one, w)
    assert len(got) == len(want) == len(by_index)
    assert_scans_agree(path)


class Counting:
    """A dataset's compiled reader (``ds._fast``, and ``ds._fast_get``: its get), counting the
    records it serves."""

    def __init__(self, fast):
        self.fast, self.served = fast, 0

    def get(self, i):
        record = self.fast.get(i)
        self.served += record is not None
        return record

    def decode_entries(self, entries):
        records = self.fast.decode_entries(entries)
        self.served += sum(r is not None for r in records)
        return records

    def add(self, *args):
        self.fast.add(*args)

    def clear(self):
        self.fast.clear()


def test_scan_views_are_zero_copy_writable_and_private(tmp_path):
    path = tmp_path / "w1.evs"
    recs = w1_records(1500)  # several scan chunks
    with evs.Writer(path) as writer:
        writer.extend(recs[:700])
        writer.commit()
        writer.extend(recs[700:])
    with evs.open(path) as ds:
        fast = ds._fast = Counting(ds._fast)
        ds._fast_get = fast.get  # (ds[i] calls the compiled get through this)
        got = list(ds)
        assert fast.served == 1500 - 512  # the first chunk's taught the layout
        assert [ds[i] is not None for i in range(5)] and fast.served == 1500 - 512 + 5
        for values, record in zip(got, recs):
            assert_identical(values, [values[0], values[1], record[2], record[3]])
            for tensor, original in zip(values[:2], record[:2]):
                assert np.array_equal(tensor, original)
                assert in_mapping(tensor) and not tensor.flags.writeable
                assert tensor.ctypes.data % ds.alignment == 0
        with pytest.raises(ValueError, match="read-only"):  # as views of the generic decoder
            got[5][0][0] = -1
    assert evs.open(path)[5][0][0] == recs[5][0][0]
    assert_scans_agree(path)


def test_views_outlive_close(tmp_path):
    """Every way of reading hands out views that keep the mapping alive after close().

    No rank-1 tensor here: those come from np.frombuffer, whose export would keep the
    mapping open for the others too.
    """
    path = tmp_path / "close.evs"
    record = [np.ones((2, 3)), np.array(5), np.ones((3, 2), np.float32).T]
    with evs.Writer(path) as writer:
        writer.extend([record] * 10)
    ds = evs.open(path)
    held = [ds[0], ds[1], ds[9], *ds]  # generic, then Layout.decode; the scan
    ds.close()
    for values in held:
        assert_identical(values, [np.asarray(v) for v in values])  # reads the pages
        assert_identical([v.sum() for v in values], [v.sum() for v in record])


ROW_VIEWS_AFTER_CLOSE = """
import sys
import numpy as np
import evalue_store as evs

path = sys.argv[1]
record = [np.arange(6.0).reshape(2, 3), np.ones((3, 2), np.float32).T, np.arange(4), 7]
with evs.Writer(path) as writer:
    writer.extend([record] * 20)
ds = evs.open(path)
ds[0], ds[1]  # read by the generic decoder, which learns the layout
held = [ds[i] for i in range(20)]  # (any other read's views would hold the mapping)
ds.close()
for values in held:
    for got, want in zip(values, record):
        assert np.array_equal(got, want)
"""


def test_row_views_outlive_close(tmp_path):
    """ds[i] gives a tensor as a row of an array over the whole mapping (Layout.decode's
    rows): that array must hold the mapping open as every other view does, or close()
    unmaps the pages the tensors handed out still point to (a segfault on the next read,
    so the reads run in a child process)."""
    run = subprocess.run(
        [sys.executable, "-c", ROW_VIEWS_AFTER_CLOSE, str(tmp_path / "rows.evs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_scan_of_mixed_layouts_of_one_length(tmp_path):
    """Int and Double records have the same length but different layouts."""
    path = tmp_path / "mixed.evs"
    recs = [[np.arange(4), i if i % 3 else float(i), i % 2 == 0, None] for i in range(200)]
    recs += [[]] * 20 + [[np.zeros(0), np.float64(1.5), np.array(7)]] * 20
    with evs.Writer(path) as writer:
        writer.extend(recs)
    got, error = outcome(path)
    assert error is None
    want = reference(path)
    for g, w in zip(got, want):
        assert_identical(g, w)
    assert len(got) == len(want) == len(recs)
    assert_scans_agree(path)


def test_compressed_scan_matches_plain(tmp_path):
    recs = w1_records(300)
    plain, packed = tmp_path / "p.evs", tmp_path / "z.evs.zst"
    with evs.Writer(plain) as writer:
        writer.extend(recs)
    with evs.Writer(packed, compression="zstd") as writer:
        writer.extend(recs)
    with evs.open(plain) as a, evs.open(packed) as b:
        for x, y in zip(a, b):
            assert_identical(x, y)


# ----------------------------------------------------------------------------- damage


def damaged_copy(tmp_path, recs, damage, name="bad.evs"):
    """Write ``recs``, then let ``damage(data, entries)`` edit the file's bytes."""
    path = tmp_path / name
    with evs.Writer(path) as writer:
        writer.extend(recs)
    with evs.open(path) as ds:
        entries = ds.entries().copy()
    data = bytearray(path.read_bytes())
    damage(data, entries)
    path.write_bytes(data)
    return path


def fix_crc(data, entries, i):
    """Make record i's checksums (frame header and index entry) match its payload again."""
    offset, length = int(entries[i]["offset"]), int(entries[i]["length"])
    crc = crc32c(data[offset + FRAME_SIZE : offset + FRAME_SIZE + length])  # a 1.1 file's
    struct.pack_into("<I", data, offset + 4, crc)
    index_at = data.find(struct.pack("<QQ", offset, length))
    struct.pack_into("<I", data, index_at + 16, crc)


def test_flipped_tensor_byte_fails_at_that_record(tmp_path):
    def damage(data, entries):
        data[int(entries[700]["offset"]) + 200] ^= 0x10

    path = damaged_copy(tmp_path, w1_records(1200), damage)
    got, error = outcome(path)
    assert len(got) == 700 and "record 700" in error and "checksum" in error
    assert_scans_agree(path)
    assert len(outcome(path, verify=False)[0]) == 1200


def test_frame_header_disagreeing_with_index_fails(tmp_path):
    def damage(data, entries):
        data[int(entries[40]["offset"]) + 5] ^= 1  # the frame's copy of the crc

    path = damaged_copy(tmp_path, w1_records(100), damage)
    got, error = outcome(path)
    assert len(got) == 40 and "record 40" in error
    assert_scans_agree(path)


def test_reserved_bits_in_index_entry_fail(tmp_path):
    def damage(data, entries):
        at = data.find(struct.pack("<QQ", int(entries[0]["offset"]), int(entries[0]["length"])))
        data[at + 33 * ENTRY_SIZE + 20] = 1

    path = damaged_copy(tmp_path, w1_records(100), damage)
    got, error = outcome(path)
    assert len(got) == 33 and "reserved" in error
    assert_scans_agree(path)


@pytest.mark.parametrize("verify", [True, False])
def test_bad_utf8_and_bool_with_valid_checksums_fail(tmp_path, verify):
    recs = [[np.arange(3), f"id-{i:03d}", True] for i in range(100)]

    def damage(data, entries):
        for i, patch in ((30, b"\xff"), (60, None)):
            offset, length = int(entries[i]["offset"]), int(entries[i]["length"])
            end = offset + FRAME_SIZE + length
            if patch is None:
                data[end - 1] = 2  # the Bool byte
            else:
                data[end - 4 : end - 3] = patch  # inside the string
            fix_crc(data, entries, i)

    path = damaged_copy(tmp_path, recs, damage)
    got, error = outcome(path, verify=verify)
    assert len(got) == 30 and "record 30" in error and "UTF-8" in error
    assert_scans_agree(path)


def test_structure_change_with_valid_checksum_is_read_generically(tmp_path):
    """A record whose dims differ from its run's (checksums fixed) is decoded, not skipped."""
    recs = [[np.arange(6, dtype=np.int32).reshape(2, 3), i] for i in range(50)]

    def damage(data, entries):
        offset = int(entries[25]["offset"])
        dims = data.find(struct.pack("<QQ", 2, 3), offset)
        struct.pack_into("<QQ", data, dims, 3, 2)
        fix_crc(data, entries, 25)

    path = damaged_copy(tmp_path, recs, damage)
    got, error = outcome(path)
    assert error is None and got[25][0].shape == (3, 2) and got[24][0].shape == (2, 3)
    assert_scans_agree(path)
