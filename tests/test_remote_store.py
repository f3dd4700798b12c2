"""A bucket as it is now, from every process: against moto's S3 server behind the counting
proxy (``servers.s3_server``). Attacker findings C04-C06 of session 12: a compressed record
over max_record_bytes was downloaded whole before being refused; fsspec's listing cache
hid later shards and replacements from new opens; a dataset the parent had read could not
be read by fork DataLoader workers.
"""

from __future__ import annotations

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.physical import remote

from .servers import s3_server

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        server.fs().mkdir("bkt")
        yield server


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)


def put(s3, tmp_path, key: str, values: range, compression: str | None = None) -> str:
    local = tmp_path / key.replace("/", "_")
    with evs.Writer(local, compression=compression) as w:
        for i in values:
            w.append([np.full(16, i, np.int64), i])
    s3.fs().put_file(str(local), f"bkt/{key}")
    s3.log.settle()
    return f"s3://bkt/{key}"


def test_compressed_record_over_the_limit_is_refused_after_its_first_frame(s3, tmp_path):
    """THREAT_MODEL.md, FORMAT.md 15 rule 1: a record over max_record_bytes is refused before
    its bytes are read. A remote .evs.zst record of 8 MiB was fetched whole (all its frames)
    before the FormatError (C04); now its first frame, which holds its length, is all."""
    big = np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8)
    local = tmp_path / "big.evs.zst"
    with evs.Writer(local, compression="zstd") as w:
        w.extend([[np.zeros(10, np.uint8)], [big], [np.ones(10, np.uint8)]])
    s3.fs().put_file(str(local), "bkt/big.evs.zst")
    s3.log.settle()
    ds = evs.open("s3://bkt/big.evs.zst", storage_options=s3.options, max_record_bytes=1 << 20)
    s3.log.clear()
    with pytest.raises(evs.FormatError, match="over max_record_bytes") as err:
        ds[1]
    assert err.value.code == "limit"
    fetched = sum(g.body_bytes for g in s3.log.gets())
    assert fetched < (1 << 20) + (128 << 10), fetched  # one 1 MiB frame and a locator group
    allowed = evs.open("s3://bkt/big.evs.zst", storage_options=s3.options)
    assert np.array_equal(allowed[1][0], big) and allowed[2][0].tolist() == [1] * 10


def test_a_new_open_sees_the_bucket_as_it_is_now(s3, tmp_path):
    """README "Object storage", TRAINING.md "Reading shards": after open_shards listed a
    prefix, fsspec's cached listing answered every later listing and info: a shard added
    later was invisible to a new open_shards, evs.open of it raised FileNotFoundError, and
    a replaced object could never be freshly opened ("changed since it was opened") (C05)."""
    opts = s3.options
    put(s3, tmp_path, "now/p-0.evs", range(10))
    first = evs.open_shards("s3://bkt/now/", storage_options=opts)
    assert len(first) == 10 and first[9][1] == 9
    assert len(evs.open_shards("s3://bkt/now/p-*.evs", storage_options=opts)) == 10
    put(s3, tmp_path, "now/p-1.evs", range(100, 110))
    assert len(evs.open_shards("s3://bkt/now/", storage_options=opts)) == 20
    assert len(evs.open_shards("s3://bkt/now/p-*.evs", storage_options=opts)) == 20
    assert evs.open("s3://bkt/now/p-1.evs", storage_options=opts)[0][1] == 100
    put(s3, tmp_path, "now/p-0.evs", range(1000, 1030))  # a new version of the first
    fresh = evs.open("s3://bkt/now/p-0.evs", storage_options=opts)
    assert len(fresh) == 30 and fresh[0][1] == 1000
    s3.fs().rm("bkt/now/p-1.evs")
    with pytest.raises(FileNotFoundError, match="p-1.evs"):
        evs.open("s3://bkt/now/p-1.evs", storage_options=opts)


def test_fork_workers_read_a_dataset_the_parent_has_read(s3, tmp_path):
    """README "Training with PyTorch": works with num_workers > 0 under fork. After the
    parent read ds[0] of an s3:// EValueDataset, every fork worker died with s3fs's "This
    class is not fork-safe" (C06): the open shard's reader kept the parent's filesystem.
    Each worker now makes its own, for shards opened before the fork and after it."""
    torch = pytest.importorskip("torch")
    from evalue_store.torch import EValueDataset, collate

    urls = [put(s3, tmp_path, f"fork/p-{k}.evs", range(k * 300, (k + 1) * 300)) for k in (0, 1)]
    for given in ({"storage_options": s3.options}, {"filesystem": s3.fs()}):
        ds = EValueDataset(evs.open_shards(urls, **given))
        assert ds[0][1] == 0  # the parent opens the first shard and reads from it
        loader = torch.utils.data.DataLoader(
            ds, batch_size=50, num_workers=2, collate_fn=collate, multiprocessing_context="fork"
        )
        assert sorted(v for batch in loader for v in batch[1].tolist()) == list(range(600))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_directory_of_a_shard_writers_job_is_read_by_its_manifest(s3, tmp_path, where):
    """TRAINING.md "Many nodes": open_shards("s3://bucket/train/") of what
    ShardWriter("s3://bucket/train/part-{:05d}.evs") wrote. That writer's manifest is
    part.manifest.json, which a directory open ignored: it listed the shard files, so a
    deleted shard left it with fewer records and no error (attacker finding, session 12,
    twelfth run, C01), and an unfinished job's shards were read as finished ones."""
    if where == "local":
        folder, options = str(tmp_path / "train"), {}
    else:
        folder, options = f"s3://bkt/job-{tmp_path.name}", {"storage_options": s3.options}
    with evs.ShardWriter(folder + "/part-{:05d}.evs", max_records=100, **options) as w:
        w.extend([np.full(4, i), i] for i in range(300))
    stray = tmp_path / "stray.evs"  # another job's shard, not finished: no manifest lists it
    with evs.Writer(stray) as w:
        w.append([np.zeros(4, np.int64), -1])
    if where == "local":
        (tmp_path / "train" / "other-00000.evs").write_bytes(stray.read_bytes())
    else:
        s3.fs().put_file(str(stray), folder.removeprefix("s3://") + "/other-00000.evs")
    ds = evs.open_shards(folder, **options)
    assert len(ds) == 300 and ds[299][1] == 299
    if where == "local":
        (tmp_path / "train" / "part-00001.evs").unlink()
    else:
        s3.fs().rm(folder.removeprefix("s3://") + "/part-00001.evs")
    with pytest.raises(evs.FormatError, match=r"shards\[1\]\.path .*part-00001.evs"):
        evs.open_shards(folder, **options)
