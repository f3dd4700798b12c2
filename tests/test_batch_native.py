"""get_batch's compiled pass (``_native.BatchPlan``, _native_batch.cc): every record of a
batch checked and copied into its rows in one pass.

Its promise: a batch it serves equals the record-by-record path's (``ds[i]`` stacked), and a
batch with any record it cannot vouch for (a failed check, another structure) is left to
that path, so the same error comes out. The oracle is the same dataset read with the column
path switched off, on files damaged byte by byte with their checksums fixed up afterwards
(so that only the structure, Bool and UTF-8 checks can catch the damage). The compiled code
is also handed wrong arguments directly: it must refuse them, never read or write outside
what it was given.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import evalue_store as evs
from evalue_store import _native
from evalue_store.codec.batch_decode import plan_of
from evalue_store.container import FRAME_SIZE
from evalue_store.dataset import batch

from .test_batch import assert_batch, expected
from .test_native_mapped import checksums_fixed, every_kind, write

INDICES = [5, 3, 0, 3, 11, 7, 3]  # unsorted, duplicates, across index segments


def outcome(ds, indices):
    try:
        return ds.get_batch(indices)
    except evs.FormatError as exc:
        return f"{type(exc).__name__}: {exc} (record {exc.record})"


def served_by_column(ds, indices, monkeypatch) -> tuple[object, bool]:
    """The batch (or its error) and whether the compiled pass served all of it."""
    served = []
    decode = batch.decode_batch
    monkeypatch.setattr(batch, "decode_batch", lambda *a: served.append(r := decode(*a)) or r)
    got = outcome(ds, indices)
    monkeypatch.undo()
    return got, bool(served) and all(r is not None for r in served)


def record_by_record(ds, indices, monkeypatch):
    monkeypatch.setattr(batch, "_by_layout", lambda *a: None)
    try:
        return outcome(ds, indices)
    finally:
        monkeypatch.undo()


def assert_same(got, want) -> None:
    if isinstance(want, str):
        assert got == want
    else:
        assert_batch(got, want)


@pytest.mark.parametrize("version", ["1.0", "1.1"])  # CRC-32, CRC-32C
@pytest.mark.parametrize("verify", [True, False])
def test_good_batches_equal_ds_i_stacked(tmp_path, version, verify, monkeypatch):
    path = tmp_path / "kinds.evs"
    write(path, [every_kind(i) for i in range(12)], version, sessions=3)
    with evs.open(path, verify=verify) as ds:
        for indices in (INDICES, list(range(12)), [11] * 40, [-1, -12]):
            got, served = served_by_column(ds, indices, monkeypatch)
            assert served
            assert_batch(got, expected(ds, [i % 12 for i in indices]))


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_resigned_damage_is_caught_as_the_record_path_catches_it(tmp_path, version, monkeypatch):
    """Every byte of record 3's frame set to a few values, checksums fixed afterwards: the
    batch gives what the record-by-record path gives (the same error, or the same values),
    and the compiled pass serves it only when the record is still sound."""
    good = tmp_path / "good.evs"
    write(good, [every_kind(i) for i in range(12)], version, sessions=3)
    with evs.open(good) as ds:
        entries = ds.entries().copy()
    data = bytes(good.read_bytes())
    frame, length = int(entries[3]["offset"]), int(entries[3]["length"])
    bad = tmp_path / "bad.evs"
    disagreements, caught = [], 0
    for at in range(frame, frame + FRAME_SIZE + length):
        for value in (data[at] ^ 1, 2, 0xFF):
            damaged = bytearray(data)
            damaged[at] = value
            checksums_fixed(damaged, entries, version)
            bad.write_bytes(damaged)
            with evs.open(bad) as ds:
                got, served = served_by_column(ds, INDICES, monkeypatch)
                want = record_by_record(ds, INDICES, monkeypatch)
            try:
                assert_same(got, want)
                assert not (served and isinstance(want, str))
            except AssertionError:
                disagreements.append((at - frame, value))
            caught += isinstance(want, str)
    assert disagreements == []
    assert caught > 100  # the structure, Bool and UTF-8 checks had something to catch


def test_torch_and_numpy_out_buffers_on_the_compiled_pass(tmp_path, monkeypatch):
    path = tmp_path / "w1.evs"
    rng = np.random.default_rng(3)
    with evs.Writer(path) as writer:
        for i in range(100):
            writer.append(
                {
                    "tokens": rng.integers(0, 50_000, 128),
                    "half": torch.randn(4, 3, dtype=torch.bfloat16),
                    "flag": i % 3 == 0,
                    "id": f"ex-{i:03d}",
                }
            )
    indices = [50, 2, 2, 99, 0]
    tokens = torch.full((5, 128), -1, dtype=torch.int64)
    half = torch.empty((5, 4, 3), dtype=torch.bfloat16)
    flags = np.empty(5, bool)
    with evs.open(path) as ds:
        want = expected(ds, indices)
        out = {"tokens": tokens, "half": half, "flag": flags}
        got, served = served_by_column(ds, indices, monkeypatch)
        assert served
        got = ds.get_batch(indices, out=out)
        assert got["tokens"] is tokens and got["half"] is half and got["flag"] is flags
        assert np.array_equal(tokens.numpy(), want["tokens"])
        assert half.view(torch.int16).numpy().tobytes() == want["half"].tobytes()
        assert np.array_equal(flags, want["flag"]) and got["id"] == want["id"]


def test_a_checksum_function_native_does_not_compute_is_called(tmp_path, monkeypatch):
    """A file whose checksum function is wrapped (as tests count bytes): the batch is
    still verified, by that function, record by record."""
    from evalue_store import container

    path = tmp_path / "wrapped.evs"
    write(path, [every_kind(i) for i in range(12)])
    with evs.open(path) as ds:
        want = expected(ds, INDICES)
    seen = []
    original = container.crc32c

    def counted(data, start=0):
        seen.append(len(memoryview(data).cast("B")))
        return original(data, start)

    monkeypatch.setattr(container, "crc32c", counted)
    with evs.open(path) as ds:
        seen.clear()
        assert_batch(ds.get_batch(INDICES), want)
        assert len(seen) >= len(INDICES)


# ----------------------------------------------------------------------------- direct


@pytest.fixture()
def plain(tmp_path):
    """A file of one layout, its plan, mapping and index entries."""
    path = tmp_path / "plain.evs"
    write(path, [[np.arange(4, dtype=np.int32) + i, i, i % 2 == 1, f"s{i}"] for i in range(8)])
    ds = evs.open(path)
    ds.get_batch([0, 1])
    layout = ds._layouts[int(ds.entries()[0]["length"])]
    yield ds, plan_of(layout), ds._source.mapped, ds.entries()
    ds.close()


def columns(n: int) -> list:
    return [np.empty((n, 4), np.int32), np.empty(n, np.int64), np.empty(n, bool), None]


def test_decode_direct(plain):
    ds, plan, mapped, entries = plain
    frames = entries["offset"].astype(np.int64)
    outs = columns(8)
    bad, lists = plan.decode(mapped, frames, entries["crc"], "crc32c", outs)
    assert bad == [] and lists[:3] == [None] * 3 and lists[3] == [f"s{i}" for i in range(8)]
    assert outs[1].tolist() == list(range(8)) and outs[2].tolist() == [i % 2 == 1 for i in range(8)]
    assert np.array_equal(outs[0], np.arange(4) + np.arange(8)[:, None])


def test_frames_outside_the_buffer_or_misplaced_are_handed_back(plain):
    ds, plan, mapped, entries = plain
    frames = entries["offset"].astype(np.int64)
    size = len(mapped)
    frames[[1, 2, 3, 4, 5]] = [-16, size, size - 8, 2**62, frames[0] + 8]
    crcs = entries["crc"].copy()
    crcs[6] ^= 1  # disagrees with its frame header
    bad, lists = plan.decode(mapped, frames, crcs, None, columns(8))
    assert bad == [1, 2, 3, 4, 5, 6]
    assert lists[3][0] == "s0" and lists[3][1:7] == [None] * 6 and lists[3][7] == "s7"


@pytest.mark.parametrize(
    "outs, error",
    [
        (columns(7), ValueError),  # a row short
        (columns(9), ValueError),  # a row more
        ([np.empty((4, 8), np.int32).T, *columns(8)[1:]], (ValueError, BufferError)),
        ([np.empty((8, 4), np.int16), *columns(8)[1:]], ValueError),  # half the bytes
        ([np.empty((8, 4), np.int32), np.empty(8, np.int64), np.empty(8, bool), []], ValueError),
        (columns(8)[:3], ValueError),  # too few
        ([b"x" * 128, *columns(8)[1:]], (BufferError, TypeError)),  # read-only
        (["no buffer", *columns(8)[1:]], TypeError),
    ],
)
def test_out_buffers_that_do_not_fit_are_refused(plain, outs, error):
    ds, plan, mapped, entries = plain
    frames = entries["offset"].astype(np.int64)
    with pytest.raises(error):
        plan.decode(mapped, frames, entries["crc"], None, outs)


def test_bad_arguments_are_refused(plain):
    ds, plan, mapped, entries = plain
    frames, crcs = entries["offset"].astype(np.int64), entries["crc"]
    with pytest.raises(TypeError, match="frames must be a 1-D int64"):
        plan.decode(mapped, frames.astype(np.int32), crcs, None, columns(8))
    with pytest.raises(TypeError, match="crcs must be a 1-D uint32"):
        plan.decode(mapped, frames, crcs.astype(np.int64), None, columns(8))
    with pytest.raises(ValueError, match="8 frames but 7 crcs"):
        plan.decode(mapped, frames, crcs[:7], None, columns(8))
    with pytest.raises(ValueError, match="checksum must be"):
        plan.decode(mapped, frames, crcs, "md5", columns(8))
    with pytest.raises(TypeError):
        plan.decode("not a buffer", frames, crcs, None, columns(8))
    tiny = np.frombuffer(bytes(mapped[: int(frames[0]) + 20]), np.uint8)  # the frame cut
    bad, _ = plan.decode(tiny, frames[:1], crcs[:1], None, columns(1))
    assert bad == [0]


@pytest.mark.parametrize(
    "args",
    [
        (15, [], []),  # shorter than a frame header
        (64, [(60, b"12345")], []),  # a run past the frame
        (64, [(-1, b"1")], []),
        (64, [], [(1, 60, 8)]),  # a tensor past the frame
        (64, [], [(4, 16, 4)]),  # a scalar of 4 bytes
        (64, [], [(5, 63, 2)]),  # a Bool of 2 bytes
        (64, [], [(9, 16, 1)]),  # no such kind
        (64, [], [(2, 16, -1)]),
    ],
)
def test_plans_outside_their_frame_are_refused(args):
    with pytest.raises(ValueError):
        _native.BatchPlan(*args)


def test_a_plan_is_made_once():
    plan = _native.BatchPlan(16, [], [])
    with pytest.raises(TypeError):
        plan.__init__(16, [], [])
    empty = _native.BatchPlan.__new__(_native.BatchPlan)
    with pytest.raises(TypeError, match="not initialised"):
        empty.decode(b"", np.zeros(0, np.int64), np.zeros(0, np.uint32), None, [])
