#!/usr/bin/env python3
"""Bit rot: random bit flips and byte overwrites anywhere in plain and compressed files.

Each trial damages one byte of a four-commit file (with metadata, records of many kinds,
one 150 KB tensor) and classifies the result:

* ``refused``: ``evs.open`` raises FormatError;
* ``detected``: the file opens and ``verify()`` reports a problem (or it opens at an
  earlier commit and reports the tail); reads of damaged records raise FormatError;
* ``clean``: ``verify()`` finds nothing, and then every record and the metadata must be
  byte-identical to what was written (a change nothing reads).

Whatever the class, every record that reads without an error must be exactly what was
written: never silently wrong data. For plain files each position is also classed as
covered by a checksum (header, live records, index segments, metadata, every footer of
the chain) or not (zero padding between blocks, superseded metadata blocks); a change in
covered bytes that comes out ``clean`` is a failure.

Usage::

    python tools/bitrot.py --trials 20000 --seed 1          # plain and zstd
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import evalue_store as evs
from evalue_store.physical import zstd_layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kill_writers import record, same  # noqa: E402

METADATA = {"v": 2}


FIRST = 1  # record i of the file is kill_writers.record(i + FIRST): small records only


def build(path: Path, compression: str | None) -> int:
    """The test file: commits of 4, 3, 5, 2 records, metadata changed at the last one."""
    with evs.Writer(path, compression=compression, frame_size=4096, metadata={"v": 1}) as w:
        n = 0
        for size in (4, 3, 5, 2):
            w.extend(record(i + FIRST) for i in range(n, n + size))
            n += size
            w.commit()
        w.set_metadata(METADATA)
    return n


def zstd_regions(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, name) of every part of a compressed (layout 2) file: the layout frame,
    each data frame's header, blocks and content checksum, and each commit's run frame,
    map frame and index block."""
    import zstandard

    data = path.read_bytes()
    with evs.open(path) as ds:
        source = ds._source
        phys, _, csizes, _ = source._frame_map()
        block = source.block
        blocks = [block]
        while block.previous:
            block = zstd_layout.read_block(source.reader, block.group_start, source.layout_end)
            blocks.append(block)
        regions = [(0, source.layout_end, "layout frame")]
    for a, n in zip(phys.tolist(), csizes.tolist()):
        h = zstandard.frame_header_size(data[a : a + n])
        regions += [(a, a + h, "frame header"), (a + h, a + n - 4, "frame blocks")]
        regions.append((a + n - 4, a + n, "frame checksum"))
    for block in blocks:
        runs_here = [r.offset for r in block.runs if r.offset >= block.group_start]
        if runs_here:
            regions.append((runs_here[-1], block.map_offset, "run frame"))
        regions.append((block.map_offset, block.offset, "map frame"))
        regions.append((block.offset, block.end, "index block"))
    return regions


def covered_ranges(ds) -> list[tuple[int, int]]:
    """Bytes of a plain file some checksum covers: the header, live records, the live
    index, the live metadata, every footer of the chain and the segments they name."""
    from evalue_store.container import parse_footer_from

    ranges = [(0, 54 + len(ds.header.writer.encode()))]  # H = 54 + W, its crc included
    for e in ds.entries():
        ranges.append((int(e["offset"]), int(e["offset"]) + 16 + int(e["length"])))
    c = ds.commit
    if c.metadata_length:
        ranges.append((c.metadata_offset, c.metadata_offset + c.metadata_length))
    while True:
        ranges.append((c.footer_offset, c.end))
        ranges += [(s.offset, s.offset + 24 * s.count) for s in c.segments]
        if not c.prev_footer:
            break
        c = parse_footer_from(ds._source.read, c.prev_footer, c.footer_offset, ds.header)
    return ranges


class SilentlyWrong(AssertionError):
    pass


def outcome(path: Path, n: int) -> tuple[str, int]:
    """('refused' | 'detected' | 'clean', records whose read raised FormatError)."""
    try:
        ds = evs.open(path)
    except evs.FormatError:
        return "refused", 0
    with ds:
        report = ds.verify()
        raised = 0
        if len(ds) > n:
            raise SilentlyWrong(f"{len(ds)} records, only {n} were written")
        for i in range(len(ds)):
            try:
                got = ds[i]
            except evs.FormatError:
                raised += 1
                continue
            if not same(got, i + FIRST):
                raise SilentlyWrong(f"record {i} reads without error but differs")
        bad = {i for i, _ in report.bad_records}
        if raised != len(bad):
            raise SilentlyWrong(f"{raised} reads raised, verify names {sorted(bad)}")
        if report.ok and (len(ds) != n or ds.metadata != METADATA):
            raise SilentlyWrong("verify is clean but the file is not what was written")
        return ("clean" if report.ok else "detected"), raised


def campaign(directory: str, compression: str | None, trials: int, seed: int) -> dict:
    """Damage one byte per trial; returns the tally and the failures."""
    path = Path(directory) / ("rot.evs.zst" if compression else "rot.evs")
    n = build(path, compression)
    data = path.read_bytes()
    covered = regions = None
    if not compression:
        with evs.open(path) as ds:
            covered = covered_ranges(ds)
    else:
        regions = zstd_regions(path)
    rng = random.Random(seed)
    tally: dict[str, int] = {}
    failures: list[str] = []
    reads_raised = 0
    for trial in range(trials):
        damaged = bytearray(data)
        pos = rng.randrange(len(data))
        if trial % 2:
            damaged[pos] ^= 1 << rng.randrange(8)
        else:
            damaged[pos] = (damaged[pos] + rng.randrange(1, 256)) % 256  # a different byte
        path.write_bytes(damaged)
        try:
            result, raised = outcome(path, n)
        except SilentlyWrong as exc:
            failures.append(f"byte {pos}: {exc}")
            continue
        reads_raised += raised
        if covered is not None:
            inside = any(a <= pos < b for a, b in covered)
            where = " (checksummed)" if inside else " (not checksummed)"
        else:
            where = " (" + next(name for a, b, name in regions if a <= pos < b) + ")"
        tally[result + where] = tally.get(result + where, 0) + 1
        if where == " (checksummed)" and result == "clean":
            failures.append(f"byte {pos}: change in checksummed bytes not detected")
    uncovered = None
    if covered is not None:
        marks = bytearray(len(data))
        for a, b in covered:
            marks[a:b] = b"\x01" * (b - a)
        uncovered = len(data) - sum(marks)
    return {
        "file_bytes": len(data),
        "uncovered_bytes": uncovered,
        "tally": tally,
        "reads_raised": reads_raised,
        "failures": failures,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5000, help="damaged bytes per format")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    bad = False
    with tempfile.TemporaryDirectory() as tmp:
        for compression in (None, "zstd"):
            start = time.monotonic()
            r = campaign(tmp, compression, args.trials, args.seed)
            name = compression or "plain"
            extra = ""
            if r["uncovered_bytes"] is not None:
                extra = f", {r['uncovered_bytes']} of them in no checksum"
            print(
                f"{name}: {args.trials} one-byte changes in a {r['file_bytes']}-byte file"
                f"{extra}, in {time.monotonic() - start:.0f} s"
            )
            for key, count in sorted(r["tally"].items()):
                print(f"  {key}: {count}")
            print(f"  reads of damaged records that raised FormatError: {r['reads_raised']}")
            print(f"  silently wrong data or undetected checksummed change: {len(r['failures'])}")
            for line in r["failures"][:20]:
                print("  FAIL", line)
            bad |= bool(r["failures"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
