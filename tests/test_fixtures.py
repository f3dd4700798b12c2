"""Files written by formats 1.0 and 1.1 must keep reading the same (tools/make_fixtures.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import container

FIXTURES = Path(__file__).parent / "fixtures"


def describe(value) -> object:
    """A JSON form of a decoded value (tools/make_fixtures.py stores the expected ones)."""
    if isinstance(value, np.ndarray):
        return {
            "dtype": "bfloat16" if value.dtype == evs.BFLOAT16 else value.dtype.name,
            "shape": list(value.shape),
            "strides_c": bool(value.flags.c_contiguous),
            "hex": np.ascontiguousarray(value).tobytes().hex(),
        }
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, list):
        return [describe(v) for v in value]
    return value


FIXTURES_BY_VERSION = {
    "plain-v1.0.evs": "1.0",
    "zstd-v1.0.evs.zst": "1.0",
    "plain-v1.1.evs": "1.1",
    "zstd-v1.1.evs.zst": "1.1",
}


@pytest.mark.parametrize("name", sorted(FIXTURES_BY_VERSION))
def test_fixture_reads_as_written(name):
    version = FIXTURES_BY_VERSION[name]
    expected = json.loads((FIXTURES / f"expected-v{version}.json").read_text())
    with evs.open(FIXTURES / name) as ds:
        assert ds.header.version == version
        assert ds.metadata == {"fixture": name}
        assert ds.commit.number == 3  # creation, then two commits
        assert [[describe(v) for v in record] for record in ds] == expected
        assert ds.verify().ok


def _crc_table(poly: int) -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (poly if crc & 1 else 0)
        table.append(crc)
    return table


CRC_TABLES = {"1.0": _crc_table(0xEDB88320), "1.1": _crc_table(0x82F63B78)}


def spec_crc(version: str, data: bytes) -> int:
    """The checksum FORMAT.md section 3.1 names for ``version``, from its definition alone
    (reflected polynomial, init and final xor 0xFFFFFFFF), not from any library."""
    table, crc = CRC_TABLES[version], 0xFFFFFFFF
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_spec_crc_check_values():
    """FORMAT.md 3.1's check values, for this test's own CRCs and for the library's."""
    assert spec_crc("1.0", b"123456789") == 0xCBF43926
    assert spec_crc("1.1", b"123456789") == 0xE3069283
    assert container.crc32(b"123456789") == 0xCBF43926
    assert container.crc32c(b"123456789") == 0xE3069283
    assert spec_crc("1.1", b"") == container.crc32c(b"") == 0


@pytest.mark.parametrize("name", sorted(FIXTURES_BY_VERSION))
def test_fixture_checksums_follow_the_spec(name):
    """Every checksum field of every commit (header, footers, index segments, entries,
    frames, metadata) is the function FORMAT.md 3.1 names for the file's flags: what a
    reader written from the spec alone computes. The header's flags and minor say the
    version (§14)."""
    version = FIXTURES_BY_VERSION[name]
    with evs.open(FIXTURES / name) as ds:
        data = b"".join(bytes(chunk) for chunk in ds.logical_chunks())  # zstd -d's bytes
    minor, flags = struct.unpack_from("<HI", data, 10)
    assert (minor, flags) == ({"1.0": (0, 0), "1.1": (1, 1)}[version])
    (wlen,) = struct.unpack_from("<H", data, 48)
    crc = lambda block: spec_crc(version, block)  # noqa: E731
    assert struct.unpack_from("<I", data, 50 + wlen)[0] == crc(data[: 50 + wlen])
    footer_end = len(data)
    footers = 0
    while True:
        offset, length, stored = struct.unpack_from("<QII", data, footer_end - 24)
        assert offset + length == footer_end and stored == crc(data[offset : footer_end - 12])
        fixed = struct.unpack_from("<8s16sQQQQQII", data, offset)
        number, _, prev, meta_at, meta_len, meta_crc, n_segments = fixed[2:]
        if meta_len:
            assert meta_crc == crc(data[meta_at : meta_at + meta_len])
        for k in range(n_segments):
            seg_at, count, seg_crc, _ = struct.unpack_from("<QQII", data, offset + 72 + 24 * k)
            entries = data[seg_at : seg_at + 24 * count]
            assert seg_crc == crc(entries)
            for at, n, entry_crc, _ in struct.iter_unpack("<QQII", entries):
                magic, frame_crc, frame_len = struct.unpack_from("<4sIQ", data, at)
                payload = data[at + 16 : at + 16 + n]
                assert (magic, frame_crc, frame_len) == (b"EVR1", entry_crc, n)
                assert entry_crc == crc(payload)
        footers += 1
        if number == 1:
            break
        fixed_len = 72 + 24 * struct.unpack_from("<I", data, prev + 68)[0] + 24
        footer_end = prev + fixed_len
    assert footers == 3


@pytest.mark.parametrize("name", sorted(FIXTURES_BY_VERSION))
def test_fixture_appended_keeps_its_version(tmp_path, name):
    """FORMAT.md §14: an append keeps the file's header, so a 1.0 file stays 1.0
    with CRC-32 (and a 1.1 file 1.1), its old bytes unchanged; it verifies and recovers.
    Asking an append for the other version is refused, not ignored (README)."""
    version = FIXTURES_BY_VERSION[name]
    path = tmp_path / name
    original = (FIXTURES / name).read_bytes()
    path.write_bytes(original)
    with pytest.raises(ValueError, match="appending keeps it"):
        evs.Writer(path, "a", format_version="1.1" if version == "1.0" else "1.0")
    assert path.read_bytes() == original
    with evs.Writer(path, "a") as w:
        assert w.format_version == version
        w.append([np.arange(3), "appended"])
    assert evs.recover(path).salvaged_records == 0
    with evs.open(path) as ds:
        assert ds.header.version == version
        assert ds.header.checksum is (container.crc32 if version == "1.0" else container.crc32c)
        assert len(ds) == 25 and ds[24][1] == "appended"
        assert ds.verify().ok
    if not name.endswith(".zst"):  # a compressed file's last frames are rewritten
        assert path.read_bytes()[: len(original)] == original
