"""Writer.extend_columns: N records given as columns are the records append writes.

The oracle is a second file written by appending the rows one by one: the two files must be
byte for byte the same apart from what depends on the file's identity (file id, creation
time and the checksums over them, in the header and footers).
"""

from __future__ import annotations

import _thread
import errno
import signal
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import evalue_store as evs
from evalue_store.physical import plain
from tests.faults import count_calls, interrupt_at


def body(path) -> bytes:
    """The file from its first record to its last footer: records, index, metadata."""
    with evs.open(path) as ds:
        start = int(ds.entries()["offset"].min()) if len(ds) else ds.commit.footer_offset
        return b"".join(bytes(c) for c in ds.logical_chunks())[start : ds.commit.footer_offset]


def rows_of(columns: dict, n: int) -> list:
    def value(column, k):
        if isinstance(column, evs.Typed):  # evs.Tensor: row k is a tensor, 0-d for a 1-D one
            return column.value[k, ...]
        if isinstance(column, torch.Tensor):
            return column[k]
        if isinstance(column, np.ndarray) and column.ndim == 1 and column.dtype.kind in "iufb":
            return column[k].item()
        if isinstance(column, np.ndarray) and column.dtype.kind in "SU":
            return column[k].item()
        return column[k]

    return [{key: value(c, k) for key, c in columns.items()} for k in range(n)]


def assert_same_file(tmp_path, columns: dict, n: int, positional: bool = False, **options):
    by_columns, by_rows = tmp_path / "columns.evs", tmp_path / "rows.evs"
    rows = rows_of(columns, n)
    if positional:
        columns = dict(enumerate(columns.values()))
        rows = [list(r.values()) for r in rows]
    with evs.Writer(by_rows, **options) as writer:
        writer.append(rows[0])
        for row in rows[1:]:
            writer.append(row)
    with evs.Writer(by_columns, **options) as writer:
        assert writer.extend_columns(columns) == range(n)
        assert len(writer) == n
    assert body(by_columns) == body(by_rows)
    return by_columns


def w1_columns(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "tokens": rng.integers(0, 50_000, (n, 128)),
        "features": rng.standard_normal((n, 16), dtype=np.float32),
        "label": rng.integers(0, 1000, n),
        "id": [f"ex-{i:06d}" for i in range(n)],
    }


@pytest.mark.parametrize("alignment", [8, 64, 4096])
def test_w1_columns_are_the_appended_records(tmp_path, alignment):
    path = assert_same_file(tmp_path, w1_columns(500), 500, alignment=alignment)
    with evs.open(path) as ds:
        assert ds.fields == ("tokens", "features", "label", "id")
        assert ds.verify().ok


def test_positional_and_compressed(tmp_path):
    assert_same_file(tmp_path, w1_columns(300), 300, positional=True)
    assert_same_file(tmp_path, w1_columns(300), 300, compression="zstd", frame_size=4096)
    # a frame per record, written together; a dictionary trained on the first MiB of them
    for dictionary in (None, "auto"):
        path = assert_same_file(
            tmp_path, w1_columns(1500), 1500, compression="zstd", dictionary=dictionary
        )
        frames = []
        for name in ("columns.evs", "rows.evs"):  # the same frames: their logical sizes
            with evs.open(tmp_path / name) as ds:
                frames.append(ds._source._frame_map()[3].tolist())
                assert ds.verify().ok
        assert frames[0] == frames[1] and len(frames[0]) > 1500
        assert (evs.read_dictionary(path) is None) == (dictionary is None)


def test_numpy_integer_positions(tmp_path):
    """Columns keyed by numpy integers are by position, as get_batch's out keys are."""
    path = tmp_path / "np_keys.evs"
    with evs.Writer(path) as writer:
        writer.extend_columns({np.int64(1): np.ones(3), np.int32(0): np.arange(3)})
    with evs.open(path) as ds:
        assert ds.get_many([0, 2]) == [[0, 1.0], [2, 1.0]]


