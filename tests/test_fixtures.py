"""Files written by format 1.0 must keep reading the same (tools/make_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs

FIXTURES = Path(__file__).parent / "fixtures"


def describe(value) -> object:
    """A JSON form of a decoded value (tools/make_fixtures.py stores the expected ones)."""
    if isinstance(value, np.ndarray):
        return {
            "dtype": "bfloat16" if value.dtype == evs.BFLOAT16 else value.dtype.name,
            "shape": list(value.shape),
            "strides_c": bool(value.flags.c_contiguous),
            "hex": np.ascontiguousarray(value).tobytes().hex(),
        }
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, list):
        return [describe(v) for v in value]
    return value


@pytest.mark.parametrize("name", ["plain-v1.0.evs", "zstd-v1.0.evs.zst"])
def test_fixture_reads_as_written(name):
    expected = json.loads((FIXTURES / "expected-v1.0.json").read_text())
    with evs.open(FIXTURES / name) as ds:
        assert ds.metadata == {"fixture": name}
        assert ds.commit.number == 3  # creation, then two commits
        assert [[describe(v) for v in record] for record in ds] == expected
        assert ds.verify().ok
