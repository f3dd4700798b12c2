"""Misuse a new user (or a framework) will try: pickling, copying, threads, forks, mode "w"
over a file being read, writers never closed, files a writer died creating."""

from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import pickle
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import evalue_store as evs


def rec(i: int) -> list:
    return [np.arange(3, dtype=np.int64) + i, i]


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_a_writer_cannot_be_pickled_or_copied(tmp_path, how):
    path = tmp_path / "d.evs"
    with evs.Writer(path) as w:
        w.append(rec(0))
        make = {
            "pickle": lambda: pickle.dumps(w),
            "copy": lambda: copy.copy(w),
            "deepcopy": lambda: copy.deepcopy(w),
        }[how]
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            make()
        gc.collect()  # nothing half-made may close the writer's descriptor
        with open(tmp_path / "other.bin", "wb") as other:  # reuses a freed descriptor number
            w.append(rec(1))
            w.commit()
            other.write(b"x")
    assert (tmp_path / "other.bin").read_bytes() == b"x"
    with evs.open(path) as ds:
        assert [r[1] for r in ds] == [0, 1]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_threads_sharing_a_writer_lose_nothing(tmp_path, compression):
    path = tmp_path / "d.evs"
    threads, each = 4, 150
    with evs.Writer(path, compression=compression) as w:

        def work(t: int) -> None:
            for k in range(each):
                w.append([np.full(5, t, np.int32), t * 1000 + k])
                if k % 25 == 0:
                    w.commit()

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    with evs.open(path) as ds:
        got = sorted(r[1] for r in ds)
        assert got == sorted(t * 1000 + k for t in range(threads) for k in range(each))
        for tokens, key in ds:
            assert np.array_equal(tokens, np.full(5, key // 1000, np.int32))


def _child_misuses(writer: evs.Writer, queue) -> None:
    try:
        writer.append(rec(99))
        queue.put("appended")
    except ValueError as exc:
        queue.put(str(exc))
    try:
        with writer:
            raise RuntimeError("the child's job fails: its abort must not cut the parent's file")
    except RuntimeError:
        pass
    del writer
    gc.collect()


def test_a_forked_child_cannot_use_or_cut_its_parents_writer(tmp_path):
    path = tmp_path / "d.evs"
    ctx = multiprocessing.get_context("fork")
    with evs.Writer(path) as w:
        w.extend(rec(i) for i in range(3))
        w.commit()
        w.append(rec(3))  # pending in the parent when the child is forked
        queue = ctx.Queue()
        child = ctx.Process(target=_child_misuses, args=(w, queue))
        child.start()
        message = queue.get(timeout=30)
        child.join(30)
        assert child.exitcode == 0
        assert "inherited by fork" in message
        w.append(rec(4))
    with evs.open(path) as ds:
        assert [r[1] for r in ds] == [0, 1, 2, 3, 4]


READ_WHILE_REPLACED = textwrap.dedent(
    """
    import sys, numpy as np, evalue_store as evs
    path, how = sys.argv[1], sys.argv[2]
    ds = evs.open(path) if how == "writer" else evs.open_shards(path)
    before = [ds[i][0].copy() for i in range(len(ds))]
    if how == "writer":
        with evs.Writer(path, "w") as w:
            w.append([np.zeros(1)])
    else:
        with evs.ShardWriter(path + "/s-{:03d}.evs", max_records=50, overwrite=True) as w:
            w.append([np.zeros(1)])
    for i in range(len(ds)):  # the old mapping: SIGBUS here if the file was cut in place
        assert np.array_equal(ds[i][0], before[i])
    print("ok", len(ds))
    """
)


@pytest.mark.parametrize("how", ["writer", "shards"])
def test_mode_w_over_a_file_being_read_leaves_the_reader_its_data(tmp_path, how):
    if how == "writer":
        target = tmp_path / "d.evs"
        with evs.Writer(target) as w:
            w.extend([np.full(4096, i, np.float32)] for i in range(100))
    else:
        target = tmp_path
        with evs.ShardWriter(str(tmp_path / "s-{:03d}.evs"), max_records=50) as w:
            w.extend([np.full(4096, i, np.float32)] for i in range(100))
    proc = subprocess.run(
        [sys.executable, "-c", READ_WHILE_REPLACED, str(target), how],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"reader died ({proc.returncode}): {proc.stderr[-2000:]}"
    assert proc.stdout.split() == ["ok", "100"]


def test_mode_w_keeps_the_old_files_permissions(tmp_path):
    path = tmp_path / "d.evs"
    with evs.Writer(path) as w:
        w.append(rec(0))
    os.chmod(path, 0o600)
    with evs.Writer(path, "w") as w:
        w.append(rec(1))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name != "d.evs"]  # no temp left behind


def test_mode_w_refuses_a_file_another_writer_holds(tmp_path):
    path = tmp_path / "d.evs"
    with evs.Writer(path) as held:
        held.append(rec(0))
        held.commit()
        with pytest.raises(evs.WriterLockedError):
            evs.Writer(path, "w")
        held.append(rec(1))
    with evs.open(path) as ds:
        assert [r[1] for r in ds] == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.evs"]


def test_a_writer_never_closed_warns(tmp_path):
    path = tmp_path / "d.evs"
    w = evs.Writer(path)
    w.append(rec(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del w
        gc.collect()
    messages = [str(c.message) for c in caught if c.category is ResourceWarning]
    assert messages and "never closed" in messages[0] and "1 records" in messages[0]
    with evs.open(path) as ds:
        assert len(ds) == 0


def _die_at_first_fsync(path: str, dictionary) -> None:
    os.fsync = lambda fd: os._exit(9)
    evs.Writer(path, compression="zstd", dictionary=dictionary)


@pytest.mark.parametrize("with_dictionary", [False, True])
def test_a_compressed_file_killed_while_created_can_be_reused(tmp_path, with_dictionary):
    dictionary = None
    if with_dictionary:
        dictionary = evs.train_dictionary([rec(i) + [f"key-{i}"] for i in range(400)], 4096)
    path = str(tmp_path / "d.evs.zst")
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_die_at_first_fsync, args=(path, dictionary))
    child.start()
    child.join(30)
    assert child.exitcode == 9 and not os.path.exists(path)  # no name before the header
    (leftover,) = tmp_path.glob(".d.evs.zst.*.new")
    # what a writer killed there left under the file's own name before new files were built
    # under a temporary name (and what another writer may still leave): recovery copes
    shutil.copyfile(leftover, path)
    with pytest.raises(evs.FormatError):
        evs.open(path)  # it holds no commit
    report = evs.recover(path)
    assert report.committed_records == 0 and report.side_file
    with evs.Writer(path, "a") as w:
        w.append(rec(0))
    with evs.open(path) as ds:
        assert ds.compressed and [r[1] for r in ds] == [0]
        assert (evs.read_dictionary(path) is not None) == with_dictionary


def test_shard_resume_after_a_compressed_shard_died_while_created(tmp_path):
    pattern = str(tmp_path / "s-{:03d}.evs.zst")
    with evs.ShardWriter(pattern, max_records=10, compression="zstd") as w:
        w.extend(rec(i) for i in range(10))
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_die_at_first_fsync, args=(pattern.format(1), None))
    child.start()
    child.join(30)
    assert child.exitcode == 9
    with evs.ShardWriter(pattern, max_records=10, compression="zstd", resume=True) as w:
        start = len(w)
        w.extend(rec(i) for i in range(start, 15))
    ds = evs.open_shards(str(tmp_path / "s-*.evs.zst"))
    assert [ds[i][1] for i in range(len(ds))] == list(range(15))


def test_a_replacer_that_locks_a_file_already_replaced_refuses(tmp_path):
    """B opens the file, C replaces it (mode "w") and keeps writing; B then gets the old
    file's lock: B must notice the path names C's file now and refuse, not replace it."""
    import fcntl

    from evalue_store.files import replace_locked

    path = str(tmp_path / "d.evs")
    with evs.Writer(path) as w:
        w.append(rec(0))
    other = str(tmp_path / "b.evs")
    with evs.Writer(other) as w:
        w.append(rec(9))
    real_flock, held = fcntl.flock, []

    def flock_after_c_replaced(fd, op):
        if not held:  # B's first lock: C replaces the file in between
            held.append(None)
            fcntl.flock = real_flock
            held[0] = evs.Writer(path, "w")
            held[0].append(rec(1))
            held[0].commit()
        return real_flock(fd, op)

    fcntl.flock = flock_after_c_replaced
    try:
        with pytest.raises(evs.WriterLockedError):
            replace_locked(other, path)
    finally:
        fcntl.flock = real_flock
    c = held[0]
    c.append(rec(2))
    c.close()
    with evs.open(path) as ds:
        assert [r[1] for r in ds] == [1, 2]


def test_recovery_whose_side_file_cannot_be_saved_raises_the_real_error(tmp_path, monkeypatch):
    """Ctrl-C or a full disk while recovery saves the bytes it will cut: that exception (not
    a BufferError), the file untouched, no empty side file left behind."""
    path = tmp_path / "d.evs"
    with evs.Writer(path) as w:
        w.append(rec(0))
    w = evs.Writer(path, "a")
    w.append(rec(1))
    w._sink.flush()
    w._release()
    with open(path, "ab") as f:
        f.write(b"\x07" * 100)  # damaged bytes, for the side file
    before = path.read_bytes()
    real_fsync = os.fsync
    for exc in (KeyboardInterrupt, OSError):

        def fail(fd, exc=exc):
            raise exc()

        monkeypatch.setattr(os, "fsync", fail)  # the first fsync is the side file's
        with pytest.raises(exc):
            evs.recover(path)
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d.evs"]
    report = evs.recover(path)
    assert report.salvaged_records == 1 and report.side_file


def test_writer_on_a_fifo_neither_hangs_nor_writes_into_it(tmp_path):
    import signal

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    signal.alarm(20)  # a hang fails the test instead of stalling the run
    try:
        for mode in ("a", "x"):
            with pytest.raises((evs.FormatError, FileExistsError)):
                evs.Writer(fifo, mode)
        # "w" replaces a file, never a FIFO or device: as root, the CLI's copy -o /dev/full
        # --force replaced the device node (attacker finding, session 11, eighth run, C09)
        with pytest.raises(evs.FormatError, match="not a regular file"):
            evs.Writer(fifo, "w")
    finally:
        signal.alarm(0)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_mode_w_through_a_symlink_replaces_the_target(tmp_path):
    target = tmp_path / "real.evs"
    with evs.Writer(target) as w:
        w.append(rec(0))
    link = tmp_path / "link.evs"
    link.symlink_to(target)
    with evs.Writer(link, "w") as w:
        w.append(rec(5))
    assert link.is_symlink()
    with evs.open(target) as ds:
        assert [r[1] for r in ds] == [5]


@pytest.mark.parametrize(
    "dictionary, reason",
    [
        (bytes(range(256)) * 4097, "over the 1048576 readers accept"),  # FRAMES.md: D <= 1 MiB
        (b"\x37\xa4\x30\xec" + bytes(200), "zstd cannot use this dictionary"),
        ("a string", "must be bytes"),
    ],
)
def test_a_dictionary_no_reader_could_use_is_refused_before_any_file(tmp_path, dictionary, reason):
    """Records committed with it would be in a file its own reader refuses: refused first,
    with a ValueError naming why, and no file is left; one of exactly 1 MiB is fine."""
    path = tmp_path / "d.evs.zst"
    with pytest.raises(ValueError, match=reason):
        evs.Writer(path, compression="zstd", dictionary=dictionary)
    assert not path.exists()
    trained = evs.train_dictionary([rec(i) + [f"key-{i}"] for i in range(400)], 4096)
    with evs.Writer(
        path, compression="zstd", dictionary=trained + bytes((1 << 20) - len(trained))
    ) as w:
        w.append(rec(1))
    with evs.open(path) as ds:
        assert len(ds) == 1


def test_a_whole_file_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    """Manifests and remote copies are written through files.atomic_file: a reader finds
    the old bytes or the new ones, and a failure part way leaves no stray file."""
    from evalue_store.files import atomic_file

    path = tmp_path / "m.json"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_file(str(path)) as f:
            f.write(b"half of the new")
            raise RuntimeError("interrupted")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["m.json"]
    with pytest.raises(FileExistsError):
        with atomic_file(str(path), replace=False) as f:
            f.write(b"new")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["m.json"]
    with atomic_file(str(path)) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_a_child_forked_while_a_thread_writes_is_refused_not_hung(tmp_path, monkeypatch):
    """A thread holds the writer (a long extend_columns, its batches written behind it)
    when another thread forks: the child's copy of the writer's lock is held by a thread
    the child does not have. The child must be told the writer is not its own, not hang."""
    from evalue_store.physical import plain

    path = tmp_path / "d.evs"
    real = plain.pwrite_all
    inside = threading.Event()

    def slow(fd, data, offset):
        inside.set()
        time.sleep(0.02)
        return real(fd, data, offset)

    monkeypatch.setattr(plain, "pwrite_all", slow)
    ctx = multiprocessing.get_context("fork")
    n = 3000  # 25 MB: batches of 4 MiB, each written slowly
    columns = {0: np.zeros((n, 1024), np.int64), 1: np.arange(n)}
    with evs.Writer(path) as w:
        writing = threading.Thread(target=w.extend_columns, args=(columns,))
        writing.start()
        assert inside.wait(30)
        queue = ctx.Queue()
        child = ctx.Process(target=_child_misuses, args=(w, queue))
        child.start()
        message = queue.get(timeout=30)
        child.join(30)
        writing.join()
        assert child.exitcode == 0 and "inherited by fork" in message
        assert len(w) == n
    with evs.open(path) as ds:
        assert len(ds) == n and ds.verify().ok


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_commit_that_fails_before_its_footer_leaves_no_stray_bytes(
    tmp_path, monkeypatch, compression
):
    """A commit whose fsync fails (a full disk, EIO, an interrupt) before its footer is
    written made nothing visible. Its index segment was written already: trying again
    wrote a second one after it, and the first stayed in the file as stray bytes between
    blocks (verify: "non-zero bytes in the padding"). Now the failed commit's bytes are
    taken back; where they cannot be (already compressed into frames), the writer refuses
    to go on and the file keeps its last commit."""
    path = tmp_path / ("f.evs.zst" if compression else "f.evs")
    with evs.Writer(path, compression=compression, dictionary=None) as w:
        w.extend(rec(i) for i in range(3))
    real_fsync = os.fsync

    def fail(fd):
        raise OSError(5, "Input/output error")

    w = evs.Writer(path, "a")
    w.extend(rec(i) for i in range(3, 6))
    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError):
        w.commit()
    monkeypatch.setattr(os, "fsync", real_fsync)
    if compression:  # the frames are written: the records since the last commit are lost
        with pytest.raises(evs.ClosedError, match="a write failed part way"):
            w.commit()
        w.abort()
        expected = 3
    else:
        w.commit()
        w.close()
        expected = 6
    with evs.open(path) as ds:
        assert len(ds) == expected and ds.verify().ok
        assert [r[1] for r in ds] == list(range(expected))


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_datasets_dropped_without_close_leave_no_descriptor(tmp_path, compression, backend):
    """``evs.open(p)[i]`` in a loop, or a dataset opened per epoch and never closed: each
    one's descriptor goes when it is collected (a compressed file's stayed open for good,
    and a loop of them ran out of descriptors). A view it handed out stays readable (and
    keeps its mapping, with its descriptor, until it goes too)."""
    path = tmp_path / "f.evs"
    with evs.Writer(path, compression=compression, durable=False) as w:
        w.extend([[np.arange(64) + i, f"x{i}"] for i in range(50)])
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    copies = [[np.array(v) for v in evs.open(path, backend=backend)[k % 50]] for k in range(200)]
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
    assert [int(tensor[0]) for tensor, _ in copies] == [k % 50 for k in range(200)]
    view, name = evs.open(path, backend=backend)[7]
    gc.collect()
    assert view[0] == 7 and view.sum() == np.arange(64).sum() + 64 * 7 and name == "x7"
    del view
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_closing_a_dataset_other_threads_read_raises_closed_error_in_them(
    tmp_path, compression, backend
):
    """One thread closes a dataset while others read it every way (ds[i], fancy indexing,
    get_batch, get_many, scans, raw, entries, verify): each read returns right records or
    raises ClosedError, never an AttributeError, a released-buffer ValueError or a
    FormatError blaming the file (a compressed source read after close() "ended inside a
    frame"). Views taken before the close stay right."""
    path = tmp_path / "f.evs"
    n = 1500
    with evs.Writer(path, compression=compression, durable=False) as w:
        w.extend([[np.arange(32) + i, np.full(4, i, np.float32), i, f"ex-{i}"] for i in range(n)])
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def read(ds, seed: int) -> None:
        rng = np.random.default_rng(seed)
        kept = []
        try:
            for step in range(100_000):
                op, i = step % 8, int(rng.integers(0, n))
                if op == 0:
                    kept.append((i, ds[i]))
                elif op == 1:
                    got = ds[rng.integers(0, n, 8)]
                    assert len(got) == 8
                elif op == 2:
                    batch = ds.get_batch(rng.integers(0, n, 16))
                    assert batch[0].shape == (16, 32)
                elif op == 3:
                    assert ds.get_many([i, 0])[0][2] == i
                elif op == 4:
                    assert [r[2] for _, r in zip(range(40), ds)] == list(range(40))
                elif op == 5:
                    assert len(ds.raw(i)) > 0
                elif op == 6:
                    assert len(ds.entries()) == n
                elif step % 64 == 7:
                    assert ds.verify().ok
            result = "finished"
        except evs.ClosedError:
            result = "ClosedError"
        except BaseException as exc:  # noqa: BLE001 (counted and shown below)
            result = f"{type(exc).__name__}: {exc}"
        for i, record in kept:
            assert record[2] == i and int(record[0][0]) == i and record[3] == f"ex-{i}"
        with lock:
            outcomes[result] = outcomes.get(result, 0) + 1

    for trial in range(12):
        ds = evs.open(path, backend=backend)
        threads = [threading.Thread(target=read, args=(ds, trial * 3 + k)) for k in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.003 * trial)
        ds.close()
        for t in threads:
            t.join()
    assert set(outcomes) <= {"ClosedError", "finished"}, outcomes
    assert outcomes.get("ClosedError", 0) >= 12  # the reads really raced the close


def test_a_closed_readers_descriptor_stays_open_while_a_read_holds_it(tmp_path):
    """close() of a pread-backed reader lets go of its descriptor; a read another thread has
    under way still holds it, so the number is closed only after that read (a number
    closed under a running pread could be taken by a file opened meanwhile, whose bytes
    the read would then return). With no read under way it is closed at once."""
    from evalue_store import byteio
    from evalue_store.physical.plain import PreadSource

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 16)
    for make in (
        lambda fd: byteio.FdReader(fd, 4096, owns_fd=True),
        lambda fd: PreadSource(fd, 4096, owns_fd=True),
    ):
        fd = os.open(path, os.O_RDONLY)
        reader = make(fd)
        in_flight = reader.held  # what a running read holds
        reader.close()
        assert reader.fd == -1
        os.fstat(fd)  # still open: the read in flight would finish on its own file
        del in_flight
        with pytest.raises(OSError):
            os.fstat(fd)  # closed with the last holder
        fd = os.open(path, os.O_RDONLY)
        make(fd).close()
        with pytest.raises(OSError):
            os.fstat(fd)  # no read under way: closed by close()
    fd = os.open(path, os.O_RDONLY)
    borrowed = byteio.FdReader(fd, 4096)  # a reader that does not own it never closes it
    borrowed.close()
    del borrowed
    os.fstat(fd)
    os.close(fd)


def test_closing_a_pread_reader_closes_its_descriptor_in_the_call(tmp_path, monkeypatch):
    """With no read under way, close() closes the descriptor itself, so an interrupt or
    an error of that close(2) reaches its caller (had it been left to the collector, it
    would only be printed as "Exception ignored")."""
    from evalue_store import byteio
    from evalue_store.physical.plain import PreadSource

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(4096))
    for make in (
        lambda fd: byteio.FdReader(fd, 4096, owns_fd=True),
        lambda fd: PreadSource(fd, 4096, owns_fd=True),
    ):
        fd = os.open(path, os.O_RDONLY)
        reader = make(fd)
        real_close = os.close

        def interrupted(number):
            raise KeyboardInterrupt

        monkeypatch.setattr(byteio.os, "close", interrupted)
        with pytest.raises(KeyboardInterrupt):
            reader.close()
        monkeypatch.setattr(byteio.os, "close", real_close)
        del reader
        gc.collect()
        os.fstat(fd)  # the interrupted close did not happen, and nothing closed it since
        os.close(fd)
