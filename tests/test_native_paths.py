"""The paths that checksum many records in one call (get_batch, the mapped scan,
extend_columns), and get_many and verify beside them: every record still checked, in both
checksum functions, and a bad one still named exactly as the per-record path names it."""

from __future__ import annotations

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.container import FRAME_SIZE
from evalue_store.errors import CHECKSUM

N = 700  # more than one checksum chunk (256) and one scan chunk (512)


def write(path, version: str, records: int = N) -> None:
    rng = np.random.default_rng(7)
    with evs.Writer(path, format_version=version) as w:
        w.extend_columns({0: rng.random((records, 40), dtype=np.float32), 1: np.arange(records)})
        w.append([np.zeros(3, np.int8), -1])  # a second layout, appended one by one
        w.append([np.ones(3, np.int8), -2])


def damage(path, record: int) -> None:
    """Flip a bit of the last payload byte of ``record`` (the top byte of its Int: it still
    decodes; its index entry and frame header are untouched)."""
    with evs.open(path) as ds:
        entry = ds.entries()[record]
    at = int(entry["offset"]) + FRAME_SIZE + int(entry["length"]) - 1
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x40]))


@pytest.fixture(params=["1.0", "1.1"])
def path(request, tmp_path):
    p = tmp_path / f"v{request.param}.evs"
    write(p, request.param)
    return p


def test_every_path_reads_back_what_was_written(path):
    rng = np.random.default_rng(7)
    data = rng.random((N, 40), dtype=np.float32)
    with evs.open(path) as ds:
        assert ds.verify().ok
        scanned = list(ds)
        assert [int(r[1]) for r in scanned] == [*range(N), -1, -2]
        assert np.array_equal(np.stack([r[0] for r in scanned[:N]]), data)
        picks = np.random.default_rng(1).integers(0, N, 600)
        batch = ds.get_batch(picks)
        assert np.array_equal(batch[0], data[picks]) and batch[1].tolist() == picks.tolist()
        many = ds.get_many(picks)
        assert [int(r[1]) for r in many] == picks.tolist()


@pytest.mark.parametrize("bad", [0, 255, 256, 511, 512, N - 1])
def test_a_bad_record_is_named_by_every_path(path, bad):
    damage(path, bad)
    with evs.open(path) as ds:
        report = ds.verify()
        assert [i for i, _ in report.bad_records] == [bad]
        assert "checksum" in report.bad_records[0][1]
        for read in (
            lambda: ds.get_many([N, bad - 1 if bad else 1, bad, N + 1]),
            lambda: ds.get_batch(np.arange(N)),
            lambda: list(ds),
            lambda: ds[bad],
        ):
            with pytest.raises(evs.FormatError) as err:
                read()
            assert err.value.record == bad and err.value.code == CHECKSUM
        good = [i for i in range(N) if i != bad]
        assert [int(r[1]) for r in ds.get_many(good)] == good
    with evs.open(path, verify=False) as ds:  # unchecked reads return the damaged record
        assert len(ds.get_many(range(N))) == N
        assert len(list(ds)) == N + 2


def test_columnar_write_checksums_match_record_writes(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (50, 1000), dtype=np.uint8)
    for version in ("1.0", "1.1"):
        a, b = tmp_path / f"a{version}.evs", tmp_path / f"b{version}.evs"
        with evs.Writer(a, format_version=version) as w:
            w.extend_columns({0: x})
        with evs.Writer(b, format_version=version) as w:
            for row in x:
                w.append([row])
        with evs.open(a) as da, evs.open(b) as db:
            assert da.entries()["crc"].tolist() == db.entries()["crc"].tolist()
            assert da.verify().ok
