#!/usr/bin/env python3
"""Coverage-guided fuzzer (atheris / libFuzzer) for every parser of untrusted bytes.

Targets (``python tools/fuzz.py TARGET ...``):

``container``  ``evs.open`` + metadata + full iteration + ``get_many`` + ``get_batch`` +
               ``verify`` + ``refresh``, plain and compressed. The first input byte picks a mode:
               bits 0-1: 0 = the bytes are the file as is; 1 = fix every checksum first
               (so mutations get past the CRCs into the footer, index and record parsers);
               2 = fix checksums, then store the result as seekable zstd frames cut at
               input-chosen sizes (the logical parsers through the frame layer);
               3 = the rest as is, but cut into zstd frames (raw frame-layer inputs).
               bit 2: backend "pread" instead of "mmap"; bit 3: ``verify=False`` reads.
``java``       ``evs.java.loads`` / ``loads_record`` (both string modes) and
               ``iter_record_slices``.
``recover``    ``evs.recover`` (then a full read and an append) on the same inputs as
               ``container``: the salvage of tails, plain and compressed.
``seekable``   ``seekable.read_seek_table``, ``decompress_frame`` of every frame (into
               new and caller buffers), ``find_last_seek_table``, ``frame_extent``,
               ``zstd_legacy.read_dictionary``.

The contract checked: the only exception that may leave is ``evs.FormatError`` (the
fuzzer passes no out-of-range index, so not even IndexError); libFuzzer's ``-timeout``
and ``-rss_limit_mb`` catch hangs and unbounded allocations. Anything else is a crash:
libFuzzer writes the input to ``crash-*`` and stops.

Usage::

    python tools/fuzz.py seed                         # (re)write tests/fuzz_corpus/*/seed-*
    python tools/fuzz.py container -max_total_time=600 -timeout=10 -rss_limit_mb=3072 \\
        /tmp/fuzz-container tests/fuzz_corpus/container
    python tools/fuzz.py replay [TARGET]              # every corpus file, no atheris needed
    python tools/fuzz.py campaign 15 /tmp/evs-fuzz    # all targets for 15 minutes, with stats

New coverage goes to the first corpus directory (keep it outside the repo); merge the
interesting inputs back with ``python tools/fuzz.py container -merge=1
tests/fuzz_corpus/container /tmp/fuzz-container``. A crasher is fixed in the library and
its input kept under ``tests/fuzz_corpus/<target>/`` so ``tests/test_hostile.py`` replays it.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fuzz_corpus"
TARGETS = ("container", "java", "seekable", "recover")

# libFuzzer re-runs this script for -merge / -fork without the target argument: the target
# travels in the environment.
_FUZZING = os.environ.get("EVS_FUZZ_TARGET") if __name__ == "__main__" else None
if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in TARGETS:
    _FUZZING = os.environ["EVS_FUZZ_TARGET"] = sys.argv[1]
    del sys.argv[1]

_instrument = None
if _FUZZING:
    import atheris  # only the fuzzing run needs it; replay and seeding do not

    _instrument = atheris.instrument_imports

if _instrument is not None:
    with _instrument(include=["evalue_store"]):
        import evalue_store as evs
        from evalue_store import java
        from evalue_store.physical import seekable, zframe, zstd_legacy
else:
    import evalue_store as evs
    from evalue_store import java
    from evalue_store.physical import seekable, zframe, zstd_legacy

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

from evalue_store.container import (  # noqa: E402
    ENTRY,
    FOOTER_FIXED,
    FRAME,
    FRAME_MAGIC,
    MAGIC,
    SEGMENT,
    TRAILER,
    TRAILER_MAGIC,
    checksum_function,
    crc32,
)

# ---------------------------------------------------------------------------------- helpers


def _u(data, fmt: str, at: int):
    size = struct.calcsize(fmt)
    if at < 0 or at + size > len(data):
        return None
    return struct.unpack_from(fmt, data, at)


def fix_checksums(data: bytearray) -> bytearray:
    """Make every checksum in a (mutated) plain container match, wherever the structure
    can be followed: records named by index entries, index segments, metadata, footers
    (also given the header's file_id), and the header, each by the function the header's
    flags name. Returns ``data`` (changed in place)."""
    n = len(data)
    header = _u(data, "<8sHHIII16sQH", 0)
    file_id = None
    checksum = crc32
    if header is not None and header[0] == MAGIC:
        checksum = checksum_function(header[3])
        wlen = min(header[8], max(0, n - 54))
        struct.pack_into("<I", data, 20, 54 + wlen)
        struct.pack_into("<H", data, 48, wlen)
        if 50 + wlen + 4 <= n:
            struct.pack_into("<I", data, 50 + wlen, checksum(data[: 50 + wlen]))
        file_id = bytes(data[24:40])
    pos = data.find(TRAILER_MAGIC)
    while pos >= 0:
        end = pos + len(TRAILER_MAGIC)
        trailer = _u(data, "<QII8s", end - TRAILER.size)
        if trailer is not None:
            offset, length = trailer[0], trailer[1]
            if offset + FOOTER_FIXED.size <= end - TRAILER.size and offset + length == end:
                _fix_footer(data, offset, end, file_id, checksum)
        pos = data.find(TRAILER_MAGIC, pos + 1)
    return data


def _fix_footer(data: bytearray, offset: int, end: int, file_id: bytes | None, checksum) -> None:
    n = len(data)
    fixed = _u(data, "<8s16sQQQQQII", offset)
    if fixed is None:
        return
    if file_id is not None:
        data[offset + 8 : offset + 24] = file_id
    meta_off, meta_len, n_seg = fixed[5], fixed[6], fixed[8]
    if meta_len and meta_off + meta_len <= n:
        struct.pack_into("<I", data, offset + 64, checksum(data[meta_off : meta_off + meta_len]))
    for k in range(min(n_seg, (end - offset) // SEGMENT.size)):
        at = offset + FOOTER_FIXED.size + k * SEGMENT.size
        seg = _u(data, "<QQII", at)
        if seg is None or at + SEGMENT.size > end - TRAILER.size:
            break
        seg_off, count = seg[0], seg[1]
        if seg_off >= n or count > (n - seg_off) // ENTRY.size:
            continue
        for j in range(count):
            e_at = seg_off + j * ENTRY.size
            r_off, r_len, _, reserved = ENTRY.unpack_from(data, e_at)
            frame = _u(data, "<4sIQ", r_off)
            if frame is None or r_len > n - r_off - FRAME.size:
                continue
            crc = checksum(data[r_off + FRAME.size : r_off + FRAME.size + r_len])
            FRAME.pack_into(data, r_off, FRAME_MAGIC, crc, r_len)
            ENTRY.pack_into(data, e_at, r_off, r_len, crc, reserved)
        struct.pack_into(
            "<I", data, at + 16, checksum(data[seg_off : seg_off + count * ENTRY.size])
        )
    length = end - offset
    struct.pack_into("<I", data, end - 12, checksum(data[offset : offset + length - 12]))


_CCTX = zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=True)


def as_seekable(data: bytes, cut: int) -> bytes:
    """``data`` as seekable zstd frames of about ``cut`` bytes, ended by a seek table."""
    cut = max(1, cut)
    csizes, dsizes, sums, parts = [], [], [], []
    for at in range(0, max(len(data), 1), cut):
        frame = _CCTX.compress(data[at : at + cut])
        parts.append(frame)
        csizes.append(len(frame))
        dsizes.append(len(data[at : at + cut]))
        sums.append(struct.unpack_from("<I", frame, len(frame) - 4)[0])
    parts.append(seekable.encode_seek_table(csizes, dsizes, sums))
    return b"".join(parts)


def without_checksums(data: bytes) -> bytes:
    """The same seekable file with its last seek table rewritten without Checksum_Flag
    (8-byte entries): valid by the seekable format, never written by us."""
    table = seekable.read_seek_table(data)
    n = table.num_frames
    entries = np.empty((n, 2), "<u4")
    entries[:, 0] = table.compressed_sizes
    entries[:, 1] = table.decompressed_sizes
    head = struct.pack("<II", seekable.SEEK_TABLE_SKIPPABLE_MAGIC, n * 8 + 9)
    foot = struct.pack("<IBI", n, 0, seekable.SEEKABLE_MAGIC)
    return data[: table.table_offset] + head + entries.tobytes() + foot


_TMP = None


def _scratch() -> str:
    global _TMP
    if _TMP is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, _TMP = tempfile.mkstemp(prefix="evs-fuzz-", suffix=".evs", dir=base)
        os.close(fd)
    return _TMP


# ---------------------------------------------------------------------------------- targets


def container_input(data: bytes) -> tuple[bytes, str, bool]:
    """(file bytes, backend, verify) that a container-target input stands for."""
    if not data:
        return b"", "mmap", True
    mode, body = data[0], bytearray(data[1:])
    kind = mode & 3
    cut = 64 << (mode >> 4 & 7)
    if kind in (1, 2):
        fix_checksums(body)
    if kind in (2, 3):
        body = bytearray(as_seekable(bytes(body), cut))
    return bytes(body), ("pread" if mode & 4 else "mmap"), not mode & 8


def run_container(data: bytes) -> None:
    body, backend, verify = container_input(data)
    path = _scratch()
    with open(path, "wb") as f:
        f.write(body)
    try:
        ds = evs.open(path, backend=backend, verify=verify)
    except evs.FormatError:
        return
    try:
        try:
            _ = ds.metadata
        except evs.FormatError:
            pass
        n = len(ds)
        try:
            entries = ds.entries()
            assert len(entries) == n
        except evs.FormatError:
            pass
        for i in range(min(n, 10_000)):
            try:
                _touch(ds[i])
            except evs.FormatError:
                pass
        if n:
            try:
                ds.get_many([n - 1, 0, n // 2])
            except evs.FormatError:
                pass
            for batch in ([n - 1, 0, n // 2], range(min(n, 64))):
                try:
                    ds.get_batch(batch)
                except ValueError as exc:  # a FormatError, or records that do not batch
                    assert isinstance(exc, evs.FormatError) or "one value count" in str(exc)
        report = ds.verify()  # never raises for bad data
        assert isinstance(report.ok, bool)
        try:
            ds.refresh()
        except evs.FormatError:
            pass
    finally:
        ds.close()


def _touch(record: list) -> None:
    """Read every byte a record's values expose (so a bad view would fault here)."""
    for value in record:
        if isinstance(value, np.ndarray):
            value.tobytes()
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, np.ndarray):
                    item.tobytes()


