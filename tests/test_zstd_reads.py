"""The fast paths of random reads from compressed files (zstd_source.ZstdSource)."""

from __future__ import annotations

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.physical import zframe

from .test_core import assert_same


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
@pytest.mark.parametrize("start", [0, 1, 63, 64, 1000, 2**40 + 5])
def test_aligned_bytes(alignment, start):
    view = zframe.aligned_bytes(100, start, alignment)
    arr = np.frombuffer(view, np.uint8)
    assert view.nbytes == 100 and not view.readonly and arr.flags.writeable
    assert (arr.ctypes.data - start) % alignment == 0
    assert view.tobytes() == bytes(100)


def _w1(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(0, 50000, 128), rng.random(16, dtype=np.float32), i % 10, f"ex-{i:06d}"]
        for i in range(n)
    ]


def test_scans_read_the_index_in_chunks_across_segments(tmp_path):
    recs = _w1(1500)
    for compression in ("zstd", None):
        path = tmp_path / f"s-{compression}.evs"
        for k, part in enumerate((recs[:700], recs[700:1100], recs[1100:])):
            with evs.Writer(path, mode="a" if k else "w", compression=compression) as w:
                w.extend(part)
        backends = ("mmap",) if compression else ("pread",)
        for backend in backends:
            with evs.open(path, backend=backend) as ds:
                assert len(ds.commit.segments) == 3
                got = list(ds)
                assert_same(got, recs)


def test_a_damaged_index_frame_loses_no_record_and_verify_reports_it(tmp_path):
    """Layout 2 (FRAMES.md): lookups go through the locators, never the compressed index, so
    a scan whose index chunk cannot be decompressed reads its records one by one from their
    locators and yields every one right; verify reports the damaged frame."""
    recs = _w1(1500)
    path = tmp_path / "d.evs"
    with evs.Writer(path, compression="zstd") as w:
        w.extend(recs)
    with evs.open(path) as ds:
        seg = ds.commit.segments[0]
        phys, logi, csizes, _ = ds._source._frame_map()
        k = int(np.searchsorted(logi, seg.offset + seg.count * 24 // 2, "right")) - 1
        middle = int(phys[k]) + int(csizes[k]) // 2  # an index frame in the middle
    with open(path, "r+b") as f:
        f.seek(middle)
        byte = f.read(1)
        f.seek(middle)
        f.write(bytes([byte[0] ^ 0xFF]))
    with evs.open(path) as ds:
        assert_same(list(ds), recs)
        report = ds.verify()
        assert not report.ok and any(f"frame at {int(phys[k])}" in p for p in report.problems)


def test_a_damaged_data_frame_is_an_error_naming_the_file_and_record(tmp_path):
    """An error found in the frame layer (a frame failing its checksum) names the file and
    the record read, as an error in the container does, with the frame's file offset."""
    path = tmp_path / "d.evs.zst"
    with evs.Writer(path, compression="zstd", frame_size=4096) as w:
        w.extend([[np.arange(50) + i, f"id-{i}"] for i in range(2000)])
    with evs.open(path) as ds:
        phys, logi, csizes, _ = ds._source._frame_map()
        k = len(phys) // 2
        i = next(j for j in range(2000) if int(ds.entries()[j]["offset"]) >= int(logi[k]))
    data = bytearray(path.read_bytes())
    data[int(phys[k]) + int(csizes[k]) // 2] ^= 0xFF
    path.write_bytes(data)
    with evs.open(path) as ds, pytest.raises(evs.FormatError) as err:
        ds[i]
    assert err.value.path == str(path) and err.value.record == i
    assert f"offset {int(phys[k])}" in str(err.value)


THREADED_READS = """
import sys, threading
import numpy as np, evalue_store as evs
ds = evs.open(sys.argv[1], cache_bytes=1)  # every read decompresses
want = [bytes(ds.raw(i)) for i in range(len(ds))]
bad = []
def work(seed):
    rng = np.random.default_rng(seed)
    for i in rng.integers(0, len(ds), 3000).tolist():
        if bytes(ds.raw(i)) != want[i] or int(ds[i][2]) != i % 10:
            bad.append(i)
threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(bad))
"""


def test_threads_reading_one_dataset(tmp_path):
    """The decoder is not thread-safe: four threads decompressing with one corrupted its
    memory (a crash, in a child here). Each thread decompresses with its own."""
    import subprocess
    import sys

    path = tmp_path / "t.evs.zst"
    with evs.Writer(path, compression="zstd") as w:
        w.extend(_w1(600))
    done = subprocess.run(
        [sys.executable, "-c", THREADED_READS, str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr[-2000:]
