"""Reading and writing containers in object storage, against real servers started here:
moto's S3 server (behind a proxy that counts what the client asked for) and nginx.

The bounds asserted are the promises of ``evalue_store.remote``: open costs O(1) requests
whatever the record count; a cold record costs its index block and its own bytes; a batch
is fetched in one round of concurrent requests; faults are retried, then named.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.errors import RemoteError
from evalue_store.physical import remote
from evalue_store.physical.remote import RETRIES

from .servers import have_nginx, nginx, s3_server

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

BLOCK = remote.BLOCK_SIZE


def record(i: int) -> list:
    return [np.full(i % 7 + 1, i, np.int64), f"r{i}", float(i)]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b)
    )


def write(path, n: int, make=record) -> str:
    with evs.Writer(path) as w:
        for i in range(n):
            w.append(make(i))
    return str(path)


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        server.fs().mkdir("bkt")
        yield server


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)


def upload(s3, tmp_path, name: str, n: int, make=record) -> str:
    local = write(tmp_path / name, n, make)
    s3.fs().put_file(local, f"bkt/{name}")
    s3.log.settle()  # a retried PUT's first try may still be logging: not the test's requests
    return f"s3://bkt/{name}"


# ---------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("n", [10, 100_000])
def test_open_costs_a_fixed_number_of_requests(s3, tmp_path, n):
    url = upload(s3, tmp_path, f"open{n}.evs", n, lambda i: [i])
    size = (tmp_path / f"open{n}.evs").stat().st_size
    s3.log.clear()
    ds = evs.open(url, storage_options=s3.options)
    seen = list(s3.log.seen)
    assert len(ds) == n
    assert [s.method for s in seen].count("GET") <= 2  # head and tail, one round
    assert len(seen) <= 3  # and the object's info
    assert all(s.range for s in seen if s.method == "GET")  # never an open-ended GET
    assert sum(s.body_bytes for s in seen) <= 2 * remote.HEAD_BYTES
    if n == 100_000:
        assert sum(s.body_bytes for s in seen) < size / 8


def test_cold_record_costs_its_block_and_index_block(s3, tmp_path):
    n = 100_000
    url = upload(s3, tmp_path, "cold.evs", n, lambda i: [np.full(16, i, np.int32), i])
    size = (tmp_path / "cold.evs").stat().st_size
    lengths = evs.open(tmp_path / "cold.evs").entries()["length"]
    ds = evs.open(url, storage_options=s3.options)
    rng = np.random.default_rng(1)
    for i in rng.integers(n // 8, n - n // 8, 5).tolist():  # far from the cached head and tail
        s3.log.clear()
        got = ds[i]
        assert got[1] == i and np.array_equal(got[0], np.full(16, i, np.int32))
        gets = s3.log.gets()
        record_size = int(lengths[i]) + 16  # payload and frame header
        assert 1 <= len(gets) <= 2
        assert sum(g.body_bytes for g in gets) <= record_size + 2 * BLOCK
        assert sum(g.body_bytes for g in gets) < size / 16
    s3.log.clear()
    ds[i]  # warm: nothing asked
    assert s3.log.gets() == []


def test_batch_is_one_round_of_concurrent_requests(s3, tmp_path):
    n = 50_000
    url = upload(s3, tmp_path, "batch.evs", n, lambda i: [np.full(8, i, np.int64)])
    ds = evs.open(url, storage_options=s3.options)
    idx = np.random.default_rng(2).choice(n, 256, replace=False)
    s3.log.clear()
    before = ds._source.reader.requests
    got = ds[idx]
    assert [int(r[0][0]) for r in got] == idx.tolist()
    gets = s3.log.gets()
    # each record and each index entry needs at most one block; neighbours share one
    assert len(gets) <= 2 * 256
    assert s3.log.max_in_flight >= 8  # issued together, not one after another
    assert ds._source.reader.requests - before == len(gets)
    index_bytes = n * 16 + 2 * BLOCK
    record_bytes = int(evs.open(tmp_path / "batch.evs").entries()["length"][0]) + 16
    fetched = sum(g.body_bytes for g in gets)
    assert fetched <= index_bytes + 256 * (record_bytes + remote.MERGE_GAP)
    s3.log.clear()
    assert [int(r[0][0]) for r in ds.get_many(idx[:10])] == idx[:10].tolist()
    fresh = evs.open(url, storage_options=s3.options)
    s3.log.clear()
    columns = fresh.get_batch(idx)  # a stacked batch: the same one round of requests
    assert columns[0][:, 0].tolist() == idx.tolist() and columns[0].shape == (256, 8)
    assert len(s3.log.gets()) <= 2 * 256 and s3.log.max_in_flight >= 8


def test_records_iteration_verify_and_pickle_match_local(s3, tmp_path):
    url = upload(s3, tmp_path, "all.evs", 3000)
    local = evs.open(tmp_path / "all.evs")
    ds = evs.open(url, storage_options=s3.options)
    assert ds.metadata == local.metadata and len(ds) == len(local)
    assert all(same(a, b) for a, b in zip(ds, local))
    assert all(same(ds[i], local[i]) for i in (0, 1, 2999, 1500))
    report = ds.verify()
    assert report.ok if hasattr(report, "ok") else not report.bad_records
    copy = pickle.loads(pickle.dumps(ds))
    assert same(copy[7], local[7]) and copy._source is not ds._source


def test_filesystem_argument_and_errors_name_the_url(s3, tmp_path):
    upload(s3, tmp_path, "fsarg.evs", 20)
    ds = evs.open("bkt/fsarg.evs", filesystem=s3.fs())
    assert same(ds[3], record(3))
    with pytest.raises(FileNotFoundError, match="s3://bkt/missing.evs"):
        evs.open("s3://bkt/missing.evs", storage_options=s3.options)


def test_damaged_record_is_a_format_error_naming_the_url(s3, tmp_path):
    local = write(tmp_path / "bad.evs", 50)
    data = bytearray(open(local, "rb").read())
    at = int(evs.open(local).entries()[10]["offset"]) + 20
    data[at] ^= 0xFF
    s3.fs().pipe_file("bkt/bad.evs", bytes(data))
    ds = evs.open("s3://bkt/bad.evs", storage_options=s3.options)
    with pytest.raises(evs.FormatError, match="s3://bkt/bad.evs") as err:
        ds[10]
    assert err.value.record == 10
    assert [b[0] for b in ds.verify().bad_records] == [10]


# ---------------------------------------------------------------------------- faults


@contextlib.contextmanager
def failing(s3, status: int = 500):
    """The server answers every request with ``status`` until the block ends."""
    s3.proxy.faults.status, s3.proxy.faults.count = status, -1
    try:
        yield
    finally:
        s3.proxy.faults.count = 0


def test_server_errors_are_retried_then_named(s3, tmp_path):
    url = upload(s3, tmp_path, "flaky.evs", 20_000, lambda i: [i])
    ds = evs.open(url, storage_options=s3.options)
    s3.proxy.faults.status, s3.proxy.faults.count = 503, 2
    assert ds[10_000] == [10_000]  # two 503s, then the answer
    with failing(s3), pytest.raises(RemoteError, match="s3://bkt/flaky.evs"):
        ds[15_000]
    assert ds[15_000] == [15_000]  # the server is back


def test_a_failing_request_is_tried_as_often_as_documented(s3, tmp_path):
    """TRAINING.md: each request is retried 4 times with backoff, then RemoteError. With
    storage options that say nothing of retries, botocore's own came under ours: a dead
    endpoint took 80 s to report (attacker finding, session 10). Counted at the proxy."""
    url = upload(s3, tmp_path, "tries.evs", 20_000, lambda i: [i])
    options = {k: v for k, v in s3.options.items() if k != "config_kwargs"}
    ds = evs.open(url, storage_options=options)
    before = len(s3.log.gets())
    with failing(s3), pytest.raises(RemoteError, match="s3://bkt/tries.evs"):
        ds[15_000]
    tries = [g for g in s3.log.gets()[before:] if g.path == "/bkt/tries.evs"]
    # RETRIES + 1 of ours (a read-ahead of the same range may make a couple more); botocore's
    # own attempts under each of ours made it several times that
    assert RETRIES + 1 <= len(tries) < 2 * (RETRIES + 1), tries
    assert ds[15_000] == [15_000]


def test_connection_dropped_mid_read_is_retried(s3, tmp_path):
    url = upload(s3, tmp_path, "drop.evs", 20_000, lambda i: [i])
    ds = evs.open(url, storage_options=s3.options)
    s3.proxy.faults.drop = 2
    assert ds[12_345] == [12_345]
    assert s3.proxy.faults.drop == 0


def test_object_replaced_by_a_shorter_one_never_gives_wrong_data(s3, tmp_path):
    n = 20_000
    url = upload(s3, tmp_path, "shrink.evs", n, lambda i: [i])
    ds = evs.open(url, storage_options=s3.options)
    write(tmp_path / "short.evs", 100, lambda i: [-i])
    s3.fs().put_file(str(tmp_path / "short.evs"), "bkt/shrink.evs")
    codes = []
    for i in np.random.default_rng(3).choice(n, 40, replace=False).tolist():
        try:
            assert ds[i] == [i]
        except evs.FormatError as exc:
            assert "s3://bkt/shrink.evs" in str(exc)
            codes.append(exc.code)
    assert "changed" in codes  # a range the shorter object cannot serve: not a damaged file


def two_versions(tmp_path, compression: str | None = None) -> tuple[str, str, int]:
    """Two containers of the same layout whose records differ (field 1: 1 or 2), in two
    commits, so that the first commit's index is not in the tail read at open; plain ones
    have the same size."""
    n = 6000
    paths = []
    for tag in (1, 2):
        path = tmp_path / f"v{tag}.evs"
        noise = np.random.default_rng(tag).integers(0, 1 << 62, (n, 16))  # incompressible
        with evs.Writer(path, compression=compression) as w:
            for c in range(2):
                part = range(c * n // 2, (c + 1) * n // 2)
                w.extend([[np.full(8, i, np.int64), tag, noise[i]] for i in part])
                w.commit()
        paths.append(str(path))
    if compression is None:
        assert os.path.getsize(paths[0]) == os.path.getsize(paths[1])
    return paths[0], paths[1], n


def reads_never_mix(ds, url: str, n: int) -> int:
    """Read records of an object replaced since ``ds`` opened it: each read gives the opened
    object's record or a FormatError naming the URL. Returns how many were errors."""
    errors = 0
    for i in (n // 2 - 1, 100, n - 1, 3, n // 3):
        try:
            got = ds[i]
            assert got[1] == 1 and got[0].tolist() == [i] * 8
        except evs.FormatError as exc:
            assert url in str(exc) and "changed since it was opened" in str(exc)
            assert exc.code == "changed"
            errors += 1
    try:
        assert [r[1] for r in ds.get_many(list(range(0, n, 97)))] == [1] * len(range(0, n, 97))
    except evs.FormatError as exc:
        assert url in str(exc)
        errors += 1
    return errors


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_object_replaced_by_one_of_the_same_size_is_refused_never_mixed(s3, tmp_path, compression):
    old, new, n = two_versions(tmp_path, compression)
    fs = s3.fs()
    url = f"s3://bkt/same-{compression}.evs"
    fs.put_file(old, url)
    ds = evs.open(url, storage_options=s3.options)
    assert ds[n - 1][1] == 1
    copy = pickle.dumps(ds)  # a DataLoader worker's copy, made before the replacement
    fs.put_file(new, url)
    s3.log.clear()
    assert reads_never_mix(ds, url, n) > 0
    assert any(seen.status == 412 for seen in s3.log.gets())  # refused, not read and judged
    with pytest.raises(evs.FormatError, match="replaced since"):
        pickle.loads(copy)[0]


# ---------------------------------------------------------------------------- shards, writing


def test_shard_writer_uploads_shards_then_manifest(s3, tmp_path):
    base = "s3://bkt/sharded"
    seen_manifest = []
    with evs.ShardWriter(
        f"{base}/train-{{:05d}}.evs", max_records=40, storage_options=s3.options
    ) as w:
        for i in range(100):
            w.append(record(i))
            if i == 90:  # two shards are up, the third is not: no manifest yet
                seen_manifest.append(s3.fs().exists("bkt/sharded/train.manifest.json"))
                assert s3.fs().exists("bkt/sharded/train-00001.evs")
    assert seen_manifest == [False]
    assert w.manifest_path == f"{base}/train.manifest.json"
    for source in (w.manifest_path, f"{base}/train-*.evs", [f"{base}/train-00000.evs"]):
        sharded = evs.open_shards(source, storage_options=s3.options)
        assert len(sharded) in (100, 40)
        assert same(sharded[39], record(39))
    sharded = evs.open_shards(w.manifest_path, storage_options=s3.options)
    assert same(sharded[99], record(99))
    assert all(same(a, record(i)) for i, a in zip([5, 45, 85], sharded[[5, 45, 85]]))
    copy = pickle.loads(pickle.dumps(sharded))
    assert [same(copy[i], record(i)) for i in (0, 50, 99)] == [True] * 3


def test_a_rerun_into_a_finished_remote_job_is_refused_when_built(s3):
    """TRAINING.md: a finished job's manifest is never replaced without overwrite=True; a
    rerun that writes nothing fails when the ShardWriter is built, as locally (an s3://
    rerun replaced the manifest with an empty one at close: open_shards then found 0
    records; attacker finding, session 10)."""
    pattern = "s3://bkt/rerun/p-{:03d}.evs"
    with evs.ShardWriter(pattern, max_records=10, storage_options=s3.options) as w:
        for i in range(25):
            w.append(record(i))
    with pytest.raises(FileExistsError, match="finished job's manifest"):
        evs.ShardWriter(pattern, storage_options=s3.options)
    assert len(evs.open_shards(w.manifest_path, storage_options=s3.options)) == 25
    with evs.ShardWriter(pattern, storage_options=s3.options, overwrite=True) as again:
        again.append(record(0))
    assert len(evs.open_shards(again.manifest_path, storage_options=s3.options)) == 1


def test_a_failed_upload_keeps_the_committed_records(s3):
    """README: a Writer to a URL commits to its staging file, and committed records are never
    lost: when the upload at close() or abort() fails (here the bucket does not exist, so the
    real server refuses it), the staging file stays, holding them, and the error says where.
    Before, it was deleted with them (attacker finding, session 10). A ShardWriter keeps a
    shard whose upload failed the same way, and warns."""
    for finish in ("close", "abort"):
        w = evs.Writer(f"s3://no-such-bucket/{finish}.evs", storage_options=s3.options)
        w.extend([record(i) for i in range(10)])
        w.commit()
        with pytest.raises(OSError) as info:  # the store's refusal (no such bucket)
            getattr(w, finish)()
        assert any(w.path in note for note in getattr(info.value, "__notes__", [w.path]))
        with evs.open(w.path) as kept:
            assert len(kept) == 10 and same(kept[9], record(9))
        shutil.rmtree(os.path.dirname(w.path))
    shards = evs.ShardWriter(
        "s3://no-such-bucket/s-{:02d}.evs", max_records=5, storage_options=s3.options
    )
    with pytest.warns(UserWarning, match="shards not uploaded, their committed records kept"):
        with pytest.raises(OSError):
            with shards:
                for i in range(7):
                    shards.append(record(i))
    staged = shards._staging.dir
    with evs.open(os.path.join(staged, sorted(os.listdir(staged))[0])) as kept:
        assert len(kept) == 5
    shutil.rmtree(staged)


def test_shard_writer_failure_leaves_no_manifest(s3, tmp_path):
    with pytest.raises(RuntimeError):
        with evs.ShardWriter(
            "s3://bkt/failed/x-{:03d}.evs", max_records=10, storage_options=s3.options
        ) as w:
            for i in range(25):
                w.append(record(i))
            raise RuntimeError("job died")
    fs = s3.fs()
    assert not fs.exists("bkt/failed/x.manifest.json")
    assert sorted(fs.ls("bkt/failed", detail=False)) == [
        "bkt/failed/x-000.evs",
        "bkt/failed/x-001.evs",
    ]


def test_writer_to_a_url(s3):
    url = "s3://bkt/direct.evs"
    with evs.Writer(url, storage_options=s3.options, metadata={"k": 1}) as w:
        for i in range(30):
            w.append(record(i))
    ds = evs.open(url, storage_options=s3.options)
    assert len(ds) == 30 and ds.metadata == {"k": 1} and same(ds[29], record(29))
    with pytest.raises(FileExistsError):
        evs.Writer(url, "x", storage_options=s3.options)


def test_writer_to_a_url_commits_to_its_staging_file_until_close(s3, tmp_path):
    """commit() on a URL writer makes records durable in the staging file it names
    (``path``, named as the object); killed before close, the writer leaves no object and
    that file holding every committed record. An abort keeps committed records: it
    uploads them (and nothing when none were committed)."""
    url = "s3://bkt/killed.evs"
    script = textwrap.dedent(
        f"""
        import json, os, signal, sys
        import evalue_store as evs
        w = evs.Writer({url!r}, storage_options=json.loads(sys.argv[1]))
        for i in range(100):
            w.append([i])
        w.commit()
        w.append([-1])
        print(w.path, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(s3.options)], capture_output=True, text=True
    )
    staged = proc.stdout.strip()
    assert proc.returncode == -signal.SIGKILL and staged, proc.stderr[-2000:]
    assert os.path.basename(staged) == "killed.evs"
    with pytest.raises(FileNotFoundError):
        evs.open(url, storage_options=s3.options)
    with evs.open(staged) as ds:
        assert [r[0] for r in ds] == list(range(100))
    shutil.rmtree(os.path.dirname(staged))
    for name, commits in (("aborted.evs", True), ("nothing.evs", False)):
        with (
            pytest.raises(KeyError),
            evs.Writer(f"s3://bkt/{name}", storage_options=s3.options) as w,
        ):
            w.extend([[i] for i in range(10)])
            if commits:
                w.commit()
            w.append([-1])
            raise KeyError("the job failed")
        assert not os.path.exists(w.staging)
        if commits:
            assert [r[0] for r in evs.open(f"s3://bkt/{name}", storage_options=s3.options)] == list(
                range(10)
            )
        else:
            assert not s3.fs().exists(f"bkt/{name}")


def test_cache_dir_copy_is_checked_and_reused(s3, tmp_path):
    url = upload(s3, tmp_path, "cached.evs", 500)
    cache = tmp_path / "cache"
    ds = evs.open(url, storage_options=s3.options, cache_dir=cache)
    assert same(ds[499], record(499))
    copies = list(cache.iterdir())  # no temporary file left beside the copy
    assert len(copies) == 1 and not copies[0].name.startswith(".")
    assert copies[0].stat().st_mode & 0o777 == 0o600
    size = (tmp_path / "cached.evs").stat().st_size
    s3.log.clear()
    again = evs.open(url, storage_options=s3.options, cache_dir=cache)
    assert sum(g.body_bytes for g in s3.log.gets()) < 1024 < size  # only the tail compared
    assert same(again[0], record(0))
    write(tmp_path / "cached.evs", 7)  # a new version: a new copy
    s3.fs().put_file(str(tmp_path / "cached.evs"), "bkt/cached.evs")
    assert len(evs.open(url, storage_options=s3.options, cache_dir=cache)) == 7


def test_compressed_remote_file_reads_only_its_frames(s3, tmp_path):
    n = 20_000
    with evs.Writer(tmp_path / "z.evs.zst", compression="zstd") as w:
        for i in range(n):
            w.append([np.random.default_rng(i).random(32), i])  # incompressible-ish
    size = (tmp_path / "z.evs.zst").stat().st_size
    s3.fs().put_file(str(tmp_path / "z.evs.zst"), "bkt/z.evs.zst")
    url = "s3://bkt/z.evs.zst"
    local = evs.open(tmp_path / "z.evs.zst")
    s3.log.clear()
    ds = evs.open(url, storage_options=s3.options)
    assert ds.compressed and len(ds) == n
    opened = sum(g.body_bytes for g in s3.log.gets())
    assert opened < size / 4
    s3.log.clear()
    assert same(ds[n // 2], local[n // 2])
    assert sum(g.body_bytes for g in s3.log.gets()) < size / 4  # its frame(s), not the file
    assert all(same(a, b) for a, b in zip(ds[[3, 17_000, 9_999]], local[[3, 17_000, 9_999]]))
    assert not ds.verify().bad_records
    copy = evs.open(url, storage_options=s3.options, cache_dir=tmp_path / "c")
    assert same(copy[n - 1], local[n - 1])


@pytest.mark.parametrize("compression", ["zstd", None])
def test_verify_of_an_object_downloads_it_once(s3, tmp_path, compression):
    """verify checks records, padding (and frames) from one pass in file order: with a
    block cache smaller than the object, it fetches about the object's size (a compressed
    one was fetched 1.66 times: the record pass and the frame pass each read every frame;
    1.17 now, the small reads of each commit's blocks fetching whole 64 KiB blocks)."""
    name = "v.evs.zst" if compression else "v.evs"
    path = tmp_path / name
    with evs.Writer(path, compression=compression) as w:
        for part in range(2):
            w.extend_columns({0: np.random.default_rng(part).random((6000, 32))})
            w.commit()
    size = path.stat().st_size
    s3.fs().put_file(str(path), f"bkt/{name}")
    ds = evs.open(f"s3://bkt/{name}", storage_options=s3.options, cache_bytes=1 << 20)
    s3.log.clear()
    report = ds.verify()
    fetched = sum(g.body_bytes for g in s3.log.gets())
    assert report.ok and report.records == 12000, report
    # (the blocks and run frames of each commit, read apart, fetch whole 64 KiB blocks)
    assert fetched < 1.2 * size, f"verify fetched {fetched} bytes of a {size}-byte object"


def test_dataloader_workers_reopen(s3, tmp_path):
    torch = pytest.importorskip("torch")
    url = upload(s3, tmp_path, "loader.evs", 64, lambda i: [np.full(4, i, np.float32)])
    ds = evs.open(url, storage_options=s3.options)

    class Wrap(torch.utils.data.Dataset):
        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            return torch.from_numpy(ds[i][0].copy())

    loader = torch.utils.data.DataLoader(Wrap(), batch_size=16, num_workers=2)
    got = torch.cat(list(loader))
    assert got[:, 0].tolist() == list(range(64))


def test_concurrent_threads_share_a_dataset(s3, tmp_path):
    url = upload(s3, tmp_path, "threads.evs", 5000, lambda i: [i])
    ds = evs.open(url, storage_options=s3.options)
    bad: list = []

    def work(seed: int) -> None:
        for i in np.random.default_rng(seed).integers(0, 5000, 50).tolist():
            if ds[i] != [i]:
                bad.append(i)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


# ---------------------------------------------------------------------------- HTTP (nginx)


@pytest.mark.skipif(not have_nginx(), reason="nginx is not installed (.ci/run installs it)")
def test_http_through_nginx_ranged_reads(tmp_path):
    pytest.importorskip("aiohttp")
    root = tmp_path / "www"
    root.mkdir()
    n = 100_000
    write(root / "d.evs", n, lambda i: [np.full(4, i, np.int32)])
    size = (root / "d.evs").stat().st_size
    (tmp_path / "nginx").mkdir()
    with nginx(root, tmp_path / "nginx") as server:
        url = f"{server.url}/d.evs"
        ds = evs.open(url)
        opened = server.requests()
        assert len(ds) == n
        gets = [r for r in opened if r[0].startswith("GET")]
        assert len(gets) <= 2 and all(r[3].startswith("bytes=") for r in gets)
        assert sum(r[2] for r in opened) <= 2 * remote.HEAD_BYTES
        server.clear()
        assert ds[n // 2][0].tolist() == [n // 2] * 4
        cold = server.requests()
        assert 1 <= len(cold) <= 2 and all(r[1] == 206 for r in cold)
        assert sum(r[2] for r in cold) <= 16 + 64 + 2 * BLOCK < size
        server.clear()
        idx = np.random.default_rng(4).choice(n, 256, replace=False)
        assert [int(r[0][0]) for r in ds[idx]] == idx.tolist()
        assert len(server.requests()) <= 512
        with evs.ShardWriter(root / "s-{:02d}.evs", max_records=30) as w:
            for i in range(70):
                w.append([np.full(2, i, np.int16)])
        shards = evs.open_shards(f"{server.url}/s.manifest.json")
        assert len(shards) == 70 and shards[69][0].tolist() == [69, 69]
        (root / "s-01.evs").unlink()
        with pytest.raises(evs.FormatError, match="shards.1"):
            evs.open_shards(f"{server.url}/s.manifest.json")
        missing = f"{server.url}/nope.evs"
        with pytest.raises(FileNotFoundError, match="nope.evs"):
            evs.open(missing)


@pytest.mark.skipif(not have_nginx(), reason="nginx is not installed (.ci/run installs it)")
def test_http_object_replaced_by_one_of_the_same_size_is_refused_never_mixed(tmp_path):
    pytest.importorskip("aiohttp")
    old, new, n = two_versions(tmp_path)
    root = tmp_path / "www"
    root.mkdir()
    shutil.copy(old, root / "d.evs")
    (tmp_path / "nginx").mkdir()
    with nginx(root, tmp_path / "nginx") as server:
        url = f"{server.url}/d.evs"
        ds = evs.open(url)
        assert ds[n - 1][1] == 1
        shutil.copy(new, root / "next.evs")
        os.utime(root / "next.evs", (1e9, 1e9))  # nginx's ETag: modification second, size
        os.replace(root / "next.evs", root / "d.evs")
        server.clear()
        assert reads_never_mix(ds, url, n) > 0
        assert any(status == 412 for _, status, _, _ in server.requests())


@pytest.mark.skipif(not have_nginx(), reason="nginx is not installed (.ci/run installs it)")
def test_http_server_without_etag_reads_with_a_warning(tmp_path):
    """Without an ETag no read can be conditional: open says so, and reads still work."""
    pytest.importorskip("aiohttp")
    root = tmp_path / "www"
    root.mkdir()
    write(root / "d.evs", 500)
    (tmp_path / "nginx").mkdir()
    with nginx(root, tmp_path / "nginx", "etag off;") as server:
        url = f"{server.url}/d.evs"
        with pytest.warns(UserWarning, match="no strong ETag.* records of both may be returned"):
            ds = evs.open(url)
        assert url in str(ds.path) and same(ds[499], record(499))


@pytest.mark.skipif(not have_nginx(), reason="nginx is not installed (.ci/run installs it)")
def test_http_server_ignoring_range_is_named_as_such(tmp_path):
    """A server answering ranged GETs with the whole object (nginx ``max_ranges 0``) is
    a RemoteError saying so, not an object that changed."""
    pytest.importorskip("aiohttp")
    root = tmp_path / "www"
    root.mkdir()
    write(root / "d.evs", 20_000)
    assert (root / "d.evs").stat().st_size > 2 * remote.HEAD_BYTES
    (tmp_path / "nginx").mkdir()
    with nginx(root, tmp_path / "nginx", "max_ranges 0;") as server:
        with pytest.raises(RemoteError, match="the server ignores Range"):
            evs.open(f"{server.url}/d.evs")


@pytest.mark.skipif(not have_nginx(), reason="nginx is not installed (.ci/run installs it)")
def test_cli_commands_take_a_url(tmp_path):
    """README: every reader takes a URL, the CLI's included; a missing object is one line
    naming it, exit 2, like a missing file."""
    pytest.importorskip("aiohttp")
    root = tmp_path / "www"
    root.mkdir()
    write(root / "a.evs", 10)
    (tmp_path / "nginx").mkdir()
    with nginx(root, tmp_path / "nginx") as server:
        for command in ("info", "verify", "head"):
            proc = subprocess.run(
                [sys.executable, "-m", "evalue_store", command, f"{server.url}/a.evs"],
                capture_output=True,
                text=True,
            )
            assert proc.returncode == 0, (command, proc.stderr)
        proc = subprocess.run(
            [sys.executable, "-m", "evalue_store", "info", f"{server.url}/gone.evs"],
            capture_output=True,
            text=True,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "internal" not in lines[0]
        assert f"{server.url}/gone.evs: No such file or directory" in lines[0]


def test_scan_fetches_ahead_instead_of_one_request_per_record(s3, tmp_path):
    n = 20_000
    url = upload(s3, tmp_path, "scan.evs", n, lambda i: [np.full(64, i, np.int32)])  # ~330 B
    size = (tmp_path / "scan.evs").stat().st_size
    ds = evs.open(url, storage_options=s3.options)
    s3.log.clear()
    assert [int(r[0][0]) for r in ds] == list(range(n))
    gets = s3.log.gets()
    assert len(gets) <= size // BLOCK // 4 + 10  # read-ahead grows to MAX_READAHEAD
    assert sum(g.body_bytes for g in gets) <= 2 * size


def test_torch_datasets_over_a_bucket(s3, tmp_path):
    torch = pytest.importorskip("torch")
    from evalue_store.torch import EValueDataset, ShardedIterableDataset

    base = "s3://bkt/torch"
    with evs.ShardWriter(f"{base}/p-{{:03d}}.evs", max_records=25, storage_options=s3.options) as w:
        for i in range(60):
            w.append([np.full(3, i, np.int64)])
    shards = evs.open_shards(f"{base}/", storage_options=s3.options, validate=True)
    mapped = EValueDataset(shards)
    assert len(mapped) == 60 and torch.equal(mapped[59][0], torch.full((3,), 59))
    stream = ShardedIterableDataset(shards, shuffle=True, seed=1, batch_size=4)
    loader = torch.utils.data.DataLoader(stream, batch_size=4, num_workers=2)
    seen = sorted(int(x) for batch in loader for x in batch[0][:, 0])
    assert seen == list(range(60))


def test_readme_remote_block_runs(s3, tmp_path, monkeypatch):
    from .test_readme import block

    code = block("### Object storage: S3, GCS, Azure, HTTP")
    lines = code.splitlines()
    assert lines[3].startswith("opts = ")
    lines[3] = "opts = OPTIONS"
    monkeypatch.chdir(tmp_path)
    s3.fs().mkdir("bucket")
    records = [[i] for i in range(100_000)]
    env = {"records": records, "OPTIONS": s3.options}
    exec(compile("\n".join(lines), "README", "exec"), env)
    assert env["ds"][12_345] == [12_345]