def run_java(data: bytes) -> None:
    for strings in ("str", "bytes"):
        try:
            value = java.loads(data, strings=strings)
            if isinstance(value, np.ndarray):
                value.tobytes()
        except evs.FormatError:
            pass
        try:
            java.loads_record(data, strings=strings)
        except evs.FormatError:
            pass
    try:
        for piece in java.iter_record_slices(data):
            bytes(piece)
    except evs.FormatError:
        pass


def run_seekable(data: bytes) -> None:
    dctx = zframe.new_decompressor()
    try:
        zstd_legacy.read_dictionary(data, len(data))
    except evs.FormatError:
        pass
    try:
        zframe.frame_extent(data)
    except evs.FormatError:
        pass
    tables = []
    try:
        tables.append(seekable.read_seek_table(data))
    except evs.FormatError:
        pass
    try:
        found = seekable.find_last_seek_table(data)
        if found is not None:
            tables.append(found[0])
    except evs.FormatError:
        pass
    for table in tables:
        for k in range(min(table.num_frames, 256)):
            try:
                seekable.decompress_frame(data, table, k, dctx=dctx)
            except evs.FormatError:
                pass
            size = int(table.decompressed_sizes[k])
            if size <= 1 << 20:
                try:
                    seekable.decompress_frame(data, table, k, bytearray(size), dctx=dctx)
                except evs.FormatError:
                    pass


