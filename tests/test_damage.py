"""Truncated, corrupted, hostile and crash-damaged files: clear errors, no committed data lost."""

from __future__ import annotations

import os
import random
import signal
import struct
import time

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.container import (
    ENTRY,
    encode_footer,
    parse_header,
)
from evalue_store.dataset.reader import Dataset


def record(i: int) -> list:
    """A deterministic record, so any reader can tell what record ``i`` must hold."""
    rng = np.random.default_rng(i)
    return [rng.integers(-5, 5, i % 7), f"r{i}", i, rng.random(2, dtype=np.float32)]


def same(got: list, i: int) -> bool:
    want = record(i)
    return (
        got[0].tobytes() == want[0].tobytes()
        and got[1:3] == want[1:3]
        and got[3].tobytes() == want[3].tobytes()
    )


def build(path, commits=(3, 2, 4), metadata=None) -> list[int]:
    """A file committed in steps; returns the file size after each commit."""
    ends = []
    n = 0
    with evs.Writer(path, metadata=metadata) as w:
        ends.append(os.path.getsize(path))
        for size in commits:
            for _ in range(size):
                w.append(record(n))
                n += 1
            w.commit()
            ends.append(os.path.getsize(path))
    return ends


def counts(commits=(3, 2, 4)) -> list[int]:
    return [sum(commits[:k]) for k in range(len(commits) + 1)]


def test_truncation_at_every_byte_opens_at_last_whole_commit(tmp_path):
    path = tmp_path / "full.evs"
    ends = build(path)
    data = path.read_bytes()
    header_size = parse_header(lambda o, n: data[o : o + n], len(data)).data_start
    cut = tmp_path / "cut.evs"
    for size in range(len(data)):
        cut.write_bytes(data[:size])
        if size < header_size:
            with pytest.raises(evs.FormatError):
                evs.open(cut)
            continue
        ds = evs.open(cut)
        whole = [k for k, end in enumerate(ends) if end <= size]
        expected = counts()[whole[-1]] if whole else 0
        assert len(ds) == expected, size
        assert all(same(ds[i], i) for i in range(len(ds)))
        assert ds.uncommitted_bytes == size - (ends[whole[-1]] if whole else header_size)
        ds.close()


def test_torn_tails_are_salvaged_by_append_and_recover(tmp_path):
    path = tmp_path / "full.evs"
    ends = build(path, commits=(2, 5))
    data = path.read_bytes()
    tail_start = ends[1]
    work = tmp_path / "w.evs"
    for size in range(tail_start, len(data), 7):
        for filler in (b"", bytes(100), os.urandom(50)):
            work.write_bytes(data[:size] + filler)
            report = evs.recover(work)
            ds = evs.open(work)
            assert ds.uncommitted_bytes == 0 and ds.verify().ok
            assert len(ds) >= 2 and all(same(ds[i], i) for i in range(len(ds)))
            assert report.committed_records == 2 or size >= ends[2]
            if report.side_file:
                side = open(report.side_file, "rb").read()
                assert side == (data[:size] + filler)[len(data[:size] + filler) - len(side) :]
                os.remove(report.side_file)
            with evs.Writer(work, mode="a") as w:  # appending after recovery just works
                w.append(record(len(ds)))
            ds2 = evs.open(work)
            assert len(ds2) == len(ds) + 1 and same(ds2[-1], len(ds))


def test_append_mode_salvages_a_crashed_tail(tmp_path):
    path = tmp_path / "a.evs"
    w = evs.Writer(path)
    for i in range(5):
        w.append(record(i))
    w.commit()
    for i in range(5, 8):
        w.append(record(i))
    w._sink.flush()  # records on disk, no commit: what a killed writer leaves
    os.close(w._fd)
    w._fd = -1
    with open(path, "ab") as f:
        f.write(b"\x01partial record")
    assert len(evs.open(path)) == 5
    with evs.Writer(path, mode="a") as w2:
        assert w2.salvage.salvaged_records == 3
        assert w2.salvage.damaged_bytes == len(b"\x01partial record")
        w2.append(record(8))
    ds = evs.open(path)
    assert len(ds) == 9 and all(same(ds[i], i) for i in range(9)) and ds.verify().ok
    assert open(w2.salvage.side_file, "rb").read() == b"\x01partial record"


