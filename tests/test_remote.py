"""Reading and writing containers in object storage, against real servers started here:
moto's S3 server (behind a proxy that counts what the client asked for) and nginx.

The bounds asserted are the promises of ``evalue_store.remote``: open costs O(1) requests
whatever the record count; a cold record costs its index block and its own bytes; a batch
is fetched in one round of concurrent requests; faults are retried, then named.
"""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.errors import RemoteError
from evalue_store.physical import remote

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


def test_server_errors_are_retried_then_named(s3, tmp_path):
    url = upload(s3, tmp_path, "flaky.evs", 20_000, lambda i: [i])
    ds = evs.open(url, storage_options=s3.options)
    s3.proxy.faults.status, s3.proxy.faults.count = 503, 2
    assert ds[10_000] == [10_000]  # two 503s, then the answer
    s3.proxy.faults.status, s3.proxy.faults.count = 500, -1
    try:
        with pytest.raises(RemoteError, match="s3://bkt/flaky.evs"):
            ds[15_000]
    finally:
        s3.proxy.faults.count = 0
    assert ds[15_000] == [15_000]  # the server is back


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
    errors = 0
    for i in np.random.default_rng(3).choice(n, 40, replace=False).tolist():
        try:
            assert ds[i] == [i]
        except evs.FormatError as exc:
            assert "s3://bkt/shrink.evs" in str(exc)
            errors += 1
    assert errors > 0


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


def test_cache_dir_copy_is_checked_and_reused(s3, tmp_path):
    url = upload(s3, tmp_path, "cached.evs", 500)
    cache = tmp_path / "cache"
    ds = evs.open(url, storage_options=s3.options, cache_dir=cache)
    assert same(ds[499], record(499))
    copies = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(copies) == 1 and not list(cache.glob(".download.*"))
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
