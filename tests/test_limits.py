"""Reader limits for untrusted files: max_frame_size (at open) and max_record_bytes (reads)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.zstd import MAX_FRAME_SIZE


def test_default_frame_cap_accepts_the_biggest_frames_a_writer_makes(tmp_path):
    path = tmp_path / "big-frames.evs.zst"
    with evs.Writer(path, compression="zstd", frame_size=MAX_FRAME_SIZE) as w:
        w.append([np.zeros(MAX_FRAME_SIZE // 8 + 1000, np.int64)])  # spans two frames
    with evs.open(path) as ds:
        assert ds[0][0].nbytes == MAX_FRAME_SIZE + 8000


def test_frames_over_max_frame_size_are_refused_at_open(tmp_path):
    path = tmp_path / "data.evs.zst"
    with evs.Writer(path, compression="zstd", frame_size=1 << 20) as w:
        w.extend([[np.zeros(1 << 17, np.int64)]] * 3)  # 1 MiB records, frames of 1 MiB
    with pytest.raises(evs.FormatError, match="over the reader cap 524288"):
        evs.open(path, max_frame_size=1 << 19)
    with evs.open(path, max_frame_size=1 << 20) as ds:
        assert len(ds) == 3


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_records_over_max_record_bytes_raise_on_every_read_path(tmp_path, compression, backend):
    path = tmp_path / "data.evs"
    small, big = [np.arange(10)], [np.zeros(1 << 16, np.uint8)]
    with evs.Writer(path, compression=compression) as w:
        w.extend([small, small, big, small])
    limit = 4096
    with evs.open(path, backend=backend, max_record_bytes=limit) as ds:
        assert np.array_equal(ds[0][0], small[0])
        assert len(ds.raw(1)) < limit
        readers = {
            "getitem": lambda: ds[2],
            "get_many": lambda: ds.get_many([0, 2]),
            "raw": lambda: ds.raw(2),
            "scan": lambda: list(ds),
        }
        for read in readers.values():
            with pytest.raises(evs.FormatError, match=r"record 2: \d+ bytes, over max_record"):
                read()
        assert np.array_equal(ds[3][0], small[0]), "a refused record does not stop the others"
        report = ds.verify()  # verify reads through the same limit: it reports, not reads, it
        assert [i for i, _ in report.bad_records] == [2] and not report.problems
        copy = pickle.loads(pickle.dumps(ds))
        assert copy.max_record_bytes == limit
        with pytest.raises(evs.FormatError, match="over max_record_bytes"):
            copy[2]
        copy.close()


def test_scan_fast_path_honours_the_limit_for_repeating_records(tmp_path):
    """A scan decodes runs of same-length records without reading each alone: the limit must
    stop it at the first one all the same."""
    path = tmp_path / "data.evs"
    with evs.Writer(path) as w:
        w.extend([[np.arange(512, dtype=np.int64)]] * 50)
    with evs.open(path, max_record_bytes=1024) as ds:
        with pytest.raises(evs.FormatError, match="record 0: "):
            next(iter(ds))
    with evs.open(path) as ds:
        assert len(list(ds)) == 50


def test_a_torn_last_table_does_not_skip_a_commit_over_the_cap(tmp_path):
    """With the last seek table torn the reader falls back to the previous commit; if that
    commit's table lists a frame over the cap, it must say so rather than silently open an
    even older commit."""
    path = tmp_path / "torn.evs.zst"
    with evs.Writer(path, compression="zstd", frame_size=256) as w:
        w.append([np.arange(4)])
        w.commit()
        w.append([np.random.default_rng(0).random(2000)])  # a 16 KB record: a 16 KB frame
        w.commit()
        w.append([np.arange(3)])
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with evs.open(path) as ds:  # the default cap: the previous commit, as for any torn tail
        assert len(ds) == 2 and ds.uncommitted_bytes > 0
    with pytest.raises(evs.FormatError, match="over the reader cap 4096 .*max_frame_size"):
        evs.open(path, max_frame_size=4096)