def run_recover(data: bytes) -> None:
    """``evs.recover`` on the file (same modes as ``container``), then a full read, then an
    append in mode "a". fsync is skipped in the fuzzing process: only speed changes."""
    body, backend, verify = container_input(data)
    path = _scratch()
    for side in Path(path).parent.glob(Path(path).name + ".tail-*"):
        side.unlink()
    with open(path, "wb") as f:
        f.write(body)
    fsync, os.fsync = os.fsync, lambda fd: None
    try:
        try:
            salvage = evs.recover(path)
        except evs.FormatError:
            return
        if salvage.side_file:
            os.remove(salvage.side_file)
        ds = evs.open(path, backend=backend, verify=verify)
        try:
            assert ds.uncommitted_bytes == 0
            for i in range(min(len(ds), 10_000)):
                try:
                    _touch(ds[i])
                except evs.FormatError:
                    pass
            ds.verify()
            n = len(ds)
        finally:
            ds.close()
        with evs.Writer(path, mode="a") as w:
            w.append([n, "appended"])
        with evs.open(path) as ds:
            assert len(ds) == n + 1 and ds[n] == [n, "appended"]
    finally:
        os.fsync = fsync


RUNNERS = {
    "container": run_container,
    "java": run_java,
    "seekable": run_seekable,
    "recover": run_recover,
}


