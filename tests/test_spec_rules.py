"""The rules docs/FORMAT.md and docs/FRAMES.md settle (issue 12, item 6), on files built byte
by byte: every reader path agrees, and verify agrees with the readers."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.codec import MAX_VALUES, decode_payload, encode_record
from evalue_store.container import (
    ENTRY,
    FLAG_CRC32C,
    FRAME,
    FRAME_MAGIC,
    Commit,
    Segment,
    align_up,
    checksum_function,
    crc32c,
    encode_footer,
    encode_header,
)
from evalue_store.physical.seekable import EMPTY_CHECKSUM, encode_seek_table, new_compressor

FILE_ID = bytes(range(16))


def container(payloads, alignment=64, crc_of=None, flags=FLAG_CRC32C, **footer) -> bytes:
    """A plain container with one commit holding ``payloads``, of the format ``flags`` name
    (1.1 by default); ``crc_of(payload)`` is the checksum written in frame and index (the
    file's function by default); ``footer`` overrides fields of the commit."""
    checksum = checksum_function(flags)
    crc_of = crc_of or checksum
    data = bytearray(encode_header(alignment, FILE_ID, 0, "test", flags))
    entries = bytearray()
    for payload in payloads:
        data += bytes(align_up(len(data), alignment) - len(data))
        crc = crc_of(payload)
        entries += ENTRY.pack(len(data), len(payload), crc, 0)
        data += FRAME.pack(FRAME_MAGIC, crc, len(payload)) + payload
    data += bytes(align_up(len(data), alignment) - len(data))
    segment = Segment(len(data), len(payloads), checksum(entries), 0)
    data += entries
    data += bytes(align_up(len(data), alignment) - len(data))
    commit = Commit(1, len(payloads), len(data), 0, 0, 0, 0, 0, (segment,))
    commit = replace(commit, **footer)
    return bytes(data + encode_footer(commit.footer_offset, FILE_ID, commit, checksum))


def payload_of(values, alignment=64) -> bytearray:
    chunks, length, _ = encode_record(values, alignment, crc32c)
    return bytearray(b"".join(bytes(c) for c in chunks)[16 : 16 + length])


def compressed(plain: bytes, *extra_frames: bytes) -> bytes:
    """``plain`` as one zstd frame, then ``extra_frames`` (skippable), then a seek table."""
    frame = new_compressor().compress(plain)
    frames = [frame, *extra_frames]
    sizes = [len(f) for f in frames]
    dsizes = [len(plain)] + [0] * len(extra_frames)
    sums = [int.from_bytes(frame[-4:], "little")] + [EMPTY_CHECKSUM] * len(extra_frames)
    return b"".join(frames) + encode_seek_table(sizes, dsizes, sums)


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_non_zero_tensor_padding_is_rejected_by_every_read_path(tmp_path, backend):
    """FORMAT.md §5 rule 3: readers reject non-zero padding before tensor data, on every
    path (a single read, the learned layout, the scan's run decoder, verify, append_raw),
    though the payload CRC is right. verify used to pass what append_raw rejected."""
    good = payload_of([np.arange(3, dtype=np.int32), 7])
    bad = bytearray(good)
    assert bad[20] == 0  # payload offset 20 is frame offset 36: padding up to 64
    bad[20] = 1
    path = tmp_path / "pad.evs"
    path.write_bytes(container([good, good, bad, good]))
    with evs.open(path, backend=backend) as ds:
        assert ds[1][1] == 7 and ds[0][1] == 7  # the second read learns the layout
        with pytest.raises(evs.FormatError, match="padding"):
            ds[2]
        with pytest.raises(evs.FormatError, match="padding"):
            list(ds)
        report = ds.verify()
        assert [i for i, _ in report.bad_records] == [2]
        raw = bytes(ds.raw(2))
    with pytest.raises(evs.FormatError, match="padding"):
        decode_payload(bytes(16) + bad, 0, len(bad), 64)
    with evs.Writer(tmp_path / "copy.evs") as w, pytest.raises(evs.FormatError, match="padding"):
        w.append_raw(raw, 64)


def test_values_per_record_at_most_2_20(tmp_path):
    """FORMAT.md §4: a record holds at most 2^20 values, for writers and readers."""
    chunks, length, _ = encode_record([None] * MAX_VALUES, 64, crc32c)
    frame = b"".join(bytes(c) for c in chunks)
    assert len(decode_payload(frame, 0, length, 64)) == MAX_VALUES
    with pytest.raises(evs.EncodeError):
        encode_record([None] * (MAX_VALUES + 1), 64, crc32c)
    over = struct.pack("<I", MAX_VALUES + 1) + bytes(MAX_VALUES + 1)  # that many Nones
    with pytest.raises(evs.FormatError, match="over the limit"):
        decode_payload(bytes(16) + over, 0, len(over), 64)
    path = tmp_path / "many.evs"
    path.write_bytes(container([bytearray(over)]))
    with evs.open(path) as ds:
        with pytest.raises(evs.FormatError, match="over the limit"):
            ds[0]
        assert [i for i, _ in ds.verify().bad_records] == [0]


def test_no_metadata_has_one_encoding(tmp_path):
    """FORMAT.md §8: metadata_length 0 means no metadata, and then metadata_offset and
    metadata_crc are 0; an empty block at an aligned offset used to be accepted."""
    path = tmp_path / "m.evs"
    path.write_bytes(container([payload_of([1])]))
    with evs.open(path) as ds:
        assert ds.metadata == {} and ds.verify().ok
    for fields in ({"metadata_offset": 128}, {"metadata_crc": 5}):
        path.write_bytes(container([payload_of([1])], **fields))
        with pytest.raises(evs.FormatError, match="no metadata"):
            evs.open(path)


def test_commit_numbering(tmp_path):
    """FORMAT.md §8 rule 2: commit 1 and only commit 1 has no previous footer."""
    path = tmp_path / "n.evs"
    for fields in ({"number": 0}, {"number": 3}):
        path.write_bytes(container([payload_of([1])], **fields))
        with pytest.raises(evs.FormatError, match="only commit 1"):
            evs.open(path)
    with evs.Writer(path, mode="w") as w:
        w.append([1])
    with evs.open(path) as ds:
        commit = ds.commit
        assert commit.number == 2 and commit.prev_footer
    data = bytearray(path.read_bytes())
    del data[commit.footer_offset :]
    footer = encode_footer(
        commit.footer_offset, ds.header.file_id, replace(commit, prev_footer=0), ds.header.checksum
    )
    data += footer
    path.write_bytes(data)
    with pytest.raises(evs.FormatError, match="only commit 1"):
        evs.open(path)


def test_a_wrong_payload_crc_fails_verify_in_both_variants(tmp_path):
    """FRAMES.md §9 rule 2: a compressed reader may skip the payload CRC on reads (the
    frames' content checksums cover the same bytes; only a faulty writer stores a wrong
    CRC), and a verifier checks it in both variants."""
    plain = container([payload_of([1]), payload_of([2])], crc_of=lambda p: crc32c(p) ^ 1)
    (tmp_path / "c.evs").write_bytes(plain)
    (tmp_path / "c.evs.zst").write_bytes(compressed(plain))
    with evs.open(tmp_path / "c.evs") as ds:
        with pytest.raises(evs.FormatError, match="checksum"):
            ds[0]
        assert len(ds.verify().bad_records) == 2
    with evs.open(tmp_path / "c.evs.zst") as ds:
        assert ds[0] == [1] and [r for r in ds] == [[1], [2]]
        assert len(ds.verify().bad_records) == 2
    for name in ("c.evs", "c.evs.zst"):
        with evs.open(tmp_path / name, verify=False) as ds:
            assert ds[1] == [2]


def test_foreign_skippable_frames_are_read_and_verified(tmp_path):
    """FRAMES.md §12 rule 1: a skippable frame with a magic other than the seek table's is
    skipped by readers and passes verify (it used to be "earlier seek table damaged")."""
    plain = container([payload_of([np.arange(4), "x"])])
    for magic in (0x184D2A50, 0x184D2A5F):
        foreign = struct.pack("<II", magic, 5) + b"hello"
        path = tmp_path / "f.evs.zst"
        path.write_bytes(compressed(plain, foreign))
        with evs.open(path) as ds:
            assert ds[0][1] == "x"
            report = ds.verify()
            assert report.ok, report
    # a frame with the seek table's magic is an earlier seek table, and checked as one
    fake = struct.pack("<II", 0x184D2A5E, 5) + b"hello"
    path.write_bytes(compressed(plain, fake))
    with evs.open(path) as ds:
        assert ds[0][1] == "x"
        assert ds.verify().problems == ["earlier seek table (frame 1) is damaged"]


def test_append_refuses_frames_over_the_reader_cap(tmp_path):
    """FRAMES.md §3 rule 2 and §7 rule 4: one frame cap (64 MiB) for readers and appending
    writers (append mode used to take frames of up to 1 GiB, which the default reader
    refuses)."""
    tensor = payload_of([np.zeros(65 << 20, np.uint8)])
    path = tmp_path / "big.evs.zst"
    path.write_bytes(compressed(container([tensor])))
    del tensor
    with pytest.raises(evs.FormatError, match="max_frame_size"):
        evs.open(path)
    with evs.open(path, max_frame_size=128 << 20) as ds:
        assert ds[0][0].nbytes == 65 << 20
    before = path.read_bytes()
    for attempt in (lambda: evs.Writer(path, mode="a"), lambda: evs.recover(path)):
        with pytest.raises(evs.FormatError, match="over the reader cap"):
            attempt()
    assert path.read_bytes() == before


def test_blocks_over_block_maximum_size_are_rejected_in_small_frames(tmp_path):
    """FRAMES.md §3 rule 3, for every frame: a block larger than Block_Maximum_Size
    (min(Window_Size, 128 KiB)) is rejected, whatever the libzstd version would do (1.5.4
    decodes such a raw block, and such a compressed one, that 1.5.7 rejects). Frames up to
    64 KiB used to skip the walk."""
    plain = container([payload_of([np.arange(40, dtype=np.int64), "x" * 500])])
    assert len(plain) <= 2048
    # a non-single-segment frame with a 1 KiB window holding one raw block of all the bytes
    header = struct.pack("<IBBH", 0xFD2FB528, 0x44, 0, len(plain) - 256)
    checksum = new_compressor().compress(plain)[-4:]
    frame = header + struct.pack("<I", (len(plain) << 3) | 1)[:3] + plain + checksum
    table = encode_seek_table([len(frame)], [len(plain)], [int.from_bytes(checksum, "little")])
    path = tmp_path / "w.evs.zst"
    path.write_bytes(frame + table)
    assert len(plain) > 1024
    with pytest.raises(evs.FormatError, match="Block_Maximum_Size"):
        evs.open(path)


# ------------------------------------------------------------------ format 1.1 (FORMAT.md §3.1)

VERSION_FLAGS = {"1.0": 0, "1.1": FLAG_CRC32C}


@pytest.mark.parametrize("version", sorted(VERSION_FLAGS))
def test_writers_write_the_lowest_minor_and_one_checksum_function(tmp_path, version):
    """FORMAT.md §14: minor 1 with flag bit 0, minor 0 with no flag; every checksum field of
    the file by the function the flags name (the builder here signs a file the same way)."""
    path = tmp_path / "v.evs"
    with evs.Writer(path, format_version=version, metadata={"m": 1}) as w:
        w.append([np.arange(5), "x"])
    data = path.read_bytes()
    flags = VERSION_FLAGS[version]
    assert struct.unpack_from("<HHI", data, 8) == (1, 1 if flags else 0, flags)
    with evs.open(path) as ds:
        assert ds.header.checksum is checksum_function(flags)
        (entry,) = ds.entries().tolist()
        payload = bytes(ds.raw(0))
        assert entry[2] == checksum_function(flags)(payload)
        assert ds.verify().ok
    built = container([payload_of([np.arange(5), "x"])], flags=flags)
    (tmp_path / "built.evs").write_bytes(built)
    with evs.open(tmp_path / "built.evs") as ds:
        assert ds.header.version == version and ds.verify().ok


@pytest.mark.parametrize("version", sorted(VERSION_FLAGS))
def test_a_changed_payload_byte_is_caught_under_each_function(tmp_path, version):
    """FORMAT.md §10 step 4 and §13: whichever the function, a changed payload byte fails the
    record's read and verify, plain and compressed."""
    plain = bytearray(container([payload_of([np.arange(40)])], flags=VERSION_FLAGS[version]))
    path = tmp_path / "c.evs"
    path.write_bytes(plain)
    with evs.open(path) as ds:
        at = int(ds.entries()["offset"][0]) + 16 + 40
    plain[at] ^= 0x10  # a tensor data byte: the structure still decodes
    path.write_bytes(plain)
    (tmp_path / "c.evs.zst").write_bytes(compressed(bytes(plain)))
    for name in ("c.evs", "c.evs.zst"):
        with evs.open(tmp_path / name) as ds:
            if name == "c.evs":
                with pytest.raises(evs.FormatError, match="checksum"):
                    ds[0]
            report = ds.verify()
            assert [i for i, _ in report.bad_records] == [0]
            assert "checksum" in report.bad_records[0][1]


@pytest.mark.parametrize("version", sorted(VERSION_FLAGS))
def test_a_flipped_flag_bit_is_caught(tmp_path, version):
    """FORMAT.md 3.1: the header checksum is computed with the function the flags name, so
    flipping bit 0 (either way) fails it; any other bit is an unknown flag."""
    good = container([payload_of([1])], flags=VERSION_FLAGS[version])
    for bit, reason in (
        (0, "header checksum mismatch"),
        (1, "unknown header flags 0x"),
        (31, "unknown header flags 0x"),
    ):
        data = bytearray(good)
        data[12 + bit // 8] ^= 1 << (bit % 8)
        (tmp_path / "f.evs").write_bytes(data)
        with pytest.raises(evs.FormatError, match=reason) as info:
            evs.open(tmp_path / "f.evs")
        assert info.value.offset in (12, 50 + 4)  # the flags, or the header checksum
        with pytest.raises(evs.FormatError, match=reason):
            evs.recover(tmp_path / "f.evs")


def test_a_1_0_reader_refuses_a_1_1_file_at_its_header(tmp_path, monkeypatch):
    """FORMAT.md §14: a reader that knows no flag (a 1.0 reader: its code is this reader's
    with no known flag) refuses a 1.1 file with the unknown flag named, not with checksum
    failures; it still reads 1.0 files."""
    from evalue_store import container as layout

    path, old = tmp_path / "new.evs", tmp_path / "old.evs"
    for target, version in ((path, "1.1"), (old, "1.0")):
        with evs.Writer(target, format_version=version) as w:
            w.append([1])
    monkeypatch.setattr(layout, "KNOWN_FLAGS", 0)
    with pytest.raises(evs.FormatError, match=r"unknown header flags 0x1\b") as info:
        evs.open(path)
    assert info.value.offset == 12
    with evs.open(old) as ds:
        assert ds[0] == [1]


def test_format_version_of_a_new_file_is_checked(tmp_path):
    with pytest.raises(ValueError, match="format version"):
        evs.Writer(tmp_path / "x.evs", format_version="2.0")
    assert not (tmp_path / "x.evs").exists()


def test_shards_of_both_versions_mix(tmp_path):
    """FORMAT.md §14: each shard is read with its own function. A run resumed with another
    version appends to its last shard in that shard's version; new shards get the new one."""
    pattern = str(tmp_path / "s-{:02d}.evs")
    with evs.ShardWriter(pattern, max_records=3, format_version="1.0") as w:
        w.extend([[i] for i in range(5)])  # shard 0 full, shard 1 holds 2
    with evs.ShardWriter(pattern, max_records=3, resume=True, format_version="1.1") as w:
        w.extend([[i] for i in range(5, 9)])
    versions = []
    for k in range(3):
        with evs.open(pattern.format(k)) as ds:
            versions.append(ds.header.version)
    assert versions == ["1.0", "1.0", "1.1"]
    with evs.open_shards(tmp_path / "s.manifest.json") as shards:
        assert [r[0] for r in shards] == list(range(9))
        assert all(shards.shard(k).verify().ok for k in range(3))


# ------------------------------------------------------------------ settled points (issue 12)


def test_a_file_shorter_than_data_start_is_rejected_though_it_holds_the_header(tmp_path):
    """FORMAT.md §3 rule 1: a file of H <= size < align(H) bytes is rejected; one of
    align(H) bytes is a container with no commit."""
    header = encode_header(64, FILE_ID, 0, "test", FLAG_CRC32C)
    length = struct.unpack_from("<I", header, 20)[0]
    assert length < len(header) == 64
    path = tmp_path / "h.evs"
    for size in (length, len(header) - 1):
        path.write_bytes(header[:size])
        with pytest.raises(evs.FormatError, match="truncated header"):
            evs.open(path)
    path.write_bytes(header)
    with evs.open(path) as ds:
        assert len(ds) == 0 and ds.metadata == {}


def tensor_payload(dims, dtype_code=1, alignment=64) -> bytearray:
    """A record of one tensor with ``dims`` and no data bytes (a dim is 0)."""
    body = bytes([1, dtype_code, len(dims), 0]) + b"".join(struct.pack("<Q", d) for d in dims)
    payload = struct.pack("<I", 1) + body
    return bytearray(payload + bytes(-(16 + len(payload)) % alignment))


def test_a_zero_dimension_does_not_lift_the_size_rule(tmp_path):
    """FORMAT.md §5 rule 2: itemsize x the product of max(dim, 1) must stay below 2^63,
    also when a dim is 0 (the data is then empty); every read path agrees."""
    fine = tensor_payload((0, 2**63 - 1))
    over = [tensor_payload((0, 2**63)), tensor_payload((0, 2**62), dtype_code=2)]
    over.append(tensor_payload((0, 2**61, 4)))
    assert decode_payload(bytes(16) + fine, 0, len(fine), 64)[0].shape == (0, 2**63 - 1)
    path = tmp_path / "z.evs"
    path.write_bytes(container([fine, *over]))
    with evs.open(path) as ds:
        for _ in range(4):  # (read again once its layout is learned: its rows overflow)
            assert ds[0][0].shape == (0, 2**63 - 1)
        for i in (1, 2, 3):
            with pytest.raises(evs.FormatError, match="overflow 64-bit sizes"):
                ds[i]
        assert [i for i, _ in ds.verify().bad_records] == [1, 2, 3]
        raw = bytes(ds.raw(1))
    with evs.Writer(tmp_path / "copy.evs") as w:
        with pytest.raises(evs.FormatError, match="overflow 64-bit sizes"):
            w.append_raw(raw, 64)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_records_of_an_empty_tensor_with_a_huge_dim_scan_and_verify(tmp_path, compression):
    """FORMAT.md §5 rule 2 allows a tensor of 0 elements whose dims multiply to 2^63 - 1:
    several such records of one layout, read by runs, made numpy raise a plain ValueError
    ("array is too big") and the compiled frame reader refuse the layout ("step 0 ... is
    not valid"), so a scan of a valid compressed file, and verify, failed. Runs that cannot
    be stacked are now read record by record."""
    fine = tensor_payload((0, 2**63 - 1))
    plain = tmp_path / "z.evs"
    plain.write_bytes(container([fine] * 6))
    path = plain
    if compression:
        path = tmp_path / "z.evs.zst"
        with evs.open(plain) as ds, evs.Writer(path, compression="zstd") as w:
            for i in range(len(ds)):
                w.append_raw(ds.raw(i), 64)
    with evs.open(path) as ds:
        assert [r[0].shape for r in ds] == [(0, 2**63 - 1)] * 6
        report = ds.verify()
        assert report.ok, report
        assert [r[0].shape for r in ds.get_many([5, 0, 3])] == [(0, 2**63 - 1)] * 3


def test_verify_checks_the_numbering_of_earlier_footers(tmp_path):
    """FORMAT.md §13 rule 1: each earlier footer must have the commit number one less than
    the footer naming it; a checksum-valid footer numbered otherwise is reported."""
    path = tmp_path / "c.evs"
    with evs.Writer(path) as w:
        for k in range(3):
            w.append([k])
            w.commit()
    with evs.open(path) as ds:
        assert ds.verify().ok
        last, header = ds.commit, ds.header
    data = bytearray(path.read_bytes())
    read = lambda offset, n: bytes(data[offset : offset + n])  # noqa: E731
    from evalue_store.container import parse_footer_from

    older = parse_footer_from(read, last.prev_footer, last.footer_offset, header)
    assert older.number == last.number - 1
    renumbered = encode_footer(
        older.footer_offset, header.file_id, replace(older, number=older.number + 7), crc32c
    )
    data[older.footer_offset : older.end] = renumbered
    path.write_bytes(data)
    with evs.open(path) as ds:
        assert [r[0] for r in ds] == [0, 1, 2]  # readers use the last footer only
        report = ds.verify()
    damaged = f"footer of commit {older.number} at {older.footer_offset} is damaged"
    assert report.problems == [damaged]


def test_layout_2_entries_that_disagree_with_their_frames_fail_verify(tmp_path, monkeypatch):
    """FRAMES.md §9 rule 2 and §10: a lookup through a locator takes L and crc from the
    frame header and may return the record; a scan and verify compare every index entry
    with its frame, as in a plain file, where every read refuses it."""
    from evalue_store.dataset import append

    class Lying:
        size = ENTRY.size

        def pack(self, offset, length, crc, reserved):
            return ENTRY.pack(offset, length, crc ^ 1, reserved)

    monkeypatch.setattr(append, "ENTRY", Lying())  # where a writer packs appended entries
    for name, options in (("p.evs", {}), ("z.evs.zst", {"compression": "zstd"})):
        with evs.Writer(tmp_path / name, **options) as w:
            w.append([1])
            w.append([2])
    monkeypatch.undo()
    with evs.open(tmp_path / "p.evs") as ds:
        with pytest.raises(evs.FormatError, match="disagrees with its index entry"):
            ds[0]
        assert [i for i, _ in ds.verify().bad_records] == [0, 1]
    with evs.open(tmp_path / "z.evs.zst") as ds:
        assert ds[1] == [2]  # allowed: the locator's frame header gives L and crc
        with pytest.raises(evs.FormatError, match="disagrees with its index entry"):
            list(ds)
        report = ds.verify()
        assert [i for i, _ in report.bad_records] == [0, 1]
        assert "disagrees with its index entry" in report.bad_records[0][1]


def test_the_index_block_search_is_bounded_by_the_bytes_it_reads(tmp_path):
    """FRAMES.md §8 rule 1: the backward search gives up once the candidate blocks it has
    read in full (Block_Size bytes each) exceed 2 x file size + 1 MiB. It used to charge
    each candidate 144 bytes whatever it read, so a tail of candidates claiming the largest
    block (98,448 bytes, checksum wrong) made it read and hash about 680 x the file."""
    import os

    from evalue_store import byteio, zstd

    path = tmp_path / "t.evs.zst"
    with evs.Writer(path, compression="zstd") as w:
        w.append([np.zeros(100_000, np.uint8)])  # room before the tail for big claims
    largest = 144 + 24 * 4096
    candidate = struct.pack("<II4s", 0, largest, b"EVZI")
    with open(path, "ab") as f:
        f.write(candidate * 20_000)

    class Counting(byteio.FdReader):
        read_bytes = 0

        def pread(self, offset: int, n: int) -> bytes:
            data = super().pread(offset, n)
            Counting.read_bytes += len(data)
            return data

    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    with pytest.raises(evs.FormatError, match="candidate index blocks"):
        zstd.open_reader(Counting(fd, size, str(path), owns_fd=True))
    assert Counting.read_bytes <= 4 * size + (4 << 20)


def test_a_tail_of_bare_index_tags_is_searched_without_a_read_each(tmp_path):
    """A tail of 'EVZI' tags with no room for a block behind them: each candidate's
    trailer is judged from the chunk the search read (it cost a read and an exception per
    tag: 0.75 s a MiB, 0.09 s now), and the file opens at its last block."""
    import os

    from evalue_store import byteio, zstd

    path = tmp_path / "t.evs.zst"
    with evs.Writer(path, compression="zstd") as w:
        w.extend([[np.arange(8), i] for i in range(100)])
    with open(path, "ab") as f:
        f.write(b"EVZI" * (1 << 16))

    class Counting(byteio.FdReader):
        calls = 0

        def pread(self, offset: int, n: int) -> bytes:
            Counting.calls += 1
            return super().pread(offset, n)

    fd = os.open(path, os.O_RDONLY)
    source, _, commit = zstd.open_reader(
        Counting(fd, os.fstat(fd).st_size, str(path), owns_fd=True)
    )
    assert commit.record_count == 100
    assert Counting.calls < 64  # (65,536 tags)
    source.close()


def nested_metadata(depth: int) -> dict:
    """An object nesting arrays and objects ``depth`` deep, the object itself counting 1."""
    value: object = 1
    for k in range(depth - 1):
        value = [value] if k % 2 else {"k": value}
    return {"top": value}


def replace_metadata(path, text: bytes) -> None:
    """Rewrite the last commit of the plain file at ``path`` so that its metadata block is
    ``text``, as is (checksums valid): what no writer would write."""
    with evs.open(path) as ds:
        commit, header = ds.commit, ds.header
    data = bytearray(path.read_bytes())
    block = text + bytes(-len(text) % header.alignment)
    at = commit.footer_offset
    data[at:] = block
    changed = replace(
        commit,
        footer_offset=at + len(block),
        metadata_offset=at,
        metadata_length=len(text),
        metadata_crc=header.checksum(text),
    )
    data += encode_footer(changed.footer_offset, header.file_id, changed, header.checksum)
    path.write_bytes(data)


def test_metadata_nests_at_most_512_deep_for_writers_and_readers(tmp_path):
    """FORMAT.md §7 rule 2: arrays and objects nest at most 512 deep (the top object is 1).
    The bound used to be wherever the interpreter's recursion limit fell (about 990, less
    when called from deep in a stack), and 1000 for the C++ reader."""
    path = tmp_path / "m.evs"
    with evs.Writer(path, metadata=nested_metadata(512)) as w:
        w.append([1])
    with evs.open(path) as ds:
        assert ds.metadata == nested_metadata(512) and ds.verify().ok
    with pytest.raises(evs.EncodeError, match="deeper than 512"):
        evs.Writer(tmp_path / "deep.evs", metadata=nested_metadata(513))
    replace_metadata(path, json.dumps(nested_metadata(513)).encode())
    with evs.open(path) as ds:
        assert ds[0] == [1]
        with pytest.raises(evs.FormatError, match="deeper than 512"):
            _ = ds.metadata
        assert any("deeper than 512" in p for p in ds.verify().problems)


def test_verify_reports_blocks_that_overlap(tmp_path):
    """FORMAT.md §2 rule 1 and §13 rule 1: blocks never overlap, and a verifier reports
    blocks that do. A metadata block laid over a record's tensor data (checksums valid,
    the JSON padded with spaces) read fine and passed verify."""
    text = b'{"a": 1}'.ljust(64)
    path = tmp_path / "o.evs"
    with evs.Writer(path) as w:
        w.append([np.frombuffer(text, np.uint8), 7])
    with evs.open(path) as ds:
        commit, header = ds.commit, ds.header
        at = int(ds.entries()["offset"][0]) + 64  # the tensor data: 64 bytes from the frame
        assert bytes(ds[0][0]) == text
    data = bytearray(path.read_bytes())
    assert data[at : at + 64] == text
    overlaid = replace(commit, metadata_offset=at, metadata_length=64, metadata_crc=crc32c(text))
    del data[commit.footer_offset :]
    data += encode_footer(commit.footer_offset, header.file_id, overlaid, crc32c)
    path.write_bytes(data)
    with evs.open(path) as ds:
        assert ds.metadata == {"a": 1} and ds[0][1] == 7  # readers need not notice
        report = ds.verify()
    assert report.problems == [f"blocks overlap at {at}: a block starts inside another"]
