"""Writer.extend batches runs of same-structure rows (evalue_store.dataset.rows); the file and
every error must be what appending the rows one by one gives.

The oracle is a second file written by ``append`` in a loop, compared by ``body`` (the bytes
from the first record to the last footer).
"""

from __future__ import annotations

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.dataset import rows
from tests.test_columns import body


def reused_buffers(n: int):
    """A generator that refills one array and one list for every row, as loaders do."""
    tokens = np.zeros(8, np.int64)
    row = [tokens, 0, ""]
    for i in range(n):
        tokens[:] = i
        row[1], row[2] = i, f"id-{i:04d}"
        yield row


def sections() -> list[list]:
    """Runs of one structure each (batched), and rows that are not batched."""
    rng = np.random.default_rng(3)
    return [
        [
            [rng.integers(0, 9, 16), rng.standard_normal((2, 3), np.float32), i, "ab"]
            for i in range(300)
        ],
        [[np.arange(i % 5 + 1), float(i), i % 2 == 0, None, b"x"] for i in range(40)],
        [[np.zeros(4, np.uint8), "é" * (i % 3)] for i in range(30)],  # lengths vary
        [[np.ones((3, 4)).T, 1]] * 20,  # not C-contiguous: stored with a dim order
        [[np.arange(6, dtype=">i4"), 2]] * 20,  # big-endian: stored little-endian
        [[np.array(7), np.int64(3), [1, 2]]] * 20,  # 0-d tensor, numpy scalar, list
        [[np.zeros(rows.BIG_PART, np.uint8), 5]] * 3,  # written from the caller's array
        [[True, 1, 1.0, None, b"b"]] * 20 + [[1, True, -0.0, None, b"c"]] * 20,  # kinds kept
        [(np.arange(3), "t")] * 20,  # tuples
    ]


def mixed_rows() -> list:
    return [row for section in sections() for row in section]


def extend_each(w, _):
    for section in sections():  # each run at the start of a call: none is appended directly
        w.extend(section)


def extend_all(w, make):
    w.extend(make())


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize(
    "make, extend",
    [
        (mixed_rows, extend_all),
        (mixed_rows, extend_each),
        (lambda: reused_buffers(700), extend_all),
    ],
)
def test_extend_writes_what_append_writes(tmp_path, compression, make, extend):
    batched, looped = tmp_path / "extend.evs", tmp_path / "append.evs"
    with evs.Writer(batched, compression=compression) as w:
        extend(w, make)
    with evs.Writer(looped, compression=compression) as w:
        for row in make():
            w.append(row)
    assert body(batched) == body(looped)
    with evs.open(batched) as a, evs.open(looped) as b:
        assert len(a) == len(b) > 0
        assert (a.entries() == b.entries()).all()


@pytest.mark.parametrize(
    "bad, error",
    [(2**70, evs.EncodeError), ("\ud800", evs.EncodeError), (object(), evs.EncodeError)],
)
def test_extend_fails_at_the_row_append_fails_at(tmp_path, bad, error):
    good = [[np.arange(4), i, "abc"] for i in range(100)]
    at = 57
    records = [*good[:at], [np.arange(4), bad, "abc"], *good[at:]]
    path = tmp_path / "bad.evs"
    with evs.Writer(path) as w:
        with pytest.raises(error):
            w.extend(records)
        assert len(w) == at  # the rows before it, as append in a loop leaves them
    with evs.open(path) as ds:
        assert [r[1] for r in ds] == list(range(at))


def test_extend_writes_the_rows_taken_before_the_iterable_fails(tmp_path):
    def failing():
        yield from ([np.arange(4), i] for i in range(40))
        raise KeyError("source failed")

    path = tmp_path / "partial.evs"
    with evs.Writer(path) as w:
        with pytest.raises(KeyError):
            w.extend(failing())
        assert len(w) == 40
    with evs.open(path) as ds:
        assert [r[1] for r in ds] == list(range(40))


def test_extend_on_a_closed_writer_raises(tmp_path):
    w = evs.Writer(tmp_path / "closed.evs")
    w.close()
    with pytest.raises(evs.ClosedError):
        w.extend([np.arange(4), i] for i in range(50))