# ---------------------------------------------------------------------------------- seeds


def seed_inputs(target: str) -> dict[str, bytes]:
    """Small real inputs for a target, by name."""
    from evalue_store.values import ListOptionalTensor, ListTensor

    rng = np.random.default_rng(0)
    rich = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.arange(24, dtype=np.int16).reshape(2, 3, 4).transpose(0, 2, 1),
        np.array([True, False]),
        "text é",
        b"\x00raw",
        7,
        -2.5,
        True,
        None,
        [True, False],
        [1, 2, 3],
        [0.5, 1.5],
        ListTensor([np.zeros(2, np.uint8), np.ones((1, 2), np.float64)]),
        ListOptionalTensor([None, np.ones(3, np.int64)]),
        np.zeros((0, 3), np.float16),
        np.arange(4, dtype=np.uint16).view(evs.BFLOAT16),
    ]
    if target == "java":
        values = [None, True, 5, 1.5, "héllo", np.arange(6, dtype=np.float32).reshape(2, 3)]
        values += [np.arange(4, dtype=np.uint8), np.zeros((0, 2), np.int64)]
        out = {f"value-{k}": java.dumps(v) for k, v in enumerate(values)}
        out["record"] = java.dumps_record(values)
        out["record-empty"] = java.dumps_record([])
        return out
    out = {}
    with tempfile.TemporaryDirectory() as tmp:

        def make(name: str, records: list, commits: int = 1, **kw) -> None:
            path = os.path.join(tmp, name)
            with evs.Writer(path, **kw) as w:
                for c in range(commits):
                    w.extend(records[c::commits])
                    w.commit()
            out[name] = Path(path).read_bytes()

        make("rich", [rich], metadata={"k": [1, "v"]})
        make("small-a8", [[i, f"s{i}", rng.random(3)] for i in range(6)], 3, alignment=8)
        make("empty", [])
        make("rich-z", [rich, rich[:3]], 2, compression="zstd", frame_size=4096)
        make(
            "small-z", [[i, np.arange(i)] for i in range(5)], 2, compression="zstd", frame_size=4096
        )
        samples = [[np.full(20, i % 3, np.int32), f"x{i % 4}"] for i in range(40)]
        dictionary = evs.train_dictionary(samples, size=1024)
        make("dict-z", samples[:4], compression="zstd", frame_size=4096, dictionary=dictionary)
    for name in [k for k in out if k.endswith("-z")]:
        out[name[:-2] + "-nochecksum-z"] = without_checksums(out[name])
    if target == "seekable":
        return {k: v for k, v in out.items() if k.endswith("-z")}
    if target == "recover":  # files with a crashed writer's tail: records, then garbage
        seeds = {}
        for name, blob in out.items():
            if name in ("rich", "small-a8", "rich-z", "small-z"):
                seeds[name + "-tail"] = b"\x00" + blob + blob[-300:] + bytes(64)
                seeds[name + "-cut"] = b"\x00" + blob[: len(blob) - 7]
        return seeds
    seeds = {}
    for name, blob in out.items():
        if name.endswith("-z"):
            seeds[name] = b"\x00" + blob
            seeds[name + "-verify-off"] = b"\x08" + blob
        else:
            seeds[name] = b"\x01" + blob  # fix checksums: mutations reach the parsers
            seeds[name + "-raw-pread"] = b"\x04" + blob
            seeds[name + "-frames"] = b"\x22" + blob  # fixed, then as frames of 256 bytes
    return seeds


