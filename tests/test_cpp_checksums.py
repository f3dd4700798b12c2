"""Format 1.1 (docs/FORMAT.md section 3.1) in the C++ reader: header flag bit 0 makes every
checksum of the file CRC-32C, chosen from the flag alone; files of both versions read as
the Python reader reads them."""

from __future__ import annotations

import struct

import pytest

import evalue_store as evs
from tests import native
from tests.cpp_compare import assert_same, cpp_dump, variants
from tests.test_cpp import every_kind_records
from tests.test_damage import record


@pytest.fixture(scope="module")
def asan():
    return native.build("asan")


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C in plain Python (docs/FORMAT.md section 3.1), independent of the C++ code."""
    c = 0xFFFFFFFF
    for byte in data:
        c = _CRC32C[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def as_crc32c(data: bytes) -> bytes:
    """A 1.0 file re-signed as format 1.1: flag bit 0, minor 1, and every checksum field
    (header, frames, index entries, segments, metadata, every footer) CRC-32C."""
    from evalue_store.container import (
        ENTRY,
        FOOTER_FIXED,
        SEGMENT,
        find_last_commit,
        parse_footer_from,
        parse_header,
    )

    out = bytearray(data)

    def read(offset, n):
        return data[offset : offset + n]

    header = parse_header(read, len(data))
    commits = [find_last_commit(read, len(data), header)]
    while commits[-1].prev_footer:
        commits.append(parse_footer_from(read, commits[-1].prev_footer, len(data), header))
    struct.pack_into("<HI", out, 10, 1, 1)  # minor 1, flags 0x1
    crc_at = header.length - 4
    struct.pack_into("<I", out, crc_at, crc32c(bytes(out[:crc_at])))
    for commit in commits:
        for k, seg in enumerate(commit.segments):
            for j in range(seg.count):
                at = seg.offset + j * ENTRY.size
                offset, length, _, reserved = ENTRY.unpack_from(out, at)
                crc = crc32c(bytes(out[offset + 16 : offset + 16 + length]))
                struct.pack_into("<I", out, offset + 4, crc)
                ENTRY.pack_into(out, at, offset, length, crc, reserved)
            entries = bytes(out[seg.offset : seg.offset + seg.count * ENTRY.size])
            seg_at = commit.footer_offset + FOOTER_FIXED.size + k * SEGMENT.size
            struct.pack_into("<I", out, seg_at + 16, crc32c(entries))
        if commit.metadata_length:
            meta = bytes(
                out[commit.metadata_offset : commit.metadata_offset + commit.metadata_length]
            )
            struct.pack_into("<I", out, commit.footer_offset + 64, crc32c(meta))
        body = bytes(out[commit.footer_offset : commit.end - 12])
        struct.pack_into("<I", out, commit.end - 12, crc32c(body))
    return bytes(out)


def build_v10(path) -> None:
    """tests/test_damage.py's file (commits of 3, 2 and 4 records), written as format 1.0."""
    n = 0
    with evs.Writer(path, metadata={"k": "v"}, format_version="1.0") as w:
        for size in (3, 2, 4):
            for _ in range(size):
                w.append(record(n))
                n += 1
            w.commit()


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_files_the_python_writer_makes_in_either_version_read_the_same(asan, tmp_path, version):
    path = tmp_path / f"kinds-{version}.evs"
    with evs.Writer(path, format_version=version, metadata={"v": version}) as w:
        w.extend(every_kind_records())
    (doc,) = assert_same(asan, [path])
    assert doc["checksum"] == {"1.0": "crc32", "1.1": "crc32c"}[version]


def test_format_1_1_crc32c_files_read_like_their_1_0_originals(asan, tmp_path):
    """A 1.1 file (every checksum CRC-32C) holds the same values as the 1.0 file it was
    re-signed from; the C++ reader picks the function from flag bit 0 alone; a 1.0 file
    claiming the flag, and a 1.1 file with a flipped payload bit, are refused."""
    original = tmp_path / "v10.evs"
    build_v10(original)
    signed = as_crc32c(original.read_bytes())
    v11 = tmp_path / "v11.evs"
    v11.write_bytes(signed)
    (want,), (got,) = cpp_dump(asan, [original]), cpp_dump(asan, [v11])
    assert got["open"] == "ok" and got["records"] == 9 and got["commit"] == 4
    assert (want["checksum"], got["checksum"]) == ("crc32", "crc32c")
    assert got["values"] == want["values"] and got["metadata"] == want["metadata"]
    assert got["scan"] == {"count": 9, "error": None}
    flag_only = bytearray(original.read_bytes())
    struct.pack_into("<HI", flag_only, 10, 1, 1)  # the flag without re-signing
    minor_only = bytearray(signed)
    struct.pack_into("<H", minor_only, 10, 0)  # minor 0 with the flag: the flag decides
    crc_at = struct.unpack_from("<I", minor_only, 20)[0] - 4
    struct.pack_into("<I", minor_only, crc_at, crc32c(bytes(minor_only[:crc_at])))
    with evs.open(original) as ds:
        payload_at = int(ds.entries()["offset"][4]) + 20
    flipped = bytearray(signed)
    flipped[payload_at] ^= 4
    unknown = bytearray(signed)
    struct.pack_into("<I", unknown, 12, 3)
    paths = variants(tmp_path, "v11", [flag_only, minor_only, flipped, unknown])
    docs = assert_same(asan, [v11, *paths])[1:]  # the Python reader agrees on all of them
    assert "header checksum" in docs[0]["open"]["error"]
    assert docs[1]["values"] == want["values"]
    assert "checksum mismatch (record 4" in docs[2]["values"][4]["error"]
    assert docs[2]["values"][3] == want["values"][3]
    assert "unknown header flags" in docs[3]["open"]["error"]
