"""evalue_store._native.checksums: the checksums of many ranges of one buffer, held to
zlib.crc32 and crc32c.crc32c on every range, and to its promise of never reading outside
the buffer whatever ranges it is handed (docs/THREAT_MODEL.md)."""

from __future__ import annotations

import array
import mmap
import multiprocessing
import sys
import threading
import zlib

import crc32c as crc32c_package
import numpy as np
import pytest

from evalue_store import _native
from evalue_store.checksums import checksum_ranges
from evalue_store.container import crc32, crc32c

REFERENCE = {"crc32": zlib.crc32, "crc32c": crc32c_package.crc32c}
FUNCTIONS = [
    ("crc32", {}),
    ("crc32c", {}),
    ("crc32", {"hardware": False}),
    ("crc32c", {"hardware": False}),
]
IDS = ["crc32", "crc32c", "crc32-tables", "crc32c-tables"]
rng = np.random.default_rng(13)
DATA = rng.integers(0, 256, 1 << 20, dtype=np.uint8)


def expected(name: str, buf, starts, lengths) -> list[int]:
    view = memoryview(buf).cast("B")
    lengths = np.broadcast_to(lengths, len(starts))
    return [REFERENCE[name](view[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())]


@pytest.mark.parametrize(("name", "kw"), FUNCTIONS, ids=IDS)
def test_every_length_and_alignment_up_to_300_bytes(name, kw):
    """Short ranges exercise the head, body and tail loops at every start alignment."""
    starts = np.repeat(np.arange(16, dtype=np.int64), 301)
    lengths = np.tile(np.arange(301, dtype=np.int64), 16)
    got = _native.checksums(DATA, starts, lengths, name, **kw)
    assert got.dtype == np.uint32 and got.shape == (len(starts),)
    assert got.tolist() == expected(name, DATA, starts, lengths)


@pytest.mark.parametrize(("name", "kw"), FUNCTIONS, ids=IDS)
def test_random_ranges_and_long_ones(name, kw):
    starts = rng.integers(0, len(DATA), 2000)
    lengths = rng.integers(0, len(DATA) - starts + 1)  # each inside the buffer
    lengths[:20] = len(DATA) - starts[:20]  # to the very end
    got = _native.checksums(DATA, starts, lengths, name, **kw)
    assert got.tolist() == expected(name, DATA, starts, lengths)
    whole = _native.checksums(DATA, np.zeros(1, np.int64), len(DATA), name, **kw)
    assert whole.tolist() == [REFERENCE[name](DATA)]


@pytest.mark.parametrize(("name", "kw"), FUNCTIONS, ids=IDS)
def test_edge_ranges(name, kw):
    """Empty ranges (also at the very end), no ranges at all, an empty buffer."""
    size = len(DATA)
    starts = np.array([0, 5, size, size - 1, size - 64, 3], np.int64)
    lengths = np.array([0, 0, 0, 1, 64, 61], np.int64)
    got = _native.checksums(DATA, starts, lengths, name, **kw)
    assert got.tolist() == expected(name, DATA, starts, lengths)
    none = _native.checksums(DATA, np.empty(0, np.int64), 7, name, **kw)
    assert none.dtype == np.uint32 and none.shape == (0,)
    empty = _native.checksums(b"", np.zeros(3, np.int64), 0, name, **kw)
    assert empty.tolist() == [0, 0, 0]


@pytest.mark.parametrize("name", ["crc32", "crc32c"])
def test_the_table_path_is_the_one_asked_for(name):
    """hardware=False runs the portable tables, the default the CPU's instructions where it
    has them (CRC-32C: SSE4.2 / ARMv8; CRC-32: PCLMULQDQ): both must give the reference."""
    starts = np.arange(0, 40960, 7, dtype=np.int64)
    for length in (63, 64, 65, 1000, 24576, 25000):
        hard = _native.checksums(DATA, starts, length, name)
        soft = _native.checksums(DATA, starts, length, name, hardware=False)
        assert hard.tolist() == soft.tolist() == expected(name, DATA, starts, length)
    assert isinstance(_native.crc32c_hardware(), bool)


def test_scalar_and_array_lengths_agree():
    starts = np.arange(0, 5000, 50, dtype=np.int64)
    one = _native.checksums(DATA, starts, 100, "crc32c")
    same = _native.checksums(DATA, starts, np.full(len(starts), 100, np.int64), "crc32c")
    scalar = _native.checksums(DATA, starts, np.int64(100), "crc32c")
    assert one.tolist() == same.tolist() == scalar.tolist()


def test_checksum_ranges_takes_the_files_function():
    starts = np.array([1, 2, 3], np.int64)
    for function, name in ((crc32, "crc32"), (crc32c, "crc32c")):
        got = checksum_ranges(function, DATA, starts, 500)
        assert got.tolist() == expected(name, DATA, starts, 500)
    with pytest.raises(KeyError):
        checksum_ranges(len, DATA, starts, 500)


@pytest.mark.parametrize(
    "make",
    [
        bytes,
        bytearray,
        lambda b: memoryview(b),
        lambda b: np.frombuffer(b, np.float32).reshape(4, -1),  # any dtype, any shape
        lambda b: array.array("d", b),
        lambda b: memoryview(b)[8:],  # a view not at its object's start
    ],
    ids=["bytes", "bytearray", "memoryview", "numpy-2d", "array", "offset-view"],
)
def test_buffer_kinds(make):
    raw = DATA[:4096].tobytes()
    buf = make(raw)
    size = memoryview(buf).nbytes
    starts = np.array([0, 1, 100, size - 33], np.int64)
    for name in REFERENCE:
        got = _native.checksums(buf, starts, 33, name)
        assert got.tolist() == expected(name, memoryview(buf).cast("B"), starts, 33)


def test_mmap_and_a_dataset_file(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(DATA[: 1 << 16].tobytes())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        starts = np.arange(0, (1 << 16) - 4096, 4093, dtype=np.int64)
        for name in REFERENCE:
            got = _native.checksums(mm, starts, 4096, name)
            assert got.tolist() == expected(name, mm, starts, 4096)
        with pytest.raises(ValueError, match="outside"):
            _native.checksums(mm, np.array([(1 << 16) - 10], np.int64), 11, "crc32c")


def test_starts_and_lengths_as_int64_buffers_of_other_kinds():
    starts = array.array("q", [0, 10, 20])
    lengths = array.array("q", [5, 6, 7])
    got = _native.checksums(DATA, starts, lengths, "crc32c")
    assert got.tolist() == expected("crc32c", DATA, np.array(starts), np.array(lengths))


SIZE = 1000
BAD_RANGES = [
    ([-1], [10]),  # negative start
    ([SIZE], [1]),  # starts at the end, one byte past it
    ([SIZE + 1], [0]),  # empty, but past the end
    ([0], [SIZE + 1]),  # runs past the end
    ([10, SIZE - 5], [5, 6]),  # the second runs one byte past
    ([5], [-1]),  # negative length
    ([2**62], [2**62]),  # start + length overflows int64 when added naively
    ([SIZE - 1], [2**63 - 1]),  # likewise
    ([-(2**63)], [1]),
]


@pytest.mark.parametrize(("starts", "lengths"), BAD_RANGES)
def test_every_range_outside_the_buffer_is_refused(starts, lengths):
    buf = DATA[:SIZE]
    bad = len(starts) - 1
    with pytest.raises(ValueError, match=rf"range {bad} \(start {starts[-1]}, length"):
        _native.checksums(buf, np.array(starts, np.int64), np.array(lengths, np.int64), "crc32")


def test_a_scalar_length_is_checked_too():
    starts = np.array([0, SIZE - 10], np.int64)
    with pytest.raises(ValueError, match=r"range 1 \(start 990, length 11\)"):
        _native.checksums(DATA[:SIZE], starts, 11, "crc32c")
    with pytest.raises(ValueError, match="negative"):
        _native.checksums(DATA[:SIZE], starts, -1, "crc32c")
    with pytest.raises(ValueError, match="negative"):
        _native.checksums(DATA[:SIZE], starts, np.int64(-3), "crc32c")
    with pytest.raises(ValueError, match="int64"):
        _native.checksums(DATA[:SIZE], starts, 2**64, "crc32c")


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((np.array([0], np.int32), 1), TypeError, "starts must be an int64 array"),
        ((np.array([0], np.uint64), 1), TypeError, "starts must be an int64 array"),
        ((np.array([0.0]), 1), TypeError, "starts must be an int64 array"),
        (([0, 1], 1), TypeError, "starts must be an int64 array, not list"),
        ((np.int64(0), 1), ValueError, "starts must be 1-D"),
        ((np.zeros((2, 2), np.int64), 1), ValueError, "starts must be 1-D"),
        ((np.zeros(4, np.int64)[::2], 1), ValueError, "starts must be C-contiguous"),
        ((np.zeros(2, np.int64), np.zeros(2, np.int32)), TypeError, "lengths must be an int64"),
        ((np.zeros(2, np.int64), np.zeros(3, np.int64)), ValueError, "2 starts but 3 lengths"),
        ((np.zeros(2, np.int64), np.zeros(1, np.int64)), ValueError, "2 starts but 1 lengths"),
        ((np.zeros(2, np.int64), 1.5), TypeError, "lengths must be an int64"),
        ((np.zeros(2, np.int64), "1"), TypeError, "lengths must be an int64"),
        ((np.zeros(2, np.int64).astype(">i8"), 1), TypeError, "starts must be an int64"),
    ],
)
def test_wrong_kinds_of_arguments(args, error, message):
    with pytest.raises(error, match=message):
        _native.checksums(DATA, *args, "crc32c")


