"""Black-box attacks on the metadata rules of docs/FORMAT.md section 7."""

from __future__ import annotations

import struct
import zlib

import pytest

import evalue_store as evs

BIG = 10**400  # an integer JSON number far beyond the largest double (~1.8e308)


def test_writer_refuses_an_integer_too_large_for_a_double(tmp_path):
    """FORMAT.md §7 rule 2: "The JSON is strict: no NaN, Infinity or -Infinity; no number
    beyond a double's range (1e999, an integer of 400 digits) ... A writer MUST refuse other
    metadata."

    `{"a": 10**400}` is written without a word (and read back as a Python int)."""
    with pytest.raises(evs.EncodeError):
        evs.Writer(tmp_path / "m.evs", "w", metadata={"a": BIG}).close()


def _patch_metadata(path, old: bytes, new: bytes) -> None:
    """Replace `old` by `new` (same length) in the metadata block, re-signing its crc32 in
    the footer and the footer's own crc32 (FORMAT.md section 8)."""
    data = bytearray(path.read_bytes())
    footer_offset, footer_length, _ = struct.unpack_from("<QII", data, len(data) - 24)
    md_off, md_len, _ = struct.unpack_from("<QQI", data, footer_offset + 48)
    block = bytes(data[md_off : md_off + md_len])
    assert block.count(old) == 1 and len(old) == len(new)
    block = block.replace(old, new)
    data[md_off : md_off + md_len] = block
    struct.pack_into("<I", data, footer_offset + 64, zlib.crc32(block))
    crc_at = footer_offset + footer_length - 12  # footer_crc: after footer_offset, footer_length
    struct.pack_into("<I", data, crc_at, zlib.crc32(bytes(data[footer_offset:crc_at])))
    path.write_bytes(bytes(data))


def test_reader_rejects_an_integer_too_large_for_a_double(tmp_path):
    """FORMAT.md §7 rule 2: "A reader MUST reject, when it reads the metadata, a block ... that
    is ... not strict JSON" (no NaN, Infinity, number beyond a double, lone surrogate).
    Metadata holding the number 10**400 is returned as it is, and verify() calls it OK."""
    path = tmp_path / "m.evs"
    digits = str(BIG).encode()
    placeholder = "X" * (len(digits) - 2)
    # format 1.0: the footer layout and zlib CRC-32 the patch below re-signs with
    evs.Writer(path, "w", metadata={"a": placeholder}, format_version="1.0").close()
    _patch_metadata(path, b'"' + placeholder.encode() + b'"', digits)
    ds = evs.open(path)
    assert ds.verify().ok is False, "verify() found nothing wrong with out-of-range metadata"
    with pytest.raises(evs.FormatError):
        _ = ds.metadata
