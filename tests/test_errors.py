"""One error family with fields: callers never parse messages (docs: errors.py)."""

from __future__ import annotations

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.physical.zstd import MAX_DICT_SIZE


def make(path, compression=None) -> None:
    with evs.Writer(path, compression=compression) as w:
        w.extend([np.full(64, i, np.int64), f"r{i}"] for i in range(4))


def test_every_error_is_in_the_family():
    for cls in (evs.FormatError, evs.EncodeError, evs.WriterLockedError, evs.ClosedError):
        assert issubclass(cls, evs.Error)
    for cls in (evs.FormatError, evs.EncodeError, evs.ClosedError):
        assert issubclass(cls, ValueError)  # as before: code catching ValueError still works


def test_a_damaged_record_names_itself_in_fields(tmp_path):
    path = tmp_path / "d.evs"
    make(path)
    with evs.open(path) as ds:
        offset = int(ds.entries()["offset"][2])
    data = bytearray(path.read_bytes())
    data[offset + 40] ^= 1
    path.write_bytes(bytes(data))
    with evs.open(path) as ds:
        with pytest.raises(evs.FormatError) as caught:
            ds[2]
        report = ds.verify()
    exc = caught.value
    assert (exc.record, exc.code, exc.detail, exc.offset, exc.offset_in) == (
        2,
        "checksum",
        "record checksum mismatch",
        offset,
        "file",
    )
    assert exc.reason == "record 2: record checksum mismatch" and str(path) == exc.path
    assert report.bad_records == [(2, "record checksum mismatch")]  # named beside it


def test_offsets_of_a_compressed_files_records_count_container_bytes(tmp_path):
    path = tmp_path / "d.evs.zst"
    make(path, "zstd")
    with evs.open(path, max_record_bytes=16) as ds:
        offset = int(ds.entries()["offset"][1])
        with pytest.raises(evs.FormatError) as caught:
            ds[1]
    exc = caught.value
    assert (exc.record, exc.code, exc.offset, exc.offset_in) == (1, "limit", offset, "container")
    assert f"logical offset {offset}" in str(exc)


def test_closed_writers_and_datasets_raise_closed_error(tmp_path):
    path = tmp_path / "d.evs"
    w = evs.Writer(path)
    w.close()
    with pytest.raises(evs.ClosedError, match="writer is closed"):
        w.append([1])
    ds = evs.open(path)
    ds.close()
    with pytest.raises(evs.ClosedError, match="dataset is closed"):
        ds[0]


def test_shard_manifest_problems_have_their_own_code(tmp_path):
    import json

    with evs.ShardWriter(tmp_path / "s-{:02d}.evs", max_records=2) as sw:
        sw.extend([np.arange(3), i] for i in range(5))
    manifest = tmp_path / "s.manifest.json"
    doc = json.loads(manifest.read_text())
    doc["records"] += 1
    manifest.write_text(json.dumps(doc))
    with pytest.raises(evs.FormatError) as info:
        evs.open_shards(manifest)
    assert info.value.code == "manifest" and info.value.path == str(manifest)
    manifest.write_text("{not json")
    with pytest.raises(evs.FormatError) as info:
        evs.open_shards(manifest)
    assert info.value.code == "manifest"


def test_java_bytes_name_the_kind_of_problem():
    from evalue_store import java

    whole = java.dumps_record([np.arange(4, dtype=np.float32), 7])
    with pytest.raises(evs.FormatError) as info:
        java.loads_record(whole[:-3])
    assert info.value.code == "truncated"
    with pytest.raises(evs.FormatError) as info:
        java.loads(b"")
    assert info.value.code == "truncated"
    tensor = bytearray(java.dumps(np.zeros((1,), np.float32)))
    tensor[2] = 200  # the rank byte: Java reads it as negative, we cap it at MAX_RANK
    with pytest.raises(evs.FormatError) as info:
        java.loads(bytes(tensor))
    assert info.value.code == "limit"


def test_a_fifo_is_not_a_container(tmp_path):
    import os

    fifo = tmp_path / "pipe.evs"
    os.mkfifo(fifo)
    with pytest.raises(evs.FormatError) as info:
        evs.open(fifo)
    assert info.value.code == "not-a-container"


def test_argument_values_a_call_refuses_are_usage_errors(tmp_path):
    """README: an argument value a call refuses raises evs.UsageError (an evs.Error and a
    ValueError) naming it, so that `except evs.Error` catches every refusal."""
    path = tmp_path / "u.evs"
    make(path)
    big = bytes(MAX_DICT_SIZE + 1)
    refusals = {
        "mode": lambda: evs.Writer(tmp_path / "m.evs", mode="r"),
        "format version": lambda: evs.Writer(tmp_path / "v.evs", format_version="9.9"),
        "alignment": lambda: evs.Writer(tmp_path / "a.evs", alignment=12),
        "backend": lambda: evs.open(path, backend="disk"),
        "max_open": lambda: evs.open_shards([path], max_open=0),
        "max_records": lambda: evs.ShardWriter(tmp_path / "s-{:03d}.evs", max_records=0),
        "pattern": lambda: evs.ShardWriter(tmp_path / "s.evs"),
        "dictionary": lambda: evs.Writer(tmp_path / "d.evs", compression="zstd", dictionary=big),
        "samples": lambda: evs.train_dictionary([[np.arange(3)]] * 2),
        "strings": lambda: evs.java.loads(b"", strings="text"),
    }
    for what, call in refusals.items():
        with pytest.raises(evs.UsageError) as caught:
            call()
        assert isinstance(caught.value, evs.Error) and isinstance(caught.value, ValueError), what
    assert not list(tmp_path.glob("[mvads]*.evs")), "a refused call left a file"