def _plain_file(records: list) -> bytearray:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "f.evs")
        with evs.Writer(path, metadata={"m": 1}) as w:
            w.extend(records)
        return bytearray(Path(path).read_bytes())


def _frame_and_footer(data: bytearray) -> tuple[int, int, int]:
    """(first record frame offset, footer offset, index segment offset) of a one-commit file."""
    end = len(data)
    footer = struct.unpack_from("<Q", data, end - TRAILER.size)[0]
    segment = struct.unpack_from("<Q", data, footer + FOOTER_FIXED.size)[0]
    first = struct.unpack_from("<Q", data, segment)[0]
    return first, footer, segment


def _signed_lie(record: list, patch) -> bytes:
    """A plain file whose bytes ``patch(data, frame, footer, segment)`` changed, with every
    checksum then made to match: a hostile writer's consistent lie."""
    data = _plain_file([record])
    patch(data, *_frame_and_footer(data))
    return b"\x01" + bytes(data)  # mode 1: the target re-signs after any mutation too


def _seekable(frames_: list[tuple[bytes, int, int]]) -> bytes:
    """Frames given as (bytes, decompressed size listed, checksum listed), then a seek table."""
    table = seekable.encode_seek_table(
        [len(f) for f, _, _ in frames_], [d for _, d, _ in frames_], [c for _, _, c in frames_]
    )
    return b"".join(f for f, _, _ in frames_) + table


