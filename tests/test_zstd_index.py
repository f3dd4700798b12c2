"""Layout 2 of the zstd frame layer (docs/FRAMES.md): what its index promises.

Commits cost what they add; open and lookups read a bounded number of bytes through the
byte reader whatever the record or commit count; stock zstd still decompresses the file;
hostile index blocks, locators and frame maps are refused without big allocations; layout-1
files stay readable, verifiable and appendable in their own layout.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import byteio, zstd
from evalue_store.physical import zstd_layout
from evalue_store.physical.zstd_layout import (
    LOCATOR,
    SKIPPABLE_HEADER_SIZE,
    Extent,
    Run,
    encode_block,
    find_last_block,
    read_layout,
)

from .test_core import assert_same
from .test_frames import stock_decompress

FIXTURES = Path(__file__).parent / "fixtures"


def w1(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(0, 50000, 128), rng.random(16, dtype=np.float32), i % 10, f"ex-{i:06d}"]
        for i in range(n)
    ]


class CountingReader(byteio.FdReader):
    """An FdReader that counts its preads and the bytes they return."""

    calls: list[tuple[int, int]]

    def pread(self, offset: int, n: int) -> bytes:
        self.calls.append((offset, n))
        return super().pread(offset, n)


def open_counting(path: Path) -> tuple:
    fd = os.open(path, os.O_RDONLY)
    reader = CountingReader(fd, os.fstat(fd).st_size, str(path), owns_fd=True)
    reader.calls = []
    source, header, commit = zstd.open_reader(reader)
    return source, reader, commit


def last_block(path: Path):
    fd = os.open(path, os.O_RDONLY)
    reader = byteio.FdReader(fd, os.fstat(fd).st_size, owns_fd=True)
    try:
        layout_end, _ = read_layout(reader)
        return find_last_block(reader, reader.size, layout_end), layout_end
    finally:
        reader.close()


def block_fields(block) -> dict:
    return dict(
        group_start=block.group_start,
        logical_start=block.logical_start,
        logical_end=block.logical_end,
        previous=block.previous,
        record_count=block.record_count,
        map_offset=block.map_offset,
        frame_count=block.frame_count,
        first_logical_size=block.first_logical_size,
        largest=block.largest,
        footer=block.footer,
        metadata=block.metadata,
        first=block.first,
    )


def resign(path: Path, **changes) -> None:
    """Rewrite the last index block with ``changes`` (runs=...: its runs), checksum valid."""
    block, _ = last_block(path)
    fields = block_fields(block)
    runs = changes.pop("runs", list(block.runs))
    fields.update(changes)
    data = path.read_bytes()[: block.offset] + encode_block(fields, runs)
    path.write_bytes(data)


# ------------------------------------------------------------------------------ cost


def test_one_record_commits_grow_the_file_linearly(tmp_path):
    """Layout 1 wrote a seek table of every earlier frame per commit (1,000 one-record
    commits: 18 MB). Layout 2 costs each commit what it adds: 2,000 commits give a file
    whose bytes per commit stay bounded and do not grow with the commit count."""
    path = tmp_path / "c.evs.zst"
    sizes = []
    with evs.Writer(path, compression="zstd", durable=False) as w:
        for i in range(2000):
            w.append([np.arange(4) + i, f"r{i}"])
            w.commit()
            sizes.append(os.path.getsize(path))
    early = (sizes[499] - sizes[0]) / 499
    late = (sizes[1999] - sizes[1500]) / 499
    assert late < 1.3 * early + 64, (early, late)
    assert sizes[-1] / 2000 < 1500, sizes[-1]
    with evs.open(path) as ds:
        assert len(ds) == 2000 and ds[1234][1] == "r1234" and ds.verify().ok
        assert len(ds._source.block.runs) <= 12  # O(log n) locator runs


def test_open_and_cold_lookups_read_a_bounded_number_of_bytes(tmp_path):
    """Open reads the layout frame (with the dictionary the writer trained), the last
    index block and the header's and footer's frames, whatever the record or commit count;
    a cold ds[i] reads one locator group and the frames holding record i: two preads."""
    reads = {}
    for commits in (1, 40):
        path = tmp_path / f"o{commits}.evs.zst"
        recs = w1(4000)
        per = len(recs) // commits
        with evs.Writer(path, compression="zstd", durable=False) as w:
            for c in range(commits):
                w.extend(recs[c * per : (c + 1) * per])
                w.commit()
        source, reader, commit = open_counting(path)
        try:
            at_open = list(reader.calls)
            reads[commits] = len(at_open)
            assert source.dictionary  # trained on the first commit's 1,000 records or more
            assert sum(n for _, n in at_open) < 8192 + len(source.dictionary), at_open
            for i in (0, 1999, 3999, 1234):
                reader.calls.clear()
                seg, start = commit.segments[0], 0
                for s in commit.segments:
                    if i < start + s.count:
                        seg = s
                        break
                    start += s.count
                offset, length, crc, _ = source.entry(seg.offset + (i - start) * 24, i)
                buf, pos = source.frame(offset, 16 + length)
                assert len(reader.calls) <= 2, reader.calls
                assert sum(n for _, n in reader.calls) < 3 * 4096 + 400
            assert source._map is None  # no lookup needed the frame map
        finally:
            source.close()
    assert reads[1] == reads[40] <= 7  # the layout frame, then its dictionary: 2 of them


def test_a_reader_over_other_bytes_reads_the_file(tmp_path):
    """The source reads only through the byte-reader protocol: any object with ``size``,
    ``pread`` and ``close`` (a remote object's ranged reads) serves a compressed file."""

    class BytesReader:
        def __init__(self, data: bytes):
            self.data, self.size, self.name = data, len(data), "mem"

        def pread(self, offset: int, n: int) -> bytes:
            return self.data[offset : offset + n]

        def pread_many(self, ranges):
            return [self.pread(o, n) for o, n in ranges]

        def close(self) -> None:
            pass

    path = tmp_path / "m.evs.zst"
    recs = w1(300)
    with evs.Writer(path, compression="zstd") as w:
        w.extend(recs)
    source, header, commit = zstd.open_reader(BytesReader(path.read_bytes()))
    seg = commit.segments[0]
    for i in (0, 150, 299):
        offset, length, _, _ = source.entry(seg.offset + i * 24, i)
        raw = source.read(offset + 16, length)
        with evs.open(path) as ds:
            assert bytes(raw) == bytes(ds.raw(i))
    source.close()


# ------------------------------------------------------------------------------ zstd -d


def test_stock_zstd_gives_back_the_plain_container_after_appends_and_a_crash(tmp_path):
    zstd_cli = shutil.which("zstd")
    if zstd_cli is None:
        pytest.fail("the zstd CLI is missing: CI must install Debian's zstd package")
    path = tmp_path / "a.evs.zst"
    recs = w1(500)
    with evs.Writer(path, compression="zstd") as w:
        w.extend(recs[:200])
        w.commit()
        w.extend(recs[200:300])
    with evs.Writer(path, mode="a") as w:
        w.extend(recs[300:400])
    with open(path, "ab") as f:  # a crash's tail: a frame of garbage after the last commit
        f.write(b"\x28\xb5\x2f\xfd" + bytes(40))
    with evs.Writer(path, mode="a") as w:  # salvaged (nothing to keep) and appended to
        w.extend(recs[400:])
    out = tmp_path / "a.evs"
    assert evs.read_dictionary(path)  # trained on the first commit's 200 records
    stock_decompress(zstd_cli, path, out)
    with evs.open(out) as plain, evs.open(path) as packed:
        assert plain.verify().ok and packed.verify().ok
        assert_same(list(plain), recs)
        assert bytes(b"".join(bytes(c) for c in packed.logical_chunks())) == out.read_bytes()


# ------------------------------------------------------------------------------ hostile


def made(tmp_path: Path, commits: int = 2) -> tuple[Path, list]:
    path = tmp_path / "h.evs.zst"
    recs = w1(60)
    with evs.Writer(path, compression="zstd") as w:
        per = len(recs) // commits
        for c in range(commits):
            w.extend(recs[c * per : (c + 1) * per])
            w.commit()
    return path, recs


def test_a_bad_index_block_checksum_is_a_torn_tail(tmp_path):
    """A damaged last index block is no commit: the reader opens the previous one, with
    the damaged bytes as an uncommitted tail, and recovery keeps every earlier record."""
    path, recs = made(tmp_path)
    data = bytearray(path.read_bytes())
    block, _ = last_block(path)
    data[block.offset + 20] ^= 0x01
    path.write_bytes(data)
    with evs.open(path) as ds:
        assert len(ds) == 30 and ds.uncommitted_bytes > 0
        assert_same(ds[29], recs[29])
    evs.recover(path)
    with evs.open(path) as ds:
        assert len(ds) >= 30 and ds.verify().ok
    path, _ = made(tmp_path, commits=1)
    data = bytearray(path.read_bytes())
    block, _ = last_block(path)
    first = block  # one commit of records after the empty first commit: still a fallback
    data[first.offset + 20] ^= 0x01
    path.write_bytes(data)
    with evs.open(path) as ds:
        assert len(ds) == 0


def test_lying_locators_and_maps_are_refused(tmp_path):
    path, recs = made(tmp_path)
    block, layout_end = last_block(path)
    good = path.read_bytes()
    # A run listed at a place that holds no run frame: its group checksum fails, and so
    # does the way round it (the map no longer fills the group the block describes).
    resign(path, runs=[Run(block.group_start, 0, block.record_count)])
    with evs.open(path) as ds, pytest.raises(evs.FormatError):
        ds[3]
    # A footer extent lying about its size: the frames it names do not hold the footer.
    path.write_bytes(good)
    foot = block.footer
    resign(path, footer=Extent(foot.physical, foot.logical, foot.span - 1))
    with pytest.raises(evs.FormatError):
        evs.open(path)
    # A frame map that is not where the block says (open never reads it: verify does).
    path.write_bytes(good)
    resign(path, frame_count=block.frame_count + 1, map_offset=block.map_offset - 8)
    with evs.open(path) as ds:
        assert_same(ds[7], recs[7])
        assert not ds.verify().ok
    # A frame map lying about its frames' sizes (re-signed): two sizes swapped.
    path.write_bytes(good)
    data = bytearray(good)
    at = block.map_offset + SKIPPABLE_HEADER_SIZE
    n = block.frame_count
    pairs = np.frombuffer(bytes(data[at : at + 8 * n]), "<u4").reshape(n, 2).copy()
    pairs[[0, 1]] = pairs[[1, 0]]
    data[at : at + 8 * n] = pairs.tobytes()
    struct.pack_into("<I", data, at + 8 * n, zstd_layout.checksum(pairs.tobytes()))
    path.write_bytes(data)
    with evs.open(path) as ds:
        assert_same(ds[7], recs[7])  # lookups do not use the map
        assert not ds.verify().ok
        with pytest.raises(evs.FormatError):
            b"".join(bytes(c) for c in ds.logical_chunks())
    # Runs that do not cover the records in order: no valid block, so, as for a torn tail,
    # the previous commit; runs locating fewer records than the footer has: an error.
    path.write_bytes(good)
    resign(path, runs=[Run(r.offset, r.first + 1, r.count) for r in block.runs])
    with evs.open(path) as ds:
        assert len(ds) == 30 and ds.uncommitted_bytes > 0
    path.write_bytes(good)
    last = block.runs[-1]
    resign(
        path,
        runs=[*block.runs[:-1], Run(last.offset, last.first, last.count - 1)],
        record_count=block.record_count - 1,
    )
    with pytest.raises(evs.FormatError, match="locates"):
        evs.open(path)


def rewrite_locator(path: Path, i: int, **fields) -> None:
    """Change record ``i``'s locator in place and re-sign its group."""
    block, _ = last_block(path)
    run = next(r for r in block.runs if r.first <= i < r.first + r.count)
    j = i - run.first
    data = bytearray(path.read_bytes())
    g = j // zstd_layout.GROUP
    at = run.offset + SKIPPABLE_HEADER_SIZE + g * zstd_layout.GROUP_BYTES
    n = min(zstd_layout.GROUP, run.count - g * zstd_layout.GROUP)
    loc = dict(
        zip(
            ("logical", "physical", "span", "position"),
            LOCATOR.unpack_from(data, at + (j % zstd_layout.GROUP) * LOCATOR.size),
        )
    )
    loc.update(fields)
    LOCATOR.pack_into(data, at + (j % zstd_layout.GROUP) * LOCATOR.size, *loc.values())
    body = bytes(data[at : at + n * LOCATOR.size])
    struct.pack_into("<I", data, at + n * LOCATOR.size, zstd_layout.checksum(body))
    path.write_bytes(data)


def test_verify_checks_a_span_that_claims_4_gib(tmp_path):
    """FRAMES.md section 6: Span 0xFFFFFFFF means 4 GiB or more, and section 10 has a
    verifier check every Span: one set to 0xFFFFFFFF (group CRC made right) for a record
    whose frames span a few hundred bytes passed verify (attacker finding, session 13,
    round 16, C04)."""
    path = tmp_path / "f.evs.zst"
    with evs.Writer(path, compression="zstd", dictionary=None) as w:
        for i in range(20):
            w.append([np.full(100, i), f"s{i}"])
    data = bytearray(path.read_bytes())
    (size,) = struct.unpack_from("<I", data, len(data) - 8)
    run_at, first, count = struct.unpack_from("<QQQ", data, len(data) - size + 132)
    assert (first, count) == (0, 20)
    at = run_at + 8 + 3 * 24  # record 3's locator
    logical, physical, span, position = struct.unpack_from("<QQII", data, at)
    assert span < 0xFFFFFFFF
    struct.pack_into("<QQII", data, at, logical, physical, 0xFFFFFFFF, position)
    group = bytes(data[run_at + 8 : run_at + 8 + 16 * 24])
    struct.pack_into("<I", data, run_at + 8 + 16 * 24, zstd_layout.checksum(group))
    path.write_bytes(data)
    with evs.open(path) as ds:
        assert ds.verify().problems == ["locator of record 3 disagrees with the index and frames"]


def test_verify_checks_run_frames_that_later_commits_merged_away(tmp_path):
    """A run frame that a later commit merged into a new one stays in the file, below the
    last commit, and no lookup reads it: verify did not either, so a change anywhere in it
    passed, even one that made stock zstd -d fail (its magic: no longer a skippable frame;
    attacker finding, session 13, round 16, C01). Every byte of it is now checked."""
    path = tmp_path / "f.evs.zst"
    with evs.Writer(path, compression="zstd", dictionary=None) as w:
        w.append([np.arange(7), "a"])
        w.commit()
        w.extend([[np.arange(3.0), "bb"], [np.arange(2), "c"]])
    good = path.read_bytes()
    with evs.open(path) as ds:
        source = ds._source
        blocks = list(zstd_layout.chain(source.reader, source.block, source.layout_end))
        assert len(source.block.runs) == 1  # the two commits' runs merged
        (dead,) = [
            r
            for b in blocks[1:]
            for r in b.runs
            if b.group_start <= r.offset < b.offset and r != source.block.runs[0]
        ]
    missed = []
    for at in range(dead.offset, dead.offset + zstd_layout.run_size(dead.count)):
        damaged = bytearray(good)
        damaged[at] ^= 0x80
        path.write_bytes(damaged)
        with evs.open(path) as ds:
            if ds.verify().ok:
                missed.append(at)
    assert missed == []


def test_overlapping_and_huge_locators_are_refused_and_verify_reports_them(tmp_path):
    path, recs = made(tmp_path)
    good = path.read_bytes()
    cases = {
        "into the middle of a frame": dict(physical_delta=5),
        "span past the file": dict(span=0xFFFFFFFE),
        "position past its frame": dict(position_delta=1 << 20),
        "onto another record": dict(logical_delta=-64),
        "physical past 2^63": dict(physical=1 << 63),
        "physical inside the layout frame": dict(physical=0),
    }
    for name, change in cases.items():
        path.write_bytes(good)
        block, _ = last_block(path)
        run = block.runs[-1]
        i = run.first + 3
        fd = os.open(path, os.O_RDONLY)
        reader = byteio.FdReader(fd, os.fstat(fd).st_size, owns_fd=True)
        group = reader.pread(run.offset + 8, zstd_layout.GROUP_BYTES)  # locators 0-15
        reader.close()
        logical, physical, span, position = LOCATOR.unpack_from(group, 3 * LOCATOR.size)
        fields = {}
        if "physical_delta" in change:
            fields["physical"] = physical + change["physical_delta"]
        if "physical" in change:
            fields["physical"] = change["physical"]
        if "span" in change:
            fields["span"] = change["span"]
        if "position_delta" in change:
            fields["position"] = position + change["position_delta"]
        if "logical_delta" in change:
            fields["logical"] = logical + change["logical_delta"]
        rewrite_locator(path, i, **fields)
        with evs.open(path) as ds:
            try:  # never silently wrong: right (the index's copy), or an error
                assert_same(ds[i], recs[i])
            except evs.FormatError:
                pass
            assert not ds.verify().ok, name
            assert_same(ds[i - 1], recs[i - 1])  # its neighbours read on


def test_huge_claims_allocate_nothing_big(tmp_path):
    """Under a 512 MiB address-space cap above the interpreter's, index blocks claiming
    2^32 frames or runs, locators claiming 4 GiB spans and frames declaring 1 GiB are
    refused with FormatError."""
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS and /proc are Linux's")
    path, _ = made(tmp_path)
    block, _ = last_block(path)
    good = path.read_bytes()
    files = []
    for change in (
        dict(frame_count=0xFFFFFFFF),
        dict(runs=[Run(block.runs[0].offset, 0, 1 << 40)], record_count=1 << 40),
        dict(largest=0xFFFFFFFF),
        dict(footer=Extent(block.footer.physical, block.footer.logical, 0xFFFFFFF0)),
    ):
        path.write_bytes(good)
        resign(path, **change)
        files.append(path.read_bytes())
    path.write_bytes(good)
    rewrite_locator(path, 5, span=0xFFFFFFFE)
    files.append(path.read_bytes())
    path.write_bytes(good)  # a data frame whose header declares 1 GiB over one raw block
    data = bytearray(good)
    body = bytes(range(256)) * 128
    liar = struct.pack("<IB", 0xFD2FB528, 0xE4) + struct.pack("<Q", 1 << 30)
    liar += struct.pack("<I", (len(body) << 3) | 1)[:3] + body + bytes(4)
    files.append(bytes(data) + liar)  # a crash tail for recovery to walk
    for k, blob in enumerate(files):
        (tmp_path / f"f{k}.evs.zst").write_bytes(blob)
    script = textwrap.dedent(
        f"""
        import resource, sys, glob, shutil
        import evalue_store as evs
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) * 1024
        limit = used + (512 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            bytearray(1 << 30)
            sys.exit("the limit does not hold")
        except MemoryError:
            pass
        for name in sorted(glob.glob({str(tmp_path)!r} + "/f*.evs.zst")):
            try:
                with evs.open(name) as ds:
                    for i in range(len(ds)):
                        try:
                            ds[i]
                        except evs.FormatError:
                            pass
                    ds.verify()
            except evs.FormatError:
                pass
            try:
                evs.recover(name)
            except evs.FormatError:
                pass
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# ------------------------------------------------------------------------------ layout 1


def test_layout_1_files_stay_readable_verifiable_and_appendable_in_their_layout(tmp_path):
    zstd_cli = shutil.which("zstd")
    path = tmp_path / "old.evs.zst"
    shutil.copy(FIXTURES / "zstd-v1.0.evs.zst", path)
    with evs.open(path) as ds:
        n = len(ds)
        before = [ds.raw(i).tobytes() for i in range(n)]
        assert ds.verify().ok
    with evs.Writer(path, mode="a") as w:
        w.append([np.arange(3), "appended"])
    data = path.read_bytes()
    assert data[-4:] == (0x8F92EAB1).to_bytes(4, "little")  # still ends with a seek table
    assert data[:4] != struct.pack("<I", zstd_layout.LAYOUT_MAGIC)
    with evs.open(path) as ds:
        assert len(ds) == n + 1 and ds[n][1] == "appended" and ds.verify().ok
        assert [ds.raw(i).tobytes() for i in range(n)] == before
    if zstd_cli:
        out = tmp_path / "old.evs"
        subprocess.run([zstd_cli, "-d", "-q", "-f", str(path), "-o", str(out)], check=True)
        with evs.open(out) as plain:
            assert len(plain) == n + 1 and plain.verify().ok


def test_died_before_the_first_commit_restarts_in_layout_2(tmp_path):
    path = tmp_path / "d.evs.zst"
    with evs.Writer(path, compression="zstd") as w:
        w.append([1])
    data = path.read_bytes()
    block, layout_end = last_block(path)
    # The header frame only: the writer died before its first index block.
    path.write_bytes(data[: block.first.physical + block.first.span])
    with pytest.raises(evs.FormatError):
        evs.open(path)
    with evs.Writer(path, mode="a") as w:
        assert w.salvage is not None
        w.append([2])
    with evs.open(path) as ds:
        assert ds.compressed and ds[0] == [2] and len(ds) == 1


def test_a_bad_layout_frame_size_is_named_as_such(tmp_path):
    """FRAMES.md: a Frame_Size other than 12 + D is rejected; the error names that field
    and its offset (4), not the dictionary, which may be fine."""
    path, _ = made(tmp_path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, 0xFFFFFFF0)
    path.write_bytes(data)
    with pytest.raises(evs.FormatError, match="Frame_Size 4294967280 is not 12") as err:
        evs.open(path)
    assert err.value.offset == 4


def reframed(plain: bytes, cuts: list[int], entries: list[tuple[int, int]]) -> bytes:
    """``plain`` (a container of one commit) as a layout-2 file of one data frame between
    each two ``cuts`` (FRAMES.md sections 2-6; ``entries``: each record's logical offset
    and frame bytes): frame boundaries a writer would not choose, which readers must accept."""
    import zstandard

    compressor = zstandard.ZstdCompressor(level=1, write_checksum=True, write_content_size=True)
    out = bytearray(zstd_layout.layout_frame(None))
    layout_end = len(out)
    frames = []  # (file offset, logical offset, logical size, compressed size)
    bounds = sorted({0, *cuts, len(plain)})
    for lo, hi in zip(bounds, bounds[1:]):
        data = compressor.compress(plain[lo:hi])
        frames.append((len(out), lo, hi - lo, len(data)))
        out += data

    def frame_of(logical: int) -> int:
        return next(k for k, f in enumerate(frames) if f[1] <= logical < f[1] + f[2])

    def extent(logical: int, size: int) -> tuple[int, int, int]:
        first, last = frames[frame_of(logical)], frames[frame_of(logical + size - 1)]
        return first[0], first[1], last[0] + last[3] - first[0]

    locators = np.zeros(len(entries), zstd_layout.LOCATOR_DTYPE)
    for k, (logical, size) in enumerate(entries):
        phys, start, span = extent(logical, size)
        locators[k] = (logical, phys, span, logical - start)
    run_at = len(out)
    out += zstd_layout.run_frame(locators)
    map_at = len(out)
    out += zstd_layout.encode_map([f[3] for f in frames], [f[2] for f in frames])
    footer_size = struct.unpack_from("<I", plain, len(plain) - 16)[0]
    fields = dict(
        group_start=layout_end,
        logical_start=0,
        logical_end=len(plain),
        previous=0,
        record_count=len(entries),
        map_offset=map_at,
        frame_count=len(frames),
        first_logical_size=frames[0][2],
        largest=max(f[2] for f in frames),
        footer=extent(len(plain) - footer_size, footer_size),
        metadata=(0, 0, 0),
        first=(frames[0][0], 0, frames[0][3]),
    )
    out += zstd_layout.encode_block(fields, [Run(run_at, 0, len(entries))])
    return bytes(out)


@pytest.mark.parametrize("cut", range(1, 16))
def test_a_record_header_across_two_frames_reads(tmp_path, cut):
    """FRAMES.md section 3: readers accept any frame boundaries. A frame boundary inside a
    record's 16-byte frame header: ds[i], get_many, get_batch, the scan and verify give
    the record (attacker finding: ds[i] raised AttributeError)."""
    plain_path = tmp_path / "p.evs"
    recs = [[np.arange(i, i + 8), i, f"ex-{i}"] for i in range(4)]
    with evs.Writer(plain_path) as w:
        w.extend(recs)
    with evs.open(plain_path) as plain:
        entries = [
            (int(e["offset"]), 16 + int(e["length"])) for s in plain.iter_entries() for e in s
        ]
    cuts = [offset for offset, _ in entries] + [entries[2][0] + cut]
    path = tmp_path / "x.evs.zst"
    path.write_bytes(reframed(plain_path.read_bytes(), cuts, entries))
    with evs.open(path) as ds:
        assert ds.verify().ok
        for got in (ds[2], ds.get_many([2])[0], list(ds)[2]):
            assert_same(got, recs[2])
        batch = ds.get_batch([2, 1])
        np.testing.assert_array_equal(batch[0], np.stack([recs[2][0], recs[1][0]]))
        assert list(batch[2]) == [recs[2][2], recs[1][2]]
