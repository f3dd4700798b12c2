"""Each kind of damage has its own FormatError.code (errors.py lists them): a caller tells
problems apart by the code, never by the message. One damaged file per code; the
assertions name the code (and where known the record), not the text."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import container
from evalue_store.byteio import FdReader
from evalue_store.physical import seekable

FIXTURES = Path(__file__).parent / "fixtures"


def records(n: int = 4) -> list:
    return [[np.full(8, i, np.int64), True, f"r{i}"] for i in range(n)]


def make(path: Path, **options) -> Path:
    with evs.Writer(path, **options) as w:
        w.extend(records())
    return path


def patched(path: Path, at: int, data: bytes) -> Path:
    out = path.with_name("damaged-" + path.name)
    raw = bytearray(path.read_bytes())
    raw[at : at + len(data)] = data
    out.write_bytes(bytes(raw))
    return out


def code(action) -> str:
    with pytest.raises(evs.FormatError) as info:
        action()
    return info.value.code


def refooter(path: Path, out: Path, metadata: bytes | None = None, **changes) -> Path:
    """A copy of ``path`` whose last footer says ``changes`` (and, with ``metadata``, holds
    that metadata block instead), every checksum right: only the rule under test breaks."""
    with evs.open(path) as ds:
        header, commit = ds.header, ds.commit
    raw = bytearray(path.read_bytes())
    if metadata is not None:
        assert len(metadata) <= commit.metadata_length
        raw[commit.metadata_offset : commit.metadata_offset + len(metadata)] = metadata
        changes.update(metadata_length=len(metadata), metadata_crc=header.checksum(metadata))
    new = dataclasses.replace(commit, **changes)
    raw[commit.footer_offset :] = container.encode_footer(
        commit.footer_offset, header.file_id, new, header.checksum
    )
    out.write_bytes(bytes(raw))
    return out


# ---------------------------------------------------------------------------- the header


def test_header_damage_codes(tmp_path):
    path = make(tmp_path / "h.evs")
    assert code(lambda: evs.open(patched(path, 0, b"\x00"))) == "not-a-container"
    cut = tmp_path / "cut.evs"
    cut.write_bytes(path.read_bytes()[:20])
    assert code(lambda: evs.open(cut)) == "truncated"
    assert code(lambda: evs.open(patched(path, 8, b"\x02"))) == "unsupported"  # major 2
    assert code(lambda: evs.open(patched(path, 16, b"\x0c"))) == "header"  # alignment 12
    assert code(lambda: evs.open(patched(path, 55, b"\xff"))) == "checksum"  # writer info


# ---------------------------------------------------------------------------- commits, index


def test_commit_index_and_bounds_codes(tmp_path):
    path = make(tmp_path / "c.evs")
    with evs.open(path) as ds:
        commit, segment = ds.commit, ds._segments[0]
        second = int(ds.entries()["offset"][1])
    bad_chain = refooter(path, tmp_path / "chain.evs", prev_footer=commit.footer_offset + 8)
    assert code(lambda: evs.open(bad_chain)) == "commit"
    reserved = patched(path, segment.offset + container.ENTRY_SIZE + 20, b"\x01")
    with evs.open(reserved) as ds:
        with pytest.raises(evs.FormatError) as info:
            ds[1]
    assert (info.value.code, info.value.record) == ("index", 1)
    far = (1 << 40).to_bytes(8, "little")
    past_end = patched(path, segment.offset + container.ENTRY_SIZE, far)  # entry 1's offset
    with evs.open(past_end) as ds:
        assert code(lambda: ds[1]) == "out-of-bounds"
    no_frame = patched(path, second, b"XXXX")  # the entry points at no record frame
    with evs.open(no_frame, verify=False) as ds:
        assert code(lambda: ds[1]) == "index"


# ---------------------------------------------------------------------------- records, metadata


def test_value_grammar_damage_is_a_value_code(tmp_path):
    path = make(tmp_path / "v.evs")
    with evs.open(path) as ds:
        at = int(ds.entries()["offset"][2]) + container.FRAME_SIZE
        bool_byte = at + bytes(ds.raw(2)).index(b"\x05\x01") + 1  # the Bool tag, its byte
    with evs.open(patched(path, bool_byte, b"\x02"), verify=False) as ds:
        with pytest.raises(evs.FormatError) as info:
            ds[2]
    assert (info.value.code, info.value.record) == ("value", 2)


def test_metadata_and_field_name_codes(tmp_path):
    path = tmp_path / "m.evs"
    with evs.Writer(path, metadata={"evalue_store.fields": ["a", "b", "c"]}) as w:
        w.extend(records())
    not_object = refooter(path, tmp_path / "meta.evs", metadata=b"[1, 2]")
    with evs.open(not_object) as ds:
        assert code(lambda: ds.metadata) == "metadata"
    two_names = refooter(path, tmp_path / "fields.evs", b'{"evalue_store.fields": ["a", "b"]}')
    with evs.open(two_names, as_dict=True) as ds:
        assert code(lambda: ds[0]) == "fields"
    with evs.open(two_names) as ds:
        assert code(lambda: ds.get_batch([0, 1])) == "fields"


# ---------------------------------------------------------------------------- compressed files


def test_compressed_file_damage_codes(tmp_path):
    path = make(tmp_path / "z.evs.zst", compression="zstd")
    with evs.open(path) as ds:
        block = ds._source.block
    assert code(lambda: evs.open(patched(path, 8, b"\x00"))) == "layout"  # layout frame tag
    assert code(lambda: evs.open(patched(path, 12, b"\x09"))) == "unsupported"  # its version
    damaged = patched(path, block.first.physical + 40, b"\xff\xff")  # inside a data frame
    assert code(lambda: [evs.open(damaged)[i] for i in range(4)]) == "frame"


def test_unusable_dictionary_code(tmp_path):
    dictionary = evs.train_dictionary(records(400), size=2048)
    path = make(tmp_path / "d.evs.zst", compression="zstd", dictionary=dictionary)
    at = path.read_bytes().index(dictionary[:16])
    assert code(lambda: evs.open(patched(path, at + 8, b"\xff" * 8))) == "dictionary"


def test_layout_1_seek_table_damage_code(tmp_path):
    """A layout-1 file's seek table (here the one the fixture ends with, read by the
    seekable primitives) with a reserved descriptor bit set."""
    path = tmp_path / "l1.evs.zst"
    shutil.copy(FIXTURES / "zstd-v1.0.evs.zst", path)
    size = path.stat().st_size
    damaged = patched(path, size - 5, b"\x7c")  # Seek_Table_Descriptor: reserved bits
    with open(damaged, "rb") as f:
        reader = FdReader(f.fileno(), size)
        assert code(lambda: seekable.read_seek_table(reader, size)) == "seek-table"
