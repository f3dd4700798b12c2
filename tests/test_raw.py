"""Raw record copies: Dataset.raw and Writer.append_raw keep records exactly as stored."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evalue_store as evs
from evalue_store.codec import realign_payload

# Records whose kinds decoding cannot show: empty typed lists, a ListOptionalTensor without
# a None, a channels-last tensor, bytes vs str, bfloat16.
RECORDS = [
    [evs.ListTensor([]), evs.ListBool([]), evs.ListDouble([]), evs.ListInt([])],
    [
        evs.ListOptionalTensor([np.arange(3)]),
        np.ones((2, 3, 4, 5), np.float32).transpose(0, 2, 3, 1),
    ],
    [b"bytes", "text", None, True, 2.5, -7, np.zeros(0), np.array(3, np.uint16)],
    [np.arange(4, dtype=np.uint16).view(evs.BFLOAT16), [1.0, 2.0], [True], [1, 2, 3]],
    [np.arange(100_000, dtype=np.int64)],  # a tensor big enough to be written from the caller
]


def write(path, records, **options):
    with evs.Writer(path, **options) as w:
        w.extend(records)


def payloads(path) -> list[bytes]:
    with evs.open(path) as ds:
        return [bytes(ds.raw(i)) for i in range(len(ds))]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_raw_copy_is_byte_exact(tmp_path, compression):
    src, dst = tmp_path / "src.evs", tmp_path / "dst.evs"
    write(src, RECORDS, compression=compression)
    with evs.open(src) as ds, evs.Writer(dst) as w:
        for i in range(len(ds)):
            assert w.append_raw(ds.raw(i), ds.alignment) == i
    assert payloads(dst) == payloads(src)
    with evs.open(dst) as ds:
        assert ds.verify().ok


def test_decoding_loses_what_raw_copies_keep(tmp_path):
    """The reason for raw copies: re-encoding a decoded empty ListTensor stores a ListInt."""
    src, decoded = tmp_path / "src.evs", tmp_path / "decoded.evs"
    write(src, RECORDS[:1])
    with evs.open(src) as ds:
        write(decoded, list(ds))
    assert payloads(decoded) != payloads(src)


@pytest.mark.parametrize(("source", "target"), [(64, 8), (8, 4096), (4096, 64), (16, 16)])
def test_realigned_copies_decode_the_same_and_round_trip(tmp_path, source, target):
    src, dst = tmp_path / "src.evs", tmp_path / "dst.evs"
    write(src, RECORDS, alignment=source)
    with evs.open(src) as ds, evs.Writer(dst, alignment=target) as w:
        for i in range(len(ds)):
            w.append_raw(ds.raw(i), ds.alignment)
    with evs.open(src) as a, evs.open(dst) as b:
        assert b.verify().ok
        for i in range(len(a)):
            assert_same_values(a[i], b[i])
            back = realign_payload(b.raw(i), target, source)  # the way back is exact
            assert bytes(back) == bytes(a.raw(i))
            for value in b[i]:
                if isinstance(value, np.ndarray) and value.size:
                    assert value.ctypes.data % target == 0


def assert_same_values(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is type(w)
        if isinstance(w, np.ndarray):
            assert (g.dtype, g.shape, g.strides) == (w.dtype, w.shape, w.strides)
            assert g.tobytes() == w.tobytes()
        elif isinstance(w, list):
            assert_same_values(g, w)
        else:
            assert g == w


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.integers(-(2**63), 2**63 - 1),
            st.text(max_size=5),
            st.lists(st.integers(0, 3), max_size=3).map(lambda s: np.zeros(s, np.int32)),
            st.lists(st.integers(0, 4), max_size=2).map(
                lambda sizes: evs.ListTensor([np.ones(k, np.float64) for k in sizes])
            ),
        ),
        max_size=5,
    ),
    st.sampled_from([8, 64, 256]),
)
def test_append_raw_round_trips(tmp_path, record, alignment):
    src = tmp_path / "one.evs"
    write(src, [record], alignment=alignment)
    with evs.open(src) as ds:
        payload = bytes(ds.raw(0))
    for target in (8, 64, 256):
        dst = tmp_path / f"to{target}.evs"
        with evs.Writer(dst, alignment=target) as w:
            w.append_raw(payload, alignment)
        with evs.open(dst) as ds:
            assert bytes(realign_payload(ds.raw(0), target, alignment)) == payload


def test_append_raw_refuses_malformed_payloads_and_writes_nothing(tmp_path):
    src = tmp_path / "src.evs"
    write(src, [[np.arange(8), "id", 3]])
    with evs.open(src) as ds:
        good = bytes(ds.raw(0))
    bad = {
        "truncated": good[:-3],
        "trailing": good + b"\0",
        "unknown tag": good[:4] + b"\x0a" + good[5:],
        "empty": b"",
    }
    dst = tmp_path / "dst.evs"
    with evs.Writer(dst) as w:
        for name, payload in bad.items():
            with pytest.raises(evs.FormatError):
                w.append_raw(payload)
            assert len(w) == 0, name
        with pytest.raises(ValueError, match="alignment"):
            w.append_raw(good, alignment=48)
        tensor_padding = 4 + 4 + 8  # after the count; tag, dtype, rank, flags; one dim
        dirty = good[:tensor_padding] + b"\x01" + good[tensor_padding + 1 :]
        with pytest.raises(evs.FormatError, match="non-zero bytes in the padding"):
            w.append_raw(dirty)
        assert len(w) == 0
        w.append_raw(good)
    with evs.open(dst) as ds:
        assert len(ds) == 1 and ds.verify().ok


def test_a_payload_for_another_alignment_is_refused_not_misread(tmp_path):
    """Given without its alignment, a payload encoded for 8 would put tensor data where a
    64-aligned reader expects padding: the zero-padding rule refuses it."""
    src = tmp_path / "eight.evs"
    write(src, [[np.arange(1, 33, dtype=np.uint8), b"tail"]], alignment=8)
    with evs.open(src) as ds:
        payload = bytes(ds.raw(0))
    with evs.Writer(tmp_path / "sixty-four.evs") as w:
        with pytest.raises(evs.FormatError):
            w.append_raw(payload)
        w.append_raw(payload, alignment=8)  # said: re-padded
    with evs.open(tmp_path / "sixty-four.evs") as ds:
        assert ds[0][0].tolist() == list(range(1, 33)) and ds[0][1] == b"tail"


def test_raw_checks_the_record_checksum(tmp_path):
    src = tmp_path / "src.evs"
    write(src, [[np.arange(64, dtype=np.int64)]])
    with evs.open(src) as ds:
        offset = int(ds.entries()[0]["offset"])
    data = bytearray(src.read_bytes())
    data[offset + 200] ^= 0xFF  # a byte of the tensor data
    src.write_bytes(bytes(data))
    with evs.open(src) as ds:
        with pytest.raises(evs.FormatError, match="record 0: record checksum mismatch"):
            ds.raw(0)
    with evs.open(src, verify=False) as ds:
        assert len(ds.raw(0)) == int(ds.entries()[0]["length"])  # unchecked, as documented


def test_raw_is_read_only_and_indexes_like_getitem(tmp_path):
    src = tmp_path / "src.evs"
    write(src, [[1], [2], [3]])
    with evs.open(src) as ds:
        view = ds.raw(-1)
        assert view.readonly
        assert bytes(view) == bytes(ds.raw(2))
        with pytest.raises(IndexError):
            ds.raw(3)


@pytest.mark.parametrize("command", ["merge", "compress"])
def test_cli_copies_are_exact(tmp_path, command):
    a, b, out = tmp_path / "a.evs", tmp_path / "b.evs", tmp_path / "out.evs"
    write(a, RECORDS[:2])
    write(b, RECORDS[2:], alignment=128)
    inputs = [str(a), str(b)] if command == "merge" else [str(a)]
    proc = subprocess.run(
        [sys.executable, "-m", "evalue_store", command, *inputs, "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    with evs.open(out) as ds:
        assert ds.verify().ok
        if command == "compress":
            assert ds.compressed
    assert payloads(out)[:2] == payloads(a)
    if command == "merge":  # b's records, re-padded from 128 to 64
        copies = payloads(out)[2:]
        assert [bytes(realign_payload(p, 64, 128)) for p in copies] == payloads(b)