def hostile_inputs() -> dict[str, dict[str, bytes]]:
    """Inputs whose headers claim huge sizes (terabyte tensors, 2^61-item lists, 2^27 frames,
    GiB frames, 4 GiB dictionaries, 2^31-element Java tensors...): each must be refused
    with FormatError before anything of that size is allocated."""
    P = 16  # payload start within a record frame
    tensor = [np.arange(4, dtype=np.int64)]
    lies = {
        "tensor-terabyte-dim": (
            tensor,
            lambda d, f, *_: struct.pack_into("<Q", d, f + P + 8, 1 << 40),
        ),
        "tensor-dims-overflow": (
            [np.zeros((2, 2))],
            lambda d, f, *_: struct.pack_into("<QQ", d, f + P + 8, 1 << 62, 1 << 62),
        ),
        "tensor-zero-and-huge-dims": (
            [np.zeros((2, 2))],
            lambda d, f, *_: struct.pack_into("<QQ", d, f + P + 8, 0, (1 << 64) - 1),
        ),
        "list-2^61-items": (
            [[1, 2, 3]],
            lambda d, f, *_: struct.pack_into("<Q", d, f + P + 5, 1 << 61),
        ),
        "string-2^62-bytes": (
            ["abc"],
            lambda d, f, *_: struct.pack_into("<Q", d, f + P + 6, 1 << 62),
        ),
        "value-count-2^32": (tensor, lambda d, f, *_: struct.pack_into("<I", d, f + P, 0xFFFFFFFF)),
        "record-length-terabyte": (
            tensor,
            lambda d, f, fo, seg: (
                struct.pack_into("<Q", d, f + 8, 1 << 40),
                struct.pack_into("<Q", d, seg + 8, 1 << 40),
            ),
        ),
        "footer-record-count-2^60": (
            tensor,
            lambda d, f, fo, seg: struct.pack_into("<Q", d, fo + 32, 1 << 60),
        ),
        "segment-count-2^60": (
            tensor,
            lambda d, f, fo, seg: struct.pack_into("<Q", d, fo + FOOTER_FIXED.size + 8, 1 << 60),
        ),
        "metadata-terabyte": (
            tensor,
            lambda d, f, fo, seg: struct.pack_into("<Q", d, fo + 56, 1 << 40),
        ),
    }
    container = {name: _signed_lie(recs, patch) for name, (recs, patch) in lies.items()}

    compressed = {}
    small = _CCTX.compress(b"x" * 100)
    checksum = struct.unpack_from("<I", small, len(small) - 4)[0]
    compressed["seek-table-2^27-frames"] = small + struct.pack(
        "<IBI", seekable.MAX_FRAMES, 0x80, seekable.SEEKABLE_MAGIC
    )
    compressed["seek-table-2^32-frames"] = small + struct.pack(
        "<IBI", 0xFFFFFFFF, 0x80, seekable.SEEKABLE_MAGIC
    )
    compressed["frame-listed-as-1GiB"] = _seekable([(small, 1 << 30, checksum)])
    compressed["frame-listed-as-4GiB"] = _seekable([(small, 0xFFFFFFFF, checksum)])
    # A zstd frame header declaring 1 GiB of content over one 32 KiB raw block: the table
    # agrees, the expansion ratio allows it, only the block walk shows it cannot be.
    body = bytes(range(256)) * 128
    header = struct.pack("<IB", 0xFD2FB528, 0xE4) + struct.pack("<Q", 1 << 30)
    block = struct.pack("<I", (len(body) << 3) | 1)[:3] + body
    liar = header + block + b"\x00\x00\x00\x00"
    compressed["zstd-header-claims-1GiB"] = _seekable([(liar, 1 << 30, 0)])
    dict_head = struct.pack("<II", zstd_legacy.DICT_FRAME_MAGIC, 0xFFFFFFF0) + bytes(8)
    plain = bytes(_plain_file([[1]]))
    rest = _CCTX.compress(plain)
    compressed["dictionary-claims-4GiB"] = _seekable(
        [
            (dict_head, 0, seekable.EMPTY_CHECKSUM),
            (rest, len(plain), struct.unpack_from("<I", rest, len(rest) - 4)[0]),
        ]
    )
    for name, blob in compressed.items():
        container["z-" + name] = b"\x00" + blob

    java_inputs = {
        "tensor-4x(2^31-1)-dims": struct.pack(">BBB4i", 1, 6, 4, *[2**31 - 1] * 4) + bytes(16),
        "tensor-rank-127": struct.pack(">BBB", 1, 0, 127)
        + struct.pack(">127i", *[2**31 - 1] * 127),
        "string-(2^31-1)-bytes": struct.pack(">Bi", 2, 2**31 - 1) + b"abc",
        "record-(2^31-1)-values": b"EVJ1" + struct.pack(">i", 2**31 - 1) + bytes(40),
        "record-value-(2^31-1)-bytes": b"EVJ1" + struct.pack(">ii", 1, 2**31 - 1) + b"\x00",
    }
    return {
        "container": container,
        "seekable": compressed,
        "java": java_inputs,
        "recover": {
            k: v for k, v in container.items() if k.startswith(("z-", "footer", "segment"))
        },
    }