def test_every_bit_flip_in_checksummed_bytes_is_detected(tmp_path):
    path = tmp_path / "flip.evs"
    build(path, metadata={"k": "v"})
    data = bytearray(path.read_bytes())
    ds = evs.open(path)
    covered = covered_ranges(ds)
    ds.close()
    rng = random.Random(1)
    positions = sorted(rng.sample(range(len(data)), min(len(data), 600)))
    detected = tried = 0
    for pos in positions:
        if not any(a <= pos < b for a, b in covered):
            continue
        tried += 1
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(flipped)
        try:
            ds = evs.open(path)
        except evs.FormatError:
            detected += 1
            continue
        report = ds.verify()
        assert not report.ok, f"flip at {pos} not detected"
        detected += 1
        for i in range(len(ds)):  # damaged records raise; every other record is intact
            bad = {j for j, _ in report.bad_records}
            if i in bad:
                with pytest.raises(evs.FormatError):
                    ds[i]
            else:
                assert same(ds[i], i)
        ds.close()
    assert tried > 300 and detected == tried


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_verify_notices_a_change_to_any_committed_byte(tmp_path, compression):
    """Checksums cover the blocks; the padding between them must be zero. So verify (or
    open) notices a changed byte anywhere up to the last commit, padding included, while
    reads of the records stay correct when only padding changed."""
    path = tmp_path / "any.evs"
    with evs.Writer(path, metadata={"v": 1}) as w:
        w.extend(record(i) for i in range(3))
        w.commit()
        w.set_metadata({"v": 2})  # the first metadata block becomes history
        w.extend(record(i) for i in range(3, 5))
    if compression:
        zst = tmp_path / "any.evs.zst"
        with evs.open(path) as ds, evs.Writer(zst, compression="zstd", frame_size=256) as w:
            for i in range(len(ds)):
                w.append_raw(ds.raw(i))
        path = zst
    data = path.read_bytes()
    step = 1 if compression else 3  # every third byte keeps the plain case quick
    undetected = []
    for pos in range(0, len(data), step):
        damaged = bytearray(data)
        damaged[pos] ^= 0x41
        path.write_bytes(damaged)
        try:
            with evs.open(path) as ds:
                if ds.verify().ok:
                    undetected.append(pos)
        except evs.FormatError:
            pass
    path.write_bytes(data)
    assert undetected == [], f"{len(undetected)} changed bytes went unnoticed"


def test_non_zero_padding_is_named_and_harmless_to_reads(tmp_path):
    path = tmp_path / "pad.evs"
    with evs.Writer(path) as w:
        w.extend([[np.arange(3, dtype=np.int8)]] * 3)  # short payloads: padding after each
    with evs.open(path) as ds:
        entry = ds.entries()[1]
        gap = int(entry["offset"]) + 16 + int(entry["length"])
    data = bytearray(path.read_bytes())
    assert data[gap] == 0
    data[gap] = 7
    path.write_bytes(bytes(data))
    with evs.open(path) as ds:
        assert all(np.array_equal(r[0], np.arange(3)) for r in ds)
        report = ds.verify()
        assert report.problems == [
            f"non-zero bytes in the padding between blocks at 1 places (offsets {gap}): no read "
            "uses them, but the file was changed there"
        ]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_verify_names_non_zero_padding_written_into_a_file(tmp_path, monkeypatch, compression):
    """A writer that put non-zero bytes in the padding (here: its zeros replaced) makes a
    file that reads right and that verify names at each place, the first ten listed, in a
    compressed file as in a plain one, across commits and frames."""
    from evalue_store.codec import record as codec_record

    zeros = codec_record.ZEROS
    path = tmp_path / "pad.evs"
    monkeypatch.setattr(codec_record, "ZEROS", b"\x07" * len(zeros))
    with evs.Writer(path, compression=compression) as w:
        for i in range(30):
            w.append([np.arange(3, dtype=np.int8), i])  # short payloads: padding after each
            if i % 7 == 6:
                w.commit()
    monkeypatch.setattr(codec_record, "ZEROS", zeros)
    with evs.open(path) as ds:
        assert [r[1] for r in ds] == list(range(30))
        gaps = [int(e["offset"]) + 16 + int(e["length"]) for e in ds.entries()]
        listed = ", ".join(map(str, gaps[:10]))
        assert ds.verify().problems == [
            f"non-zero bytes in the padding between blocks at 30 places (offsets {listed} ...):"
            " no read uses them, but the file was changed there"
        ]


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def test_verify_reads_a_compressed_file_once(tmp_path):
    """verify decompresses the frames in file order a span at a time, and checks the
    records, the padding and the frames from that one pass: it reads each byte of the file
    about once (a frame cache smaller than the file, and no mapping). It read a file three
    times, and made a lookup and a decoder call per record and per gap."""
    rng = np.random.default_rng(0)
    path = tmp_path / "once.evs.zst"
    with evs.Writer(path, compression="zstd") as w:
        for part in range(3):  # three commits: three index blocks and segments
            tokens = rng.integers(0, 1000, (4000, 128))
            w.extend_columns({0: tokens, 1: [f"r{part}-{i}" for i in range(4000)]})
            w.commit()
    size = path.stat().st_size
    with evs.open(path, backend="pread", cache_bytes=1 << 16) as ds:
        before = _bytes_read()
        report = ds.verify()
        read = _bytes_read() - before
    assert report.ok and report.records == 12000, report
    assert read < 1.1 * size, f"verify read {read} bytes of a {size}-byte file"