def test_columns_of_every_kind(tmp_path):
    """Columns that keep one layout, and columns that make each record its own."""
    n = 40
    rng = np.random.default_rng(1)
    columns = {
        "strided": rng.standard_normal((n, 4, 3)).transpose(0, 2, 1),  # rows in a dim order
        "big_endian": np.arange(n * 3, dtype=">i4").reshape(n, 3),
        "empty": np.zeros((n, 0, 2), np.int16),
        "bools": rng.integers(0, 2, (n, 5)).astype(bool),  # bool tensors: no layout
        "bf16": torch.arange(n * 2, dtype=torch.float32).reshape(n, 2).to(torch.bfloat16),
        "zero_d": evs.Tensor(np.arange(n, dtype=np.float32)),
        "flag": rng.integers(0, 2, n).astype(bool),
        "small": np.arange(n, dtype=np.uint8),
        "half": np.linspace(0, 1, n, dtype=np.float16),
        "nothing": [None] * n,
        "raw": [bytes([k]) * 3 for k in range(n)],
        "text": np.array([f"é{k:02d}" for k in range(n)]),
        "objects": np.array([f"o{k}" if k % 3 else None for k in range(n)], dtype=object),
    }
    assert_same_file(tmp_path, columns, n)


def test_a_column_that_is_not_contiguous_is_not_copied_whole(tmp_path):
    """Rows of a slice of a bigger array or of a broadcast (each row C-contiguous, the
    column not) are gathered batch by batch (4 MiB of frames): numpy's allocations
    (traced) stay about the write's buffers (3 of frames, the sink's, a batch of rows:
    20 MiB), below half the column's 64 MiB (a copy of the column was 80 MiB), and the
    records are the appended rows."""
    n, width = 64, 1 << 17  # 1 MiB int64 rows
    wide = np.arange(n * 2 * width, dtype=np.int64).reshape(n, 2 * width)
    columns = {
        "slice": wide[:, :width],  # rows contiguous, the whole not
        "broadcast": np.broadcast_to(np.arange(width, dtype=np.int64), (n, width)),
    }
    for key, column in columns.items():
        assert not column.flags.c_contiguous
        path = tmp_path / f"{key}.evs"
        tracemalloc.start()
        try:
            with evs.Writer(path, durable=False) as writer:
                writer.extend_columns({"x": column})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < column.nbytes // 2, (key, peak)
        with evs.open(path) as ds:
            assert len(ds) == n and ds.verify().ok
            for k in (0, 1, n // 2, n - 1):
                assert np.array_equal(ds[k][0], column[k])
    assert_same_file(tmp_path, {"s": wide[:8, :width], "b": columns["broadcast"][:8]}, 8)


@pytest.mark.parametrize(
    "column",
    [np.arange(30), np.arange(30, dtype=np.float32), torch.arange(30), torch.ones(30).bool()],
)
def test_a_1d_column_wrapped_in_tensor_is_0d_tensors(tmp_path, column):
    """README: "wrap a 1-D array in evs.Tensor(...) for 0-d tensors": the records are
    those appending evs.Tensor(row k) writes, a 0-d tensor each (alone, the column has
    one layout; next to a list of strings of several lengths, it is encoded row by row)."""
    for extra in ({}, {"s": ["x" * (k % 3) for k in range(30)]}):
        path = assert_same_file(tmp_path, {"t": evs.Tensor(column), **extra}, 30)
        with evs.open(path) as ds:
            values = [ds[k][0] for k in range(30)]
        assert all(isinstance(v, np.ndarray) and v.shape == () for v in values)
        assert [v.item() for v in values] == np.asarray(column).tolist()


@pytest.mark.parametrize(
    "column",
    [
        [f"id-{k}" for k in range(30)],  # strings of several lengths
        [[k] * (k % 3) for k in range(30)],  # lists
        [None if k % 2 else np.ones(2) for k in range(30)],  # mixed kinds
        [np.ones(k % 4) for k in range(30)],  # tensors of several shapes
    ],
)
def test_columns_without_one_layout(tmp_path, column):
    assert_same_file(tmp_path, {"x": np.arange(30 * 2).reshape(30, 2), "y": column}, 30)


@pytest.mark.parametrize("wrap", [False, True])
def test_a_torch_column_of_rank_64_rows_is_the_appended_rows(tmp_path, wrap):
    """Attack c02: a torch column [N] + [1] * 64 (rank-64 rows, which append stores)
    raised torch's bare ValueError (numpy holds 64 dims at most); its rows are now stored
    one by one, the file byte for byte what appending them writes. Rows of rank 65 are
    an EncodeError naming the column."""
    column = torch.arange(6.0).reshape((6,) + (1,) * 64)
    columns = {"t": evs.Tensor(column) if wrap else column, "n": np.arange(6)}
    path = assert_same_file(tmp_path, columns, 6)
    with evs.open(path) as ds:
        assert [ds[k][0].shape for k in range(6)] == [(1,) * 64] * 6
        assert [ds[k][0].item() for k in range(6)] == list(range(6))
    with evs.Writer(tmp_path / "r65.evs") as w:
        too_deep = torch.zeros((2,) + (1,) * 65)
        with pytest.raises(evs.EncodeError, match="column 't': tensor rank 65 exceeds 64"):
            w.extend_columns({"t": evs.Tensor(too_deep) if wrap else too_deep})
        assert len(w) == 0


def test_appends_go_on_after_columns(tmp_path):
    path = tmp_path / "mix.evs"
    with evs.Writer(path) as writer:
        writer.append({"a": np.ones(3), "b": 1})
        assert writer.extend_columns({"a": np.zeros((4, 3)), "b": np.arange(4)}) == range(1, 5)
        assert writer.append({"a": np.ones(3), "b": 9}) == 5
        assert writer.extend_columns({"a": np.zeros((0, 3)), "b": []}) == range(6, 6)
    with evs.open(path) as ds:
        assert [r[1] for r in ds] == [1, 0, 1, 2, 3, 9]


@pytest.mark.parametrize(
    "columns, message",
    [
        ({}, "non-empty dict"),
        ({"a": np.ones((3, 2)), "b": np.ones(4)}, "differ in length"),
        ({"a": np.ones(3), 1: np.ones(3)}, "all by field name or all by position"),
        ({0: np.ones(3), 2: np.ones(3)}, "must be 0..1"),
        ({"a": np.ones(3, np.complex64)}, "neither Int, Double nor Bool"),
        ({"a": np.zeros(3, evs.BFLOAT16)}, "a 1-D bfloat16 array is neither"),
        ({"a": ["ok", "\ud800"]}, "UTF-8"),  # UnicodeEncodeError before (session 11, C02)
        ({"a": np.array(["ok", "\ud800"])}, "UTF-8"),
        ({"a": torch.zeros(3, dtype=torch.bfloat16)}, "a 1-D bfloat16 array is neither"),
        ({"a": np.array([1, 2**63], np.uint64)}, "row 1"),
        ({"a": np.float32(3)}, "not float32"),
        ({"a": [1, 2, object()]}, "no EValue kind"),
        ({"a": np.array([[1, 2], [3, 4]], object)}, "column 'a': numpy dtype object has no"),
        ({"a": np.empty((3, 2), object)}, "column 'a': numpy dtype object has no"),
        ({"a": np.array([["x"], ["y"]])}, "column 'a': numpy dtype <U1 has no"),
        ({"a": evs.Tensor(np.array([1, 2], object))}, "column 'a': numpy dtype object has no"),
        ({"a": np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])}, "column 'a': a numpy masked"),
        ({"a": np.ma.masked_array(np.ones((2, 3)))}, "column 'a': a numpy masked array"),
        ({"a": evs.Tensor(np.ma.masked_array([1.0]))}, "column 'a': a numpy masked array"),
        ({"a": [1.0, np.ma.masked]}, "np.ma.masked"),
    ],
)
def test_bad_columns_append_nothing(tmp_path, columns, message):
    path = tmp_path / "bad.evs"
    with evs.Writer(path) as writer:
        writer.append({"a": np.ones(2)} if isinstance(next(iter(columns), ""), str) else [1])
        writer.commit()
        size = path.stat().st_size
        with pytest.raises(evs.EncodeError, match=message):
            writer.extend_columns(columns)
        assert len(writer) == 1 and writer.tell() == size
    with evs.open(path) as ds:
        assert len(ds) == 1 and ds.uncommitted_bytes == 0


