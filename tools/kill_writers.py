#!/usr/bin/env python3
"""Kill writers at random instants and tear commits at every byte; check no committed data is lost.

Killed writers (``--trials N``): a child process appends records that are a pure function
of their index (so any record can be checked byte for byte), one by one and, every fourth
block of COLUMN_BLOCK records, as columns (``extend_columns``: one layout, about 8 MiB,
written in batches by a second thread while the first encodes, the writeback of each
started as it goes), commits at random intervals and, around every ``commit()``, tells
the parent through a pipe: "commit of n records begins" and "commit of n records
returned". The parent SIGKILLs it at a random instant, then checks:

* the file opens (mmap and pread backends, alternately);
* every record the child reported committed is present and byte-identical, and nothing
  else is visible but whole records (a commit that was mid-way may or may not have landed);
* ``verify()`` finds no bad record, and reports only the uncommitted tail, if any;
* ``evs.recover`` commits only complete, checksum-valid records (each one equal to what
  the child wrote at that index), leaves no tail, and appending afterwards works.

Torn tails (``--torn``): a file whose last commit is cut, zero-filled or overwritten with
garbage from every byte position of that commit (records, index segment, metadata, footer
and, compressed, the footer's frame, the run and map frames and the half-written index
block) to its end: the file
opens at the previous commit, recovery keeps exactly the complete records, appending works.

Usage::

    python tools/kill_writers.py --trials 1000 --seed 1              # plain and zstd
    python tools/kill_writers.py --trials 500 --format zstd --spawn  # fresh interpreters
    python tools/kill_writers.py --torn                              # every byte position

The exit status is 1 if any check failed or any committed record was lost.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

import evalue_store as evs

MSG = struct.Struct("<cQ")  # b"B" (commit begins) or b"E" (commit returned), record count
TAIL_PROBLEM = "bytes after the last commit"


# ------------------------------------------------------------------------------ records


COLUMN_BLOCK = 64  # records i with (i // COLUMN_BLOCK) % 4 == 1 are written as columns


def in_column_block(i: int) -> bool:
    return (i // COLUMN_BLOCK) % 4 == 1


def record(i: int) -> list:
    """Record ``i``: a pure function of ``i``, of varied kinds and sizes."""
    if in_column_block(i):  # one layout: [Int, String of 13 bytes, int64[16384]]
        return [i, f"col-{i:09d}", np.arange(16384, dtype=np.int64) * (i % 1000 + 1)]
    rng = np.random.default_rng(i)
    values: list = [i, f"rec-{i}", rng.integers(-1000, 1000, i % 13, dtype=np.int64)]
    if i % 3 == 0:
        values.append(rng.random((2, i % 5), dtype=np.float32))
    if i % 5 == 0:
        values.append([bool(i & 1), True])
    if i % 7 == 0:
        values.append(bytes(rng.integers(0, 256, i % 40, dtype=np.uint8)))
    if i % 97 == 0:  # now and then a tensor big enough for the direct-write / big-frame paths
        values.append(np.full(150_000 + i % 1000, i % 251, dtype=np.uint8))
    return values


def same(got: list, i: int) -> bool:
    """True when ``got`` is exactly record ``i``: types, dtypes, shapes and bytes."""
    want = record(i)
    if not isinstance(got, list) or len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if isinstance(w, np.ndarray):
            if not isinstance(g, np.ndarray) or g.dtype != w.dtype or g.shape != w.shape:
                return False
            if g.tobytes() != w.tobytes():
                return False
        elif type(g) is not type(w) or g != w:
            return False
    return True


# ------------------------------------------------------------------------------ the child


FIRST_COMMIT = 500  # records a writer that creates its file commits first, compressed:
# enough frames for it to train a dictionary and rebuild the file (FRAMES.md section 7)


def writer_child(path: str, seed: int, fd: int, compression: str | None) -> None:
    """Append records forever, committing at random points, reporting each commit on ``fd``.
    A writer that creates the file (compressed: default frames and dictionary) commits its
    first FIRST_COMMIT records at once."""
    rng = random.Random(seed)
    fresh = not os.path.exists(path)
    options = {} if fresh else {"frame_size": 4096}
    w = evs.Writer(path, mode="a", compression=compression, **options)
    i = len(w)
    rate = rng.choice([0.02, 0.1, 0.3, 0.7])  # records per commit vary a lot between trials
    while True:
        if in_column_block(i):  # the rest of this block, as columns
            block = [record(j) for j in range(i, (i // COLUMN_BLOCK + 1) * COLUMN_BLOCK)]
            ints, texts, tokens = zip(*block)
            w.extend_columns({0: np.array(ints), 1: list(texts), 2: np.stack(tokens)})
            i += len(block)
        else:
            w.append(record(i))
            i += 1
        # FIRST_COMMIT is reached by append (it is no column block's end)
        if (rng.random() < rate and not (fresh and i < FIRST_COMMIT)) or (
            fresh and i == FIRST_COMMIT
        ):
            if rng.random() < 0.1:
                w.set_metadata({"records": i, "seed": seed})
            os.write(fd, MSG.pack(b"B", len(w)))
            w.commit()
            os.write(fd, MSG.pack(b"E", len(w)))


def _spawned_child() -> None:
    path, seed, fd, compression = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    try:
        writer_child(path, seed, fd, None if compression == "plain" else compression)
    finally:
        os._exit(1)


# ------------------------------------------------------------------------------ one trial


@dataclass
class Stats:
    trials: int = 0
    kills_mid_commit: int = 0  # killed after "commit begins" and before it returned
    mid_commit_landed: int = 0  # ... and the footer was durable anyway
    kills_between_commits: int = 0
    kills_in_columns: int = 0  # the salvaged records end inside a block written as columns
    committed_checked: int = 0  # records reported committed, checked byte for byte
    records_checked: int = 0  # every record read back (committed + landed + salvaged)
    lost: int = 0  # committed records missing or different: must stay 0
    salvaged: int = 0
    tails: int = 0  # kills that left bytes after the last commit
    failures: list = field(default_factory=list)

    def add(self, other: Stats) -> None:
        for name in self.__dataclass_fields__:
            if name != "failures":
                setattr(self, name, getattr(self, name) + getattr(other, name))
        self.failures += other.failures


def _check_all(ds, n: int, stats: Stats, what: str) -> bool:
    ok = True
    for i in range(n):
        try:
            good = same(ds[i], i)
        except evs.FormatError as exc:
            good = False
            stats.failures.append(f"{what}: record {i} raised {exc}")
        if not good:
            ok = False
            stats.failures.append(f"{what}: record {i} differs from what was written")
            break
        stats.records_checked += 1
    return ok


def run_trial(
    path: str,
    trial: int,
    rng: random.Random,
    compression: str | None,
    *,
    spawn: bool = False,
    max_delay: float = 0.3,
) -> Stats:
    """Start a writer on ``path``, kill it at a random instant, check the file."""
    st = Stats(trials=1)
    fresh = not os.path.exists(path)  # the child creates it
    if fresh:
        start = 0
    else:
        with evs.open(path) as ds:
            start = len(ds)
    read_end, write_end = os.pipe()
    if spawn:
        cmd = [sys.executable, __file__, "--child", path, str(trial), str(write_end)]
        cmd.append(compression or "plain")
        child = subprocess.Popen(cmd, pass_fds=(write_end,))
        pid = child.pid
        time.sleep(0.25)  # the interpreter's start-up, so kills land in the writer
    else:
        pid = os.fork()
        if pid == 0:  # the child never returns into the caller (pytest, say)
            try:
                os.close(read_end)
                writer_child(path, trial, write_end, compression)
            finally:
                os._exit(1)
    os.close(write_end)
    short = min(0.06, max_delay)  # most kills early, in small files; some after long runs
    time.sleep(rng.uniform(0.0, short) if rng.random() < 0.8 else rng.uniform(short, max_delay))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    blob = b"".join(chunks)
    messages = [MSG.unpack_from(blob, k) for k in range(0, len(blob) - len(blob) % MSG.size, 9)]
    committed = max([n for kind, n in messages if kind == b"E"], default=None)
    began = messages[-1][1] if messages and messages[-1][0] == b"B" else None
    where = f"trial {trial} ({compression or 'plain'})"
    if fresh and not os.path.exists(path):  # killed before the file took its name
        if committed is not None:
            st.failures.append(f"{where}: {committed} records committed, and no file")
        return st

    ds = evs.open(path, backend="pread" if trial % 2 else "mmap")
    floor = committed if committed is not None else start
    if began is not None:
        st.kills_mid_commit += 1
        if len(ds) == began:
            st.mid_commit_landed += 1
        elif len(ds) != floor:
            st.failures.append(f"{where}: {len(ds)} records, expected {floor} or {began}")
    else:
        st.kills_between_commits += 1
        if len(ds) != floor:
            st.failures.append(f"{where}: {len(ds)} records visible, {floor} committed")
    if len(ds) < floor:
        st.lost += floor - len(ds)
    st.committed_checked += min(floor, len(ds))
    if not _check_all(ds, len(ds), st, where):
        st.lost += 1
    report = ds.verify()
    if report.bad_records or any(TAIL_PROBLEM not in p for p in report.problems):
        st.failures.append(f"{where}: verify {report.bad_records[:3]} {report.problems[:3]}")
    st.tails += bool(ds.uncommitted_bytes)
    visible = len(ds)
    ds.close()

    before = path + ".before-recover"  # kept when a check after recovery fails
    shutil.copyfile(path, before)
    failures = len(st.failures)
    salvage = evs.recover(path)
    st.salvaged += salvage.salvaged_records
    if salvage.committed_records != visible:
        st.failures.append(f"{where}: recover saw {salvage.committed_records} committed")
    if salvage.side_file:
        os.remove(salvage.side_file)
    ds = evs.open(path)
    n = len(ds)
    if n != visible + salvage.salvaged_records or ds.uncommitted_bytes:
        st.failures.append(f"{where}: after recover {n} records, tail {ds.uncommitted_bytes}")
    st.kills_in_columns += in_column_block(n) and n % COLUMN_BLOCK != 0
    fresh = range(visible, n)  # the salvaged records must be exactly what was written
    for i in fresh:
        if not same(ds[i], i):
            st.failures.append(f"{where}: salvaged record {i} is not what was written")
            break
        st.records_checked += 1
    if not ds.verify().ok:
        st.failures.append(f"{where}: verify after recover: {ds.verify().problems[:3]}")
    ds.close()
    with evs.Writer(path, mode="a") as w:  # appending after a kill and a recovery works
        w.append(record(n))
    ds = evs.open(path)
    if len(ds) != n + 1 or not same(ds[n], n):
        st.failures.append(f"{where}: append after recovery failed")
    ds.close()
    if len(st.failures) > failures:
        kept = f"{path}.trial-{trial}.before-recover"
        os.replace(before, kept)
        st.failures.append(f"{where}: the file as the kill left it is {kept}")
    else:
        os.remove(before)
    return st


def kill_campaign(
    directory: str,
    trials: int,
    seed: int,
    compression: str | None,
    *,
    per_file: int = 20,
    spawn: bool = False,
    deadline: float | None = None,
    max_delay: float = 0.3,
) -> Stats:
    """``trials`` kills; a fresh file every ``per_file`` trials keeps the checks O(trials).
    The first writer of every other file creates it (a compressed one trains its dictionary
    and rebuilds the file, which kills may interrupt); else the file starts empty."""
    rng = random.Random(seed)
    total = Stats()
    suffix = ".evs.zst" if compression else ".evs"
    for trial in range(trials):
        if deadline is not None and time.monotonic() > deadline:
            break
        path = os.path.join(directory, f"kill-{seed}-{trial // per_file}{suffix}")
        if trial % per_file == 0 and trial // per_file % 2:
            evs.Writer(path, compression=compression, frame_size=4096).close()
        trial_seed = seed * 1_000_003 + trial
        total.add(run_trial(path, trial_seed, rng, compression, spawn=spawn, max_delay=max_delay))
        if trial % per_file == per_file - 1:
            os.remove(path)
    return total


# ------------------------------------------------------------------------------ torn tails


@dataclass
class TornStats:
    cases: int = 0  # (position, fill) pairs opened and checked
    recovered: int = 0  # of those, also recovered and appended to
    by_region: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)


def _torn_file(path: str, compression: str | None) -> tuple[bytes, int, int, int, dict]:
    """A file of two commits; returns (bytes, end of commit 1, records after commit 1,
    records after commit 2, regions of the last commit: name -> (start, end))."""
    with evs.Writer(path, compression=compression, frame_size=4096, metadata={"c": 1}) as w:
        w.extend(record(i) for i in range(3))
        w.commit()
        prev_end = os.path.getsize(path)
        w.extend(record(i) for i in range(3, 6))
        w.set_metadata({"c": 2})
    data = open(path, "rb").read()
    ds = evs.open(path)
    regions = {}
    if compression:
        block = ds._source.block
        runs_here = [r.offset for r in block.runs if r.offset >= block.group_start]
        data_end = runs_here[-1] if runs_here else block.map_offset
        regions["data frames"] = (prev_end, block.footer.physical)
        regions["last frame (footer)"] = (block.footer.physical, data_end)
        regions["run and map frames"] = (data_end, block.offset)
        regions["index block"] = (block.offset, block.end)
    else:
        c = ds.commit
        seg = c.segments[-1]
        regions["records"] = (prev_end, seg.offset)
        regions["index segment"] = (seg.offset, c.metadata_offset)
        regions["metadata"] = (c.metadata_offset, c.footer_offset)
        regions["footer"] = (c.footer_offset, c.end)
    ds.close()
    return data, prev_end, 3, 6, regions


def torn_tails(
    directory: str, compression: str | None, *, stride: int = 1, recover_stride: int = 1
) -> TornStats:
    """Tear the last commit at every ``stride``-th byte: cut there, zero-fill from there, or
    overwrite from there with bytes that all differ from the original ones."""
    st = TornStats()
    suffix = ".evs.zst" if compression else ".evs"
    path = os.path.join(directory, "torn-src" + suffix)
    data, prev_end, prev_count, count, regions = _torn_file(path, compression)
    work = os.path.join(directory, "torn" + suffix)
    rng = random.Random(5)
    noise = bytes(rng.randrange(1, 256) for _ in range(len(data)))
    for k, pos in enumerate(range(prev_end, len(data), stride)):
        region = next(name for name, (a, b) in regions.items() if a <= pos < b)
        tail = data[pos:]
        fills = {
            "cut": b"",
            "zeros": bytes(len(tail)),
            "garbage": bytes(a ^ b for a, b in zip(tail, noise)),
        }
        for fill_name, fill in fills.items():
            where = f"{compression or 'plain'} {fill_name} at {pos} ({region})"
            with open(work, "wb") as f:
                f.write(data[:pos] + fill)
            st.cases += 1
            st.by_region[region] = st.by_region.get(region, 0) + 1
            try:
                ds = evs.open(work, backend="pread" if k % 2 else "mmap")
            except Exception as exc:  # noqa: BLE001 - any failure to open is a finding
                st.failures.append(f"{where}: open raised {exc!r}")
                continue
            if len(ds) != prev_count or not all(same(ds[i], i) for i in range(len(ds))):
                st.failures.append(f"{where}: {len(ds)} records, expected {prev_count}")
            if ds.metadata != {"c": 1}:
                st.failures.append(f"{where}: metadata {ds.metadata}")
            ds.close()
            if k % recover_stride:
                continue
            st.recovered += 1
            try:
                salvage = evs.recover(work)
                if salvage.side_file:
                    os.remove(salvage.side_file)
                ds = evs.open(work)
                n = len(ds)
                good = prev_count <= n <= count and ds.uncommitted_bytes == 0 and ds.verify().ok
                good = good and all(same(ds[i], i) for i in range(n))
                ds.close()
                with evs.Writer(work, mode="a") as w:
                    w.append(record(n))
                ds = evs.open(work)
                good = good and len(ds) == n + 1 and same(ds[n], n)
                ds.close()
                if not good:
                    st.failures.append(f"{where}: recovery or append went wrong ({n} records)")
            except Exception as exc:  # noqa: BLE001
                st.failures.append(f"{where}: recovery raised {exc!r}")
    return st


# ------------------------------------------------------------------------------ command line


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _spawned_child()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="kills per format")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--format", choices=["plain", "zstd", "both"], default="both")
    parser.add_argument("--per-file", type=int, default=20, help="trials before a fresh file")
    parser.add_argument("--spawn", action="store_true", help="fresh interpreter per writer")
    parser.add_argument("--torn", action="store_true", help="also tear every byte of a commit")
    parser.add_argument("--torn-only", action="store_true", help="only the torn-tail cases")
    parser.add_argument("--dir", help="work directory (default: a temporary one)")
    args = parser.parse_args()
    formats = {"plain": [None], "zstd": ["zstd"], "both": [None, "zstd"]}[args.format]
    directory = args.dir or tempfile.mkdtemp(prefix="evs-kill-")
    os.makedirs(directory, exist_ok=True)
    bad = False
    try:
        for compression in formats:
            name = compression or "plain"
            if not args.torn_only:
                start = time.monotonic()
                st = kill_campaign(
                    directory,
                    args.trials,
                    args.seed,
                    compression,
                    per_file=args.per_file,
                    spawn=args.spawn,
                )
                print(
                    f"{name}: {st.trials} kill trials in {time.monotonic() - start:.0f} s; "
                    f"kills mid-commit {st.kills_mid_commit} (commit landed anyway in "
                    f"{st.mid_commit_landed}), between commits {st.kills_between_commits}, "
                    f"inside a block of columns {st.kills_in_columns}; "
                    f"committed records checked {st.committed_checked}; records read back "
                    f"{st.records_checked}; data lost {st.lost}; tails left {st.tails}; "
                    f"salvaged {st.salvaged}; failures {len(st.failures)}"
                )
                for line in st.failures[:20]:
                    print("  FAIL", line)
                bad |= bool(st.failures) or st.lost > 0
            if args.torn or args.torn_only:
                start = time.monotonic()
                torn = torn_tails(directory, compression)
                regions = ", ".join(f"{k} {v}" for k, v in torn.by_region.items())
                print(
                    f"{name}: {torn.cases} torn-tail cases (cut / zero-fill / garbage at every "
                    f"byte of the last commit: {regions}), {torn.recovered} also recovered and "
                    f"appended to, in {time.monotonic() - start:.0f} s; failures "
                    f"{len(torn.failures)}"
                )
                for line in torn.failures[:20]:
                    print("  FAIL", line)
                bad |= bool(torn.failures)
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
