"""Power loss during commits: every crash state of the commit protocol keeps every commit
that returned (docs/THREAT_MODEL.md, "Power loss"). tools/crash_states.py runs the long form.
"""

from __future__ import annotations

import contextlib
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.dataset import columns
from evalue_store.physical import plain

from .crashsim import crash_points, crash_states, expected_count, markers, record
from .test_cli import same_record as same


def sample(i: int) -> list:
    """Record i of every workload: a pure function of its index, so any read can be checked."""
    values = [np.arange(i % 37 + 1, dtype=np.int64) * i, f"r{i}", float(i)]
    if i % 5 == 0:
        values.append(np.full(1500, i, dtype=np.float32))  # spans pages
    return values


COLUMN_RECORDS = 24  # written by one extend_columns, in batches of a few records


def column_sample(i: int) -> list:
    """Record i when it was written as a column (one layout for all of them)."""
    return [np.arange(300, dtype=np.int64) + i, f"c{i:06d}"]


@contextlib.contextmanager
def small_batches() -> Iterator[None]:
    """extend_columns writes batches of 8 KiB of frames, each by the write-behind thread
    (production batches are 4 MiB: the same code path, too big for the explorer)."""
    saved = columns.CHUNK_BYTES, plain.PlainSink.DIRECT_BYTES
    columns.CHUNK_BYTES, plain.PlainSink.DIRECT_BYTES = 8 << 10, 4 << 10
    try:
        yield
    finally:
        columns.CHUNK_BYTES, plain.PlainSink.DIRECT_BYTES = saved


def workload(path: str, compression: str | None, big: bool = False, scale: int = 1, first: int = 0):
    """Commits of many sizes (index segments merge), a metadata change, a reopen with
    mode "a", an aborted batch, columns written in batches behind the caller (a durable
    writer starts the writeback of each as it goes) and, with ``big``, a record written
    past the write buffer. ``scale`` multiplies the records per commit; ``first`` records are
    committed first (enough, compressed, for the writer to train a dictionary and rebuild
    the file)."""

    def run(returned) -> None:
        with evs.Writer(path, compression=compression, metadata={"k": 0}) as w:
            returned(w)
            if first:
                w.extend(sample(i) for i in range(first))
                w.commit()
                returned(w)
            for c in range(7):
                for _ in range((c % 3 + 1) * scale):
                    w.append(sample(len(w)))
                if c == 4:
                    w.set_metadata({"k": c})
                w.commit()
                returned(w)
        with evs.Writer(path, "a") as w:
            if big:
                w.append([np.zeros(300_000, np.float32) + len(w)])
                w.commit()
                returned(w)
            w.append(sample(len(w)))
        returned(w)
        try:
            with evs.Writer(path, "a") as w:
                w.extend([ABANDONED] * 3)
                raise RuntimeError("abandon the batch")
        except RuntimeError:
            pass
        with evs.Writer(path, "a") as w:
            w.append(sample(len(w)))
            w.commit()
            returned(w)
        with evs.Writer(path, "a") as w, small_batches():
            start = len(w)
            batch = [column_sample(i) for i in range(start, start + COLUMN_RECORDS)]
            w.extend_columns({0: np.stack([r[0] for r in batch]), 1: [r[1] for r in batch]})
            w.commit()
            returned(w)
            w.append(sample(len(w)))
        returned(w)

    return run


ABANDONED = [np.full(100, -1.0)]  # the aborted batch's records


def big_index(scale: int, first: int = 0) -> int:
    """Where the big record goes: after the seven commits of 1, 2, 3, 1, 2, 3, 1 (x scale)."""
    return first + 13 * scale


def columns_index(scale: int, big: bool, first: int = 0) -> int:
    """Where the columns go: after the big record, if any, and two records appended."""
    return big_index(scale, first) + big + 2


def expected_record(i: int, big_at: int | None, columns_at: int) -> list:
    if big_at is not None and i == big_at:
        return [np.zeros(300_000, np.float32) + i]
    if columns_at <= i < columns_at + COLUMN_RECORDS:
        return column_sample(i)
    return sample(i)


def check_image(image: bytes, want: int, folder: Path, big_at: int | None, columns_at: int) -> None:
    """The promise for one crash state; ``want`` = records of the newest surviving commit."""
    path = folder / "state.evs"
    path.write_bytes(image)
    if want < 0:  # no commit had survived: nothing to keep, only no crash and a clear error
        try:
            with evs.open(path) as ds:
                assert len(ds) == 0
        except evs.FormatError:
            pass
        return
    with evs.open(path) as ds:
        assert len(ds) == want, f"opened {len(ds)} records, the newest intact commit has {want}"
        for i in range(want):
            assert same(ds[i], expected_record(i, big_at, columns_at)), f"record {i} differs"
    copy = folder / "recovered.evs"
    shutil.copyfile(path, copy)
    evs.recover(copy)
    with evs.open(copy) as ds:
        n = len(ds)
        assert n >= want
        for i in range(n):  # salvaged records too: complete ones only, and in order
            # a crash before the abort may leave the batch's complete frames, as a kill would
            salvaged_batch = i >= want and same(ds[i], ABANDONED)
            expected = expected_record(i, big_at, columns_at)
            assert salvaged_batch or same(ds[i], expected), f"recovered record {i} differs"
    with evs.Writer(copy, "a") as w:
        w.append(sample(n))
    with evs.open(copy) as ds:
        assert len(ds) == n + 1 and same(ds[n], sample(n))
    for leftover in folder.glob("*.tail-*"):
        leftover.unlink()


def explore(
    tmp: Path,
    compression: str | None,
    subsets: int,
    seed: int,
    big: bool = False,
    scale: int = 1,
    first: int = 0,
) -> tuple[int, int]:
    """Run the workload, then check every crash state; returns (states, commits)."""
    path = tmp / ("w.evs.zst" if compression else "w.evs")
    log = record(str(path), workload(str(path), compression, big, scale, first))
    commits = markers(log)
    big_at = big_index(scale, first) if big else None
    rng = random.Random(seed)
    states = 0
    work = tmp / "states"
    work.mkdir()
    for point in crash_points(log):
        for image in crash_states(point, rng, subsets):
            want = expected_count(image, commits)
            assert want >= point.returned, "a returned commit's marker was not durable"
            try:
                check_image(image, want, work, big_at, columns_index(scale, big, first))
            except BaseException as exc:
                raise AssertionError(
                    f"crash after op {point.index} ({log.ops[point.index][0]}), state {states}: "
                    f"{exc}"
                ) from exc
            states += 1
    return states, len(commits)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_every_crash_state_keeps_every_returned_commit(tmp_path, compression):
    states, commits = explore(tmp_path, compression, subsets=12, seed=1, scale=3)
    assert commits >= 10 and states > 150


def test_a_file_rebuilt_with_its_trained_dictionary_keeps_every_returned_commit(tmp_path):
    """A new compressed file's writer trains a dictionary on its first frames and, at the
    first commit with records, rebuilds the file with it under a temporary name and renames
    it over the first: a power cut anywhere in that, or in the commits after it, leaves the
    name on a file holding every returned commit."""
    # 400 first records: a dictionary chosen at a commit counts its own bytes (FRAMES.md
    # section 7), and for 200 of these records none pays, so there was no rebuild to test
    states, commits = explore(tmp_path, "zstd", subsets=2, seed=2, first=400)
    assert commits >= 10 and states > 150
    with evs.open(tmp_path / "w.evs.zst") as ds:
        assert evs.read_dictionary(tmp_path / "w.evs.zst") and len(ds) > 200