def test_names_must_agree_with_the_files(tmp_path):
    path = tmp_path / "named.evs"
    with evs.Writer(path) as writer:
        writer.append({"a": 1, "b": 2})
        with pytest.raises(evs.EncodeError, match="missing"):
            writer.extend_columns({"a": np.arange(3)})
        with pytest.raises(evs.EncodeError, match="needs 2 values"):
            writer.extend_columns({0: np.arange(3)})
        writer.extend_columns({0: np.arange(3), 1: np.arange(3)})  # by position: fine
    with evs.open(path) as ds:
        assert ds.fields == ("a", "b") and len(ds) == 4


def test_a_write_failing_part_way_leaves_no_stray_bytes(tmp_path, monkeypatch):
    path = tmp_path / "enospc.evs"
    real = plain.pwrite_all

    def half_then_fail(fd, data, offset):
        if len(data) > 1 << 20:  # the columns' one big write
            real(fd, memoryview(data)[: len(data) // 2], offset)
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        return real(fd, data, offset)

    with evs.Writer(path) as writer:
        writer.extend_columns(w1_columns(10))
        writer.commit()
        size = path.stat().st_size
        monkeypatch.setattr(plain, "pwrite_all", half_then_fail)
        with pytest.raises(OSError, match="simulated"):
            writer.extend_columns(w1_columns(2000))
        monkeypatch.setattr(plain, "pwrite_all", real)
        assert len(writer) == 10 and path.stat().st_size == -(-size // 64) * 64  # + padding
        writer.extend_columns(w1_columns(5, seed=1))
    with evs.open(path) as ds:
        assert len(ds) == 15 and ds.verify().ok and ds.uncommitted_bytes == 0


def interrupted_at_every_call(tmp_path, columns: dict, min_calls: int = 10) -> Iterator[tuple]:
    """For each system call of ``extend_columns(columns)`` on a file of 3 records (opened
    with mode "a"): a fresh file whose append a KeyboardInterrupt cut at that call, the
    caller catching it and aborting (or closing, past the last call). Yields (path, n,
    where it fired); the append must make more than ``min_calls`` calls."""

    def prepare(path):
        with evs.Writer(path) as writer:
            writer.extend_columns(w1_columns(3, seed=2))

    scratch = tmp_path / "scratch.evs"
    prepare(scratch)

    def operation():
        with evs.Writer(scratch, mode="a") as writer:
            writer.extend_columns(columns)

    calls = count_calls(operation)
    assert calls > min_calls
    for n in range(1, calls + 1):
        path = tmp_path / f"run{n}.evs"
        prepare(path)
        writer = evs.Writer(path, mode="a")
        with interrupt_at(n) as counter:
            try:
                writer.extend_columns(columns)
            except KeyboardInterrupt:
                pass
        if counter.fired:
            writer.abort()
        else:
            writer.close()
        yield path, n, counter.fired


def test_interrupted_at_every_call_keeps_all_or_none(tmp_path):
    columns = w1_columns(1000)  # over a megabyte: written directly, not buffered
    for path, n, fired in interrupted_at_every_call(tmp_path, columns):
        with evs.Writer(path, mode="a") as again:  # recovers any tail there is
            recovered = again.salvage
        with evs.open(path) as ds:
            assert len(ds) in (3, 1003), (n, fired)
            assert ds.verify().ok
        assert recovered is None or recovered.records in (0, 1000), (n, recovered)


def test_batches_of_changing_layouts_are_the_appended_records(tmp_path):
    """A writer reuses the last batch's layout when the next batch's first record has it.
    Batches that differ from the last one in one detail, most of them of the same size
    (a dtype, a shape, a scalar's kind, a string for bytes), must each get their own."""
    n = 20
    ints = np.arange(n * 4, dtype=np.int64).reshape(n, 4)
    keys = [f"k{k:03d}" for k in range(n)]
    base = {"tokens": ints, "label": np.arange(n), "id": keys}
    variants = [
        {"tokens": ints + 1, "label": np.arange(n) * 2},  # the same layout
        {"tokens": ints.view(np.float64)},
        {"tokens": ints.view(np.int32)},  # [n, 8]
        {"tokens": ints.reshape(n, 2, 2)},
        {"tokens": ints.reshape(n, 4, 1)},
        {"label": np.arange(n) + 0.5},
        {"label": np.arange(n) % 2 == 0},
        {"id": [key.encode() for key in keys]},
        {"id": [f"k{k:04d}" for k in range(n)]},
        {"id": [None] * n},
    ]
    batches = [base]
    for variant in variants:
        batches += [{**base, **variant}, base]
    by_columns, by_rows = tmp_path / "columns.evs", tmp_path / "rows.evs"
    with evs.Writer(by_columns) as writer:
        for columns in batches:
            writer.extend_columns(columns)
    with evs.Writer(by_rows) as writer:
        for columns in batches:
            for row in rows_of(columns, n):
                writer.append(row)
    assert body(by_columns) == body(by_rows)


# ---------------------------------------------------------------- batches written behind
# Columns of more than one batch (columns.CHUNK_BYTES of frames) are encoded on the calling
# thread while a second thread writes the batch before (dataset/pipeline.py). The tests
# shrink the batch, and the size from which the sink writes without buffering, so that a
# small write makes many batches, each written by the thread.


@pytest.fixture
def small_batches(monkeypatch):
    from evalue_store.dataset import columns

    monkeypatch.setattr(columns, "CHUNK_BYTES", 16 << 10)  # about 12 W1 records a batch
    monkeypatch.setattr(plain.PlainSink, "DIRECT_BYTES", 8 << 10)  # each written directly


def writing_behind() -> list:
    """The write-behind threads alive (none once a call has returned or raised)."""
    return [t for t in threading.enumerate() if t.name == "evalue_store-write"]


def writing_threads(monkeypatch) -> set:
    """The names of the threads that write batches of frames, from now on."""
    names: set = set()
    real = plain.pwrite_all

    def pwrite_all(fd, data, offset):
        names.add(threading.current_thread().name)
        return real(fd, data, offset)

    monkeypatch.setattr(plain, "pwrite_all", pwrite_all)
    return names


@pytest.mark.parametrize("alignment", [8, 64, 4096])
def test_batches_written_behind_are_the_appended_records(
    tmp_path, monkeypatch, small_batches, alignment
):
    threads = writing_threads(monkeypatch)
    assert_same_file(tmp_path, w1_columns(700), 700, alignment=alignment)
    assert "evalue_store-write" in threads  # the batches were written behind
    assert not writing_behind()  # and the thread is gone


@pytest.mark.parametrize("fail_at", [1, 2, 5, 40])
def test_a_batch_written_behind_that_fails_appends_nothing(
    tmp_path, monkeypatch, small_batches, fail_at
):
    """ENOSPC half way through the k-th batch's write: no record is appended, no byte of
    the call stays in the file, and the writer goes on."""
    path = tmp_path / "enospc.evs"
    real = plain.pwrite_all
    calls = {"n": 0}

    def half_then_fail(fd, data, offset):
        calls["n"] += 1
        if calls["n"] == fail_at:
            real(fd, memoryview(data)[: len(data) // 2], offset)
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        return real(fd, data, offset)

    with evs.Writer(path) as writer:
        writer.extend_columns(w1_columns(10))
        writer.commit()
        size = path.stat().st_size
        monkeypatch.setattr(plain, "pwrite_all", half_then_fail)
        with pytest.raises(OSError, match="simulated"):
            writer.extend_columns(w1_columns(700))
        monkeypatch.setattr(plain, "pwrite_all", real)
        assert len(writer) == 10 and size <= path.stat().st_size <= -(-size // 64) * 64
        assert not writing_behind()
        writer.extend_columns(w1_columns(5, seed=1))
    with evs.open(path) as ds:
        assert len(ds) == 15 and ds.verify().ok and ds.uncommitted_bytes == 0


@pytest.mark.parametrize("at_write", [1, 3, 20, "last"])
def test_an_interrupt_of_the_encoding_thread_appends_nothing(
    tmp_path, monkeypatch, small_batches, at_write
):
    """SIGINT lands in the calling thread while the batches are being written behind it
    (at the last one, the caller is waiting for the writes to end): the writes under way
    end before the file is cut back, the interrupt is raised, and nothing is appended."""
    path = tmp_path / "sigint.evs"
    real = plain.pwrite_all
    calls = {"n": 0, "batches": 0}

    def pwrite_all(fd, data, offset):
        calls["n"] += 1
        calls["batches"] += len(data) == 12 * 1280
        last = at_write == "last" and calls["batches"] == 58  # of 700 = 58 * 12 + 4 records
        if calls["n"] == at_write or last:
            _thread.interrupt_main()  # raised in the caller at its next bytecode
            time.sleep(0.05)  # while this write is still under way
        return real(fd, data, offset)

    with evs.Writer(path) as writer:
        writer.extend_columns(w1_columns(10))
        writer.commit()
        size = path.stat().st_size
        monkeypatch.setattr(plain, "pwrite_all", pwrite_all)
        with pytest.raises(KeyboardInterrupt):
            writer.extend_columns(w1_columns(700))
            time.sleep(1)  # the interrupt is raised by then, whatever the call's speed
        monkeypatch.setattr(plain, "pwrite_all", real)
        assert len(writer) == 10 and size <= path.stat().st_size <= -(-size // 64) * 64
        assert not writing_behind()
        writer.extend_columns(w1_columns(5, seed=1))
    with evs.open(path) as ds:
        assert len(ds) == 15 and ds.verify().ok and ds.uncommitted_bytes == 0


def _waits_in(ident: int, name: str) -> bool:
    """Whether thread ``ident`` is inside a call of ``name`` and below it (waiting)."""
    frame = sys._current_frames().get(ident)
    if frame is None or frame.f_code.co_name == name:
        return False
    while frame is not None and frame.f_code.co_name != name:
        frame = frame.f_back
    return frame is not None


def test_a_sigint_while_the_caller_waits_for_the_writes_raises_once_they_have_stopped(
    tmp_path, monkeypatch, small_batches
):
    """A real SIGINT reaches the calling thread while it waits for the last batch's write
    (which this test holds up): the call raises only after that write has returned, and
    appends nothing, so the records appended next are not overwritten. Thread.join of
    Python 3.11 returns at once after an interrupt of its wait, while the thread writes on."""
    path = tmp_path / "sigint.evs"
    real = plain.pwrite_all
    main = threading.main_thread().ident
    handled, raised = threading.Event(), threading.Event()
    events: list = []
    batches = {"n": 0}

    def pwrite_all(fd, data, offset):
        if threading.current_thread().name == "evalue_store-write":
            batches["n"] += 1
            if batches["n"] == 59:  # the last batch: 700 = 58 * 12 + 4 records
                while not _waits_in(main, "finish"):
                    time.sleep(0.001)
                signal.pthread_kill(main, signal.SIGINT)  # interrupts the caller's wait
                handled.wait()
                raised.wait(2)  # time for a caller that did not wait to go on (none should)
            real(fd, data, offset)
            events.append("wrote")
            return None
        return real(fd, data, offset)

    def on_sigint(signum, frame):
        handled.set()
        raise KeyboardInterrupt

    with evs.Writer(path) as writer:
        writer.extend_columns(w1_columns(10))
        writer.commit()
        size = path.stat().st_size
        monkeypatch.setattr(plain, "pwrite_all", pwrite_all)
        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            writer.extend_columns(w1_columns(700))
        except KeyboardInterrupt:
            events.append("raised")
            raised.set()
        finally:
            signal.signal(signal.SIGINT, previous)
        monkeypatch.setattr(plain, "pwrite_all", real)
        assert events == ["wrote"] * 59 + ["raised"]  # no write after the call raised
        assert len(writer) == 10 and size <= path.stat().st_size <= -(-size // 64) * 64
        assert not writing_behind()
        writer.extend_columns(w1_columns(700, seed=1))
    with evs.open(path) as ds:
        assert len(ds) == 710 and ds.verify().ok and ds.uncommitted_bytes == 0


def test_batches_written_behind_interrupted_at_every_call_keep_all_or_none(tmp_path, small_batches):
    """As test_interrupted_at_every_call_keeps_all_or_none, over a write of many batches:
    the interrupt fires in whichever thread makes the call, the writer's or the caller's."""
    for path, n, fired in interrupted_at_every_call(tmp_path, w1_columns(200), min_calls=20):
        assert not writing_behind()
        with evs.open(path) as ds:
            assert len(ds) in (3, 203), (n, fired)
            assert ds.verify().ok and ds.uncommitted_bytes == 0, (n, fired)
        path.unlink()