def test_wrong_buffers_and_functions():
    starts = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="buffer must be C-contiguous"):
        _native.checksums(DATA[::2], starts, 1, "crc32c")
    with pytest.raises(TypeError, match="buffer must be a bytes-like object, not str"):
        _native.checksums("text", starts, 1, "crc32c")
    with pytest.raises(ValueError, match="function must be 'crc32c' or 'crc32'"):
        _native.checksums(DATA, starts, 1, "md5")
    with pytest.raises(TypeError):
        _native.checksums(DATA, starts, 1)  # the function is never guessed


def test_threads_at_once():
    """Big batches release the GIL: threads computing at once each get exact answers."""
    starts = rng.integers(0, len(DATA) - 65536, 64)
    errors: list = []
    wants = {name: expected(name, DATA, starts, 65536) for name in REFERENCE}

    def work(name: str) -> None:
        try:
            for _ in range(5):
                assert _native.checksums(DATA, starts, 65536, name).tolist() == wants[name]
        except BaseException as exc:  # noqa: BLE001 (re-raised in the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in [*REFERENCE] * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_buffer_cannot_be_resized_while_in_use():
    """The buffer is held for the whole call: a bytearray it reads cannot shrink under it
    (Python refuses the resize while it is exported)."""
    data = bytearray(DATA[: 1 << 20].tobytes())
    starts = np.zeros(200, np.int64)
    stop = threading.Event()
    refused = []

    def shrink() -> None:
        while not stop.is_set():
            try:
                del data[1000:]
                return
            except BufferError:
                refused.append(1)

    thread = threading.Thread(target=shrink)
    thread.start()
    try:
        for _ in range(20):
            try:
                got = _native.checksums(data, starts, len(DATA) // 2, "crc32c")
            except ValueError:  # shrunk between calls: refused, never read past the end
                break
            assert got[0] == crc32c_package.crc32c(DATA[: len(DATA) // 2])
    finally:
        stop.set()
        thread.join()


def _child(conn) -> None:
    starts = np.arange(0, 100_000, 1000, dtype=np.int64)
    conn.send(_native.checksums(DATA, starts, 70_000, "crc32c").tolist())
    conn.close()


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_after_fork():
    starts = np.arange(0, 100_000, 1000, dtype=np.int64)
    before = _native.checksums(DATA, starts, 70_000, "crc32c").tolist()
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_child, args=(child,))
    process.start()
    got = parent.recv()
    process.join(30)
    assert process.exitcode == 0
    assert got == before == expected("crc32c", DATA, starts, 70_000)


def test_no_export_survives_the_call():
    """The buffer is released when the call returns (a kept export would make the
    bytearray unresizable), and the inputs are not changed."""
    buf = bytearray(DATA[:1000].tobytes())
    starts = np.array([0, 10], np.int64)
    got = _native.checksums(buf, starts, 10, "crc32")
    buf.append(0)  # BufferError if still exported
    assert starts.tolist() == [0, 10]
    assert got.tolist() == expected("crc32", DATA[:1000], starts, 10)


SINGLE = [(_native.crc32c, crc32c_package.crc32c), (_native.crc32, zlib.crc32)]


@pytest.mark.parametrize(("ours", "reference"), SINGLE, ids=["crc32c", "crc32"])
def test_one_buffer_as_the_references_compute_it(ours, reference):
    """The file's checksum function (container.crc32c / crc32): any bytes-like object,
    continuing a running value as zlib.crc32 and crc32c.crc32c do (masked to 32 bits)."""
    raw = DATA[:5000].tobytes()
    for buf in (raw, bytearray(raw), memoryview(raw)[3:], DATA[:5000], b""):
        assert ours(buf) == reference(buf)
        assert ours(buf, 0x12345678) == reference(buf, 0x12345678)
    assert ours(raw[:100], ours(raw[100:])) != ours(raw)  # (order matters)
    assert ours(raw[100:], ours(raw[:100])) == ours(raw)
    assert ours(raw, 2**32 + 5) == reference(raw, 5)
    with pytest.raises(TypeError):
        ours()
    with pytest.raises(TypeError):
        ours(raw, 0, 0)
    with pytest.raises(TypeError, match="value must be an int"):
        ours(raw, 1.0)
    with pytest.raises(TypeError, match="data must be a bytes-like object, not str"):
        ours("text")
    with pytest.raises(ValueError, match="data must be C-contiguous"):
        ours(DATA[:100:2])
    assert crc32c is _native.crc32c and crc32 is _native.crc32


def test_every_stream_length_of_long_buffers():
    """CRC-32C runs blocks of eight 1 KiB streams while they fit, then eight streams of
    2^k + 64 bytes (k = 7..9) while they fit, then one: lengths around each switch, and
    buffers of many blocks, with odd tails."""
    big = np.random.default_rng(5).integers(0, 256, (17 << 20) + 77, dtype=np.uint8)
    lengths = {len(big), len(big) - 1, 8 * 1024 * 37 + 9}
    for block in [8 * ((1 << k) + 64) for k in range(7, 10)] + [8 * 1024, 2 * 8 * 1024]:
        for tail in (0, 8 * 576, 8 * 576 + 5, 8 * 192 - 1):
            lengths |= {block + tail - 1, block + tail, block + tail + 1, block + tail + 8 * 64}
    starts = np.array([0, 3], np.int64)
    for length in sorted(lengths):
        got = _native.checksums(big, starts, length - 3, "crc32c").tolist()
        assert got == expected("crc32c", big, starts, length - 3), length
        assert _native.crc32c(big[:length]) == crc32c_package.crc32c(big[:length]), length
    for name in ("crc32", "crc32c"):
        soft = _native.checksums(big, starts, len(big) - 3, name, hardware=False).tolist()
        assert soft == expected(name, big, starts, len(big) - 3)
