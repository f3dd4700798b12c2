"""Black-box attacks on the torch adapter (evalue_store.torch)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import evalue_store as evs


@pytest.mark.parametrize("shuffle", [True, False])
def test_iterable_dataset_does_not_allocate_what_a_manifest_claims(tmp_path, shuffle):
    """THREAT_MODEL: "Shard manifests are JSON and hostile too" and a hostile file cannot
    "Make the reader allocate what a header claims"; TRAINING.md: "When a shard opens, its
    record count and footer digest must match the manifest; otherwise FormatError".

    A 240-byte manifest that claims 2^33 records for a 3-record, 696-byte shard makes
    ShardedIterableDataset allocate a 64 GiB index array (shuffled or not) before any shard
    is opened and checked: MemoryError under a 1 GiB address-space cap; without one, 64 GiB
    of memory to fill (an OOM kill) instead of a FormatError."""
    with evs.ShardWriter(str(tmp_path / "s-{:03d}.evs"), max_records=5) as w:
        for i in range(3):
            w.append([i])
    manifest = json.loads((tmp_path / "s.manifest.json").read_text())
    manifest["records"] = manifest["shards"][0]["records"] = 1 << 33
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps(manifest))
    script = textwrap.dedent(
        f"""
        import resource
        pages = int(open('/proc/self/statm').read().split()[0])
        import evalue_store as evs
        from evalue_store.torch import ShardedIterableDataset
        cap = pages * 4096 + (1 << 30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        try:
            ds = ShardedIterableDataset({str(evil)!r}, shuffle={shuffle}, seed=0, batch_size=4)
            for _ in ds:
                pass
        except evs.FormatError as e:
            print("FormatError", e)
        """
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("FormatError"), (p.stdout, p.stderr[-500:])


@pytest.mark.parametrize("position", [500, 1.5])
def test_load_state_dict_refuses_a_position_state_dict_would_refuse(tmp_path, position):
    """TRAINING.md: loading a state "into a dataset that differs in any of them raises
    ValueError rather than resuming inexactly"; `state_dict(consumed=104)` on 103 records
    raises "position 104 is outside this rank's 103 records".

    `load_state_dict` takes position 500 (then yields nothing at all, silently) or 1.5 (a
    float: yields 102 records, as if 1), which the state_dict side would refuse or never
    produce."""
    from evalue_store.torch import ShardedIterableDataset

    with evs.ShardWriter(str(tmp_path / "d-{:03d}.evs"), max_records=7) as w:
        for i in range(103):
            w.append([i])
    ds = ShardedIterableDataset(str(tmp_path), shuffle=True, seed=1, batch_size=8)
    state = ds.state_dict(consumed=16)
    state["position"] = position
    fresh = ShardedIterableDataset(str(tmp_path), shuffle=True, seed=1, batch_size=8)
    with pytest.raises(ValueError):
        fresh.load_state_dict(state)


@pytest.mark.parametrize("second", [{"a": 1}, {"a": 1, "b": 2, "c": 3}, {"a": 1, "c": 2}])
def test_collate_names_dict_samples_whose_fields_differ(second):
    """collate took the first sample's keys: a missing one was a bare KeyError, an extra one
    was dropped without a word."""
    from evalue_store.torch import collate

    with pytest.raises(ValueError, match="sample 1 of the batch has fields"):
        collate([{"a": 0, "b": 1}, second])