def covered_ranges(ds: Dataset) -> list[tuple[int, int]]:
    """Byte ranges protected by some checksum: header, live records, index, metadata, footers."""
    ranges = [(0, 54 + len(ds.header.writer.encode()))]
    for e in ds.entries():
        ranges.append((int(e["offset"]), int(e["offset"]) + 16 + int(e["length"])))
    commit = ds.commit
    ranges.append((commit.footer_offset, commit.end))
    for seg in commit.segments:
        ranges.append((seg.offset, seg.offset + seg.count * 24))
    if commit.metadata_length:
        ranges.append((commit.metadata_offset, commit.metadata_offset + commit.metadata_length))
    return ranges


def test_read_with_verify_detects_payload_flip_without_verify_call(tmp_path):
    path = tmp_path / "r.evs"
    with evs.Writer(path) as w:
        w.append([np.arange(100, dtype=np.int32)])
        w.append([np.arange(100, dtype=np.int32)])
    ds = evs.open(path)
    offset = int(ds.entries()["offset"][0])
    ds.close()
    data = bytearray(path.read_bytes())
    data[offset + 200] ^= 4
    path.write_bytes(data)
    ds = evs.open(path)
    with pytest.raises(evs.FormatError, match="record 0: record checksum mismatch"):
        ds[0]
    assert ds[1][0].sum() == 4950
    assert evs.open(path, verify=False)[0][0].shape == (100,)  # opting out reads it anyway


def rewrite_footer(path, **changes) -> None:
    """Re-sign the last footer with changed fields: what a hostile writer can produce."""
    ds = evs.open(path)
    commit, header = ds.commit, ds.header
    ds.close()
    from dataclasses import replace

    new = replace(commit, **changes)
    data = bytearray(path.read_bytes())
    del data[commit.footer_offset :]
    data += encode_footer(commit.footer_offset, header.file_id, new, header.checksum)
    path.write_bytes(data)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"record_count": 10**12}, "segments hold"),
        ({"metadata_length": 1 << 40, "metadata_offset": 128}, "metadata"),
        ({"prev_footer": 1 << 50}, "previous footer"),
    ],
)
def test_hostile_footers_raise_format_error(tmp_path, changes, message):
    path = tmp_path / "h.evs"
    build(path)
    rewrite_footer(path, **changes)
    with pytest.raises(evs.FormatError, match=message):
        evs.open(path)


def test_hostile_segments_raise_format_error(tmp_path):
    from evalue_store.container import Segment

    path = tmp_path / "s.evs"
    build(path)
    ds = evs.open(path)
    seg = ds.commit.segments[-1]
    ds.close()
    for bad in (
        Segment(seg.offset, 1 << 60, seg.crc, 0),
        Segment(seg.offset + 1, seg.count, seg.crc, 0),
        Segment(1 << 62, seg.count, seg.crc, 0),
    ):
        path2 = tmp_path / "s2.evs"
        path2.write_bytes(path.read_bytes())
        segs = ds.commit.segments[:-1] + (bad,)
        rewrite_footer(path2, segments=segs)
        with pytest.raises(evs.FormatError, match="segment"):
            evs.open(path2)


