"""Black-box attacks on ShardWriter / open_shards."""

from __future__ import annotations

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
