"""Black-box attacks on `evalue-store export --format npz` with unusual field names."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import evalue_store as evs


@pytest.mark.parametrize(
    "record",
    [
        {"allow_pickle": 1, "y": 2},  # silently dropped: np.savez's own keyword
        {"file": np.arange(3), "x": 1},  # "internal error TypeError: savez() got multiple ..."
        {"a.npy": 1, "a": 2},  # comes back as {"a.npy": 2, "a": 2}: a wrong value
        {"a\x00b": 1, "c": 2},  # comes back named "a"
    ],
    ids=["allow_pickle", "file", "a.npy", "nul"],
)
def test_export_npz_then_pack_gives_the_same_records(tmp_path, record):
    """CLI.md: "`--format npz` writes one .npz per record, keys from the field names ..., so
    packing the folder again gives the same records." Field names are any distinct strings
    (FORMAT.md section 7), and the Writer accepts these ones.

    A field named like a keyword of numpy's savez is lost without an error (exit 0) or
    crashes export; names that numpy's .npz member naming confuses come back with another
    field's value or another name."""
    src = tmp_path / "in.evs"
    with evs.Writer(src, "w") as w:
        w.append(record)
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "evalue_store", "export", str(src), "--to", str(out)]
        + ["--format", "npz", "-q"],
        capture_output=True,
        text=True,
    )
    assert "internal error" not in p.stderr, p.stderr
    if p.returncode != 0:
        return  # refusing, with a reason, is fine; losing or changing values is not
    back = tmp_path / "back.evs"
    p = subprocess.run(
        [sys.executable, "-m", "evalue_store", "pack", str(out), "-o", str(back), "-q"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    got = evs.open(back, as_dict=True)[0]
    assert list(got) == list(record), f"names: {list(got)} != {list(record)}"
    for name, value in record.items():
        assert np.array_equal(np.asarray(got[name]), np.asarray(value)), (name, got[name], value)