def test_hostile_index_entries_and_record_headers(tmp_path):
    path = tmp_path / "i.evs"
    with evs.Writer(path) as w:
        w.append([np.arange(4)])
        w.append([np.arange(4) + 1])
    ds = evs.open(path)
    seg = ds.commit.segments[0]
    entries = ds.entries().copy()
    ds.close()
    original = path.read_bytes()
    cases = {
        "past the committed end": (1 << 40, int(entries["length"][0])),
        "bad offset": (int(entries["offset"][0]) + 8, int(entries["length"][0])),
        "disagrees": (int(entries["offset"][1]), int(entries["length"][0])),
    }
    for message, (offset, length) in cases.items():
        data = bytearray(original)
        ENTRY.pack_into(data, seg.offset, offset, length, int(entries["crc"][0]), 0)
        path.write_bytes(data)
        ds = evs.open(path)  # the index is mapped, not parsed: opening still works
        with pytest.raises(evs.FormatError, match=message):
            ds[0]
        assert ds[1][0].tolist() == [1, 2, 3, 4]
        assert not ds.verify().ok


def test_hostile_tensor_dims_claiming_terabytes(tmp_path):
    from evalue_store.container import FRAME

    path = tmp_path / "t.evs"
    with evs.Writer(path) as w:
        w.append([np.arange(4, dtype=np.int64)])
    ds = evs.open(path)
    offset, length = int(ds.entries()["offset"][0]), int(ds.entries()["length"][0])
    segment = ds.commit.segments[0].offset
    checksum = ds.header.checksum
    ds.close()
    for dim in (1 << 40, 1 << 62, (1 << 64) - 1):
        data = bytearray(path.read_bytes())
        payload = bytearray(data[offset + 16 : offset + 16 + length])
        struct.pack_into("<Q", payload, 8, dim)  # u32 count, tag, dtype, rank, flags, dims
        crc = checksum(payload)
        data[offset + 16 : offset + 16 + length] = payload
        FRAME.pack_into(data, offset, b"EVR1", crc, length)
        ENTRY.pack_into(data, segment, offset, length, crc, 0)  # a consistent, signed lie
        path.write_bytes(data)
        ds = evs.open(path)
        with pytest.raises(evs.FormatError, match="runs past|overflow"):
            ds[0]
        ds.close()


def test_garbage_files_raise_format_error(tmp_path):
    path = tmp_path / "g.evs"
    for blob in (b"", b"\x89EVS", b"PK\x03\x04" + bytes(100), os.urandom(4096)):
        path.write_bytes(blob)
        with pytest.raises(evs.FormatError):
            evs.open(path)
    build(path)
    data = bytearray(path.read_bytes())
    data[8] = 2  # major version 2
    path.write_bytes(data)
    with pytest.raises(evs.FormatError, match="version"):
        evs.open(path)


def writer_child(path: str, seed: int) -> None:
    """Append deterministic records, committing at random points, until killed."""
    rng = random.Random(seed)
    w = evs.Writer(path, mode="a")
    i = len(w)
    while True:
        w.append(record(i))
        i += 1
        if rng.random() < 0.2:
            w.commit()
            os.write(3, struct.pack("<Q", len(w)))  # report the committed count to the parent


def kill_trials(path: str, trials: int, seed: int) -> None:
    """Fork writer_child, SIGKILL it at a random instant, check the file; ``trials`` times.

    After each kill: every record reported committed is present and byte-identical,
    recover keeps them and salvages only complete records, and the file is clean again.
    """
    rng = random.Random(seed)
    salvaged = ever_committed = 0
    trial = 0
    # Past ``trials``, go on (up to 4x) until kills have landed both after a commit and
    # between commits: on a loaded machine a short run may not have hit both yet.
    while trial < trials or (not (ever_committed and salvaged) and trial < 4 * trials):
        trial += 1
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns to pytest
            try:
                os.dup2(write_end, 3)
                writer_child(path, trial)
            finally:
                os._exit(1)
        os.close(write_end)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reported = os.read(read_end, 1 << 20)
        os.close(read_end)
        committed = struct.unpack_from("<Q", reported, len(reported) - 8)[0] if reported else 0
        ever_committed = max(ever_committed, committed)
        with evs.open(path) as ds:
            assert len(ds) >= committed
            assert all(same(ds[i], i) for i in range(len(ds)))
        report = evs.recover(path)
        assert report.committed_records >= committed
        salvaged += report.salvaged_records
        with evs.open(path) as ds:
            assert ds.uncommitted_bytes == 0 and all(same(ds[i], i) for i in range(len(ds)))
            assert ds.verify().ok
        if report.side_file:
            os.remove(report.side_file)
    assert ever_committed > 0 and salvaged > 0  # kills landed after commits and between them


def test_killed_writers_lose_no_committed_record(tmp_path):
    path = str(tmp_path / "k.evs")
    evs.Writer(path).close()
    kill_trials(path, trials=40, seed=7)