def write_seeds() -> None:
    for target in TARGETS:
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("seed-*"):
            old.unlink()
        for old in folder.glob("hostile-*"):
            old.unlink()
        for name, blob in seed_inputs(target).items():
            (folder / f"seed-{name}").write_bytes(blob)
        for name, blob in hostile_inputs()[target].items():
            (folder / f"hostile-{name}").write_bytes(blob)
        print(f"{target}: {len(list(folder.iterdir()))} corpus files")


# ---------------------------------------------------------------------------------- replay


class Hang(Exception):
    pass


def replay(target: str, paths: list[Path], seconds: int = 10) -> int:
    """Run every input through ``target``; an input taking over ``seconds`` is a hang."""

    def alarm(*_):
        raise Hang(f"input took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        for path in paths:
            signal.alarm(seconds)
            try:
                RUNNERS[target](path.read_bytes())
            except Exception as exc:
                raise AssertionError(f"{target} input {path}: {exc!r}") from exc
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return len(paths)


def corpus_files(target: str) -> list[Path]:
    return sorted(p for p in (CORPUS / target).iterdir() if p.is_file())


def campaign(minutes: float, workdir: Path) -> None:
    """Fuzz every target in turn (half the time on ``container``), restarting after a
    crash; prints executions and the crash inputs found. Fresh coverage stays in
    ``workdir``; merge it into tests/fuzz_corpus yourself (see the module docstring)."""
    import re
    import subprocess
    import time

    shares = {"container": 0.4, "recover": 0.2, "seekable": 0.25, "java": 0.15}
    workdir.mkdir(parents=True, exist_ok=True)
    total_runs, crashes = 0, []
    for target, share in shares.items():
        corpus = workdir / f"corpus-{target}"
        corpus.mkdir(exist_ok=True)
        deadline = time.monotonic() + minutes * 60 * share
        runs = 0
        while (left := int(deadline - time.monotonic())) > 5:
            before = set(workdir.glob(f"art-{target}-*"))
            cmd = [sys.executable, __file__, target, f"-max_total_time={left}", "-timeout=10"]
            cmd += ["-rss_limit_mb=3072", "-max_len=16384", "-print_final_stats=1"]
            cmd += [f"-artifact_prefix={workdir}/art-{target}-", str(corpus), str(CORPUS / target)]
            if target == "recover":  # same input format: the container corpus seeds it too
                cmd.append(str(CORPUS / "container"))
            log = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir).stderr
            (workdir / f"log-{target}.txt").open("a").write(log)
            done = re.findall(r"stat::number_of_executed_units: (\d+)", log)
            runs += int(done[-1]) if done else 0
            new = sorted(set(workdir.glob(f"art-{target}-*")) - before)
            crashes += new
            if len(new) == 0 and not done:
                break  # neither stats nor a crash file: something is wrong with the setup
        total_runs += runs
        print(f"{target}: {runs} executions")
    print(f"total: {total_runs} executions, {len(crashes)} crash/timeout/oom inputs")
    for path in crashes:
        print(f"  {path}")


def main() -> None:
    if _FUZZING:
        runner = RUNNERS[_FUZZING]

        def test_one(data: bytes) -> None:
            runner(data)

        atheris.Setup(sys.argv, test_one)
        atheris.Fuzz()
        return
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    what = sys.argv[1]
    if what == "seed":
        write_seeds()
    elif what == "campaign":
        minutes = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
        work = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(tempfile.gettempdir()) / "evs-fuzz"
        campaign(minutes, work)
    elif what == "replay":
        for target in sys.argv[2:] or TARGETS:
            print(f"{target}: {replay(target, corpus_files(target))} inputs ok")
    else:
        sys.exit(f"unknown command {what!r}; targets: {', '.join(TARGETS)}, seed, replay")


if __name__ == "__main__":
    main()
