"""Black-box attacks on ShardWriter / open_shards."""

from __future__ import annotations

import os
import stat

import pytest

import evalue_store as evs


def test_rerunning_a_job_that_writes_nothing_keeps_the_finished_jobs_manifest(tmp_path):
    """TRAINING.md: "Shards are created with mode "x": rerunning a job into the same place
    fails instead of mixing old and new shards (`overwrite=True` to replace)."

    A rerun whose input happens to be empty (a filter that now matches nothing, a crashed
    upstream step) does not fail: its close() silently replaces the finished job's manifest
    with one of 0 records, so the dataset read through the manifest is now empty.
    """
    pattern = str(tmp_path / "train-{:05d}.evs")
    with evs.ShardWriter(pattern, max_records=3) as w:
        for i in range(10):
            w.append([i])
    manifest = tmp_path / "train.manifest.json"
    assert len(evs.open_shards(manifest)) == 10
    try:
        with evs.ShardWriter(pattern, max_records=3):
            pass  # the rerun has nothing to write
    except (evs.Error, OSError):
        pass  # refusing the rerun is what the doc promises
    assert len(evs.open_shards(manifest)) == 10


def test_parallel_writers_with_their_own_patterns_get_their_own_manifests(tmp_path):
    """TRAINING.md, "Parallel writers": "Give each process its own pattern; each writes its
    own manifest. When all are done, merge them (or pass them all to open_shards)".

    Two distinct patterns that differ after the placeholder ("...-{:05d}-part0.evs" and
    "...-{:05d}-part1.evs") both write train.manifest.json: the second overwrites the first
    without an error, and merging the manifests loses the first writer's records.
    """
    for part in range(2):
        with evs.ShardWriter(str(tmp_path / f"train-{{:05d}}-part{part}.evs"), max_records=5) as w:
            for i in range(4):
                w.append([part, i])
    manifests = sorted(tmp_path.glob("*.manifest.json"))
    evs.merge_manifests(str(tmp_path / "*.manifest.json"), str(tmp_path / "manifest.json"))
    ds = evs.open_shards(tmp_path / "manifest.json")
    assert len(ds) == 8, f"manifests {[m.name for m in manifests]}; merged dataset {len(ds)}"


def test_manifests_are_as_readable_as_the_shards_they_list(tmp_path):
    """TRAINING.md: close() "writes the manifest ... through a temporary file, fsync and
    os.replace", and `EValueDataset("data/")` / `open_shards` read a dataset through it.

    The shards are created with the usual permissions (0o666 & ~umask, here -rw-r--r--), but
    the manifest keeps its temporary file's -rw------- (and so does merge_manifests' output):
    any other user (a training job under another account, a shared data folder) can read
    every shard but not open the dataset."""
    old = os.umask(0o022)
    try:
        with evs.ShardWriter(str(tmp_path / "train-{:05d}.evs"), max_records=2) as w:
            for i in range(3):
                w.append([i])
        evs.merge_manifests(str(tmp_path / "train.manifest.json"), str(tmp_path / "all.json"))
    finally:
        os.umask(old)
    shard_mode = stat.S_IMODE((tmp_path / "train-00000.evs").stat().st_mode)
    assert shard_mode == 0o644
    for name in ("train.manifest.json", "all.json"):
        mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
        assert mode == shard_mode, f"{name} is {oct(mode)}, its shards {oct(shard_mode)}"


def test_overwrite_does_not_leave_the_old_runs_extra_shards_to_be_read(tmp_path):
    """TRAINING.md: "Shards are created with mode "x": rerunning a job into the same place
    fails instead of mixing old and new shards (`overwrite=True` to replace)"; README reads
    such a folder with `EValueDataset("data/")` ("one file, a glob, a list, a directory or a
    manifest"; a directory without manifest.json means its *.evs files).

    An `overwrite=True` rerun that writes fewer shards than the first run leaves the first
    run's later shards in place, so the README's `EValueDataset("data/")` (or a glob) reads
    3 new records followed by 6 old ones: exactly the mix the doc says cannot happen."""
    pattern = str(tmp_path / "train-{:05d}.evs")
    with evs.ShardWriter(pattern, max_records=2) as w:
        for i in range(10):
            w.append(["old", i])
    with evs.ShardWriter(pattern, max_records=2, overwrite=True) as w:
        for i in range(3):
            w.append(["new", i])
    for source in (tmp_path, str(tmp_path / "train-*.evs")):
        got = [tuple(r) for r in evs.open_shards(source)]
        assert got == [("new", 0), ("new", 1), ("new", 2)], (source, got)


def test_a_shard_writer_with_a_relative_pattern_survives_chdir(tmp_path):
    """TRAINING.md: `ShardWriter("data/train-{:05d}.evs", ...)` rolls shards and writes a
    manifest. With a relative pattern, an `os.chdir` during the job (Hydra and other
    launchers change directory; so does user code) makes the next roll fail with
    FileNotFoundError: the finished shard is looked up by its relative name in the new
    directory. (`open_shards` resolves its paths at open; the Writer uses absolute paths.)"""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    old = os.getcwd()
    try:
        os.chdir(tmp_path / "a")
        with evs.ShardWriter("s-{:03d}.evs", max_records=1) as w:
            w.append([1])
            os.chdir(tmp_path / "b")
            w.append([2])
    finally:
        os.chdir(old)
    assert [r[0] for r in evs.open_shards(tmp_path / "a" / "s.manifest.json")] == [1, 2]


def test_a_pattern_with_two_placeholders_is_a_clear_value_error(tmp_path):
    """ShardWriter("x-{}-{}.evs") raised a bare IndexError from str.format."""
    for pattern in ("x-{}-{}.evs", "x-{[0]}.evs", "x-{.nothing}.evs"):
        with pytest.raises(ValueError, match="one placeholder"):
            evs.ShardWriter(str(tmp_path / pattern))
