"""Resource bounds (issue 11): every entry point that reads a file ends, on any crafted file,
in a result or a FormatError, in time and memory bounded by the file's size.

Crafted hostile files x entry points (open, read, verify, recover, mode "a", shards, CLI) run
in a child process whose address space is capped a few hundred MiB above its baseline, under
a timeout. Counters (bytes read, bytes hashed) prove linear cost where a timing would be flaky.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import container
from evalue_store.container import (
    FOOTER_FIXED,
    MAX_SEGMENTS,
    SEGMENT,
    TRAILER,
    TRAILER_MAGIC,
    Commit,
    Segment,
    align_up,
    crc32c,
    encode_footer,
)
from evalue_store.physical import plain, seekable

MiB = 1 << 20
MAX_FOOTER = FOOTER_FIXED.size + MAX_SEGMENTS * SEGMENT.size + TRAILER.size
ZERO_FRAME = 64 * MiB  # the largest frame a writer makes and a reader accepts by default


# ------------------------------------------------------------------------------ crafting


def _plain(path: Path, **kw) -> bytes:
    """A file holding one record, [arange(4)]; its bytes."""
    with evs.Writer(path, **kw) as w:
        w.append([np.arange(4)])
    return path.read_bytes()


def magic_tail(path: Path, tail: int) -> Path:
    """A valid file, then ``tail`` bytes of the end magic repeated."""
    data = _plain(path)
    path.write_bytes(data + TRAILER_MAGIC * (tail // 8))
    return path


def fake_footer_tail(path: Path, tail: int) -> Path:
    """A valid file, then a tail of fake footers claiming the largest length: every field
    that costs no hashing is right (trailer, magic, file_id, segment count), only the
    checksum is not. Fixed parts sit 128 bytes apart, each trailer right after the fixed
    part of a later candidate, so there is one candidate per 128 bytes of tail."""
    data = bytearray(_plain(path))
    file_id = bytes(data[24:40])
    data += bytes(-len(data) % 64)
    base = len(data)
    data += bytes(tail)
    n = (MAX_FOOTER - FOOTER_FIXED.size - TRAILER.size) // 24
    fixed = FOOTER_FIXED.pack(b"EVSFOOT1", file_id, 2, 0, 0, 0, 0, 0, n)
    for offset in range(base, len(data) - MAX_FOOTER, 128):
        data[offset : offset + FOOTER_FIXED.size] = fixed
        end = offset + MAX_FOOTER
        data[end - TRAILER.size : end] = TRAILER.pack(offset, MAX_FOOTER, 0, TRAILER_MAGIC)
    path.write_bytes(bytes(data))
    return path


def _frame_checksum(frame: bytes) -> int:
    return struct.unpack_from("<I", frame, len(frame) - 4)[0]


def zero_frame(size: int = ZERO_FRAME) -> bytes:
    """A valid zstd frame of ``size`` zero bytes (compressed streaming: no big buffer)."""
    cache = zero_frame.__dict__.setdefault("cache", {})
    if size not in cache:
        chunker = seekable.new_compressor(3).chunker(size=size, chunk_size=1 << 16)
        parts = []
        for at in range(0, size, MiB):
            parts += chunker.compress(bytes(min(MiB, size - at)))
        cache[size] = b"".join([*parts, *chunker.finish()])
    return cache[size]


def _seekable_file(chunks: list, zeros_frames: int = 0, zeros: int = ZERO_FRAME) -> bytes:
    """Frames for logical ``chunks``; None stands for ``zeros_frames`` frames of ``zeros``
    zero bytes."""
    cctx = seekable.new_compressor(3)
    frames, dsizes = [], []
    for chunk in chunks:
        if chunk is None:
            frames += [zero_frame(zeros)] * zeros_frames
            dsizes += [zeros] * zeros_frames
        else:
            frames.append(cctx.compress(chunk))
            dsizes.append(len(chunk))
    table = seekable.encode_seek_table(
        [len(f) for f in frames], dsizes, [_frame_checksum(f) for f in frames]
    )
    return b"".join(frames) + table


def _one_record_parts(path: Path) -> tuple[bytes, int, int, int, int]:
    """A one-record plain file's (bytes, footer offset, segment offset, commit number,
    previous footer)."""
    data = _plain(path)
    footer = struct.unpack_from("<Q", data, len(data) - TRAILER.size)[0]
    segment = struct.unpack_from("<Q", data, footer + FOOTER_FIXED.size)[0]
    number, _, prev = struct.unpack_from("<QQQ", data, footer + 24)
    return data, footer, segment, number, prev


def _zeros_crc(n: int) -> int:
    crc, block = 0, bytes(MiB)
    for at in range(0, n, MiB):
        crc = crc32c(block[: min(MiB, n - at)], crc)
    return crc


def zstd_zero_index(path: Path, zeros: int = 4 * MiB, frames: int = 1) -> Path:
    """A compressed file (a few KB) whose index segment is ``frames`` frames of ``zeros``
    zero bytes (174,762 records for the default) that all point at offset 0."""
    data, _, segment, number, prev = _one_record_parts(path.with_suffix(".plain"))
    n = frames * zeros // 24
    footer_at = align_up(segment + frames * zeros, 64)
    segments = (Segment(segment, n, _zeros_crc(n * 24), 0),)
    commit = Commit(number, n, footer_at, 0, prev, 0, 0, 0, segments)
    gap = bytes(footer_at - segment - frames * zeros)
    suffix = gap + encode_footer(footer_at, data[24:40], commit, crc32c)
    path.write_bytes(_seekable_file([data[:segment], None, suffix], frames, zeros))
    return path


def zstd_padding_run(path: Path, frames: int = 16) -> Path:
    """A valid compressed file (33 KB) whose one record is followed by ``frames`` x 64 MiB
    of zero padding before its index segment: every frame is under every cap."""
    data, _, segment, number, prev = _one_record_parts(path.with_suffix(".plain"))
    entry = data[segment : segment + 24]
    seg_at = segment + frames * ZERO_FRAME
    footer_at = align_up(seg_at + 24, 64)
    segments = (Segment(seg_at, 1, crc32c(entry), 0),)
    commit = Commit(number, 1, footer_at, 0, prev, 0, 0, 0, segments)
    suffix = (
        entry
        + bytes(footer_at - seg_at - 24)
        + encode_footer(footer_at, data[24:40], commit, crc32c)
    )
    path.write_bytes(_seekable_file([data[:segment], None, suffix], frames))
    return path


def with_metadata(path: Path, meta: bytes) -> Path:
    """A one-record plain file whose metadata block is ``meta`` (checksums valid)."""
    data, footer, segment, number, prev = _one_record_parts(path)
    data = bytearray(data[:footer])
    meta_at = align_up(len(data), 64)
    data += bytes(meta_at - len(data)) + meta
    footer_at = align_up(len(data), 64)
    data += bytes(footer_at - len(data))
    seg = Segment(segment, 1, crc32c(data[segment : segment + 24]), 0)
    commit = Commit(number, 1, footer_at, 0, prev, meta_at, len(meta), crc32c(meta), (seg,))
    path.write_bytes(bytes(data) + encode_footer(footer_at, data[24:40], commit, crc32c))
    return path


def zstd_tail_frame_claiming(path: Path, claim: int = 1 << 40, blocks: int = 100) -> Path:
    """A valid compressed file, then a complete-looking zstd frame (100 RLE blocks: 417
    bytes) whose header claims ``claim`` bytes."""
    _plain(path, compression="zstd")
    header = struct.pack("<IB", 0xFD2FB528, 0xE4) + struct.pack("<Q", claim)
    rle = struct.pack("<I", (131072 << 3) | 2)[:3] + b"\x00"
    last = struct.pack("<I", (131072 << 3) | 3)[:3] + b"\x00"
    with open(path, "ab") as f:
        f.write(header + rle * (blocks - 1) + last + bytes(4))
    return path


def zstd_tail_of_zero_frames(path: Path, frames: int = 24) -> Path:
    """A valid compressed file, then ``frames`` valid 64 MiB frames of zeros (1.5 GiB
    logical in 50 KB): a crash tail whose every frame is under the frame cap."""
    _plain(path, compression="zstd")
    with open(path, "ab") as f:
        f.write(zero_frame() * frames)
    return path


# ------------------------------------------------------------------------------ item 14


def _search_cost(monkeypatch, path: Path) -> tuple[int, int, str]:
    """(bytes read, bytes checksummed, outcome) of opening ``path``."""
    counts = {"read": 0, "crc": 0}
    original_read, original_crc = plain.PreadSource.read, container.crc32c

    def counted_read(self, offset, n):
        counts["read"] += n
        return original_read(self, offset, n)

    def counted_crc(data, start=0):
        counts["crc"] += len(memoryview(data).cast("B"))
        return original_crc(data, start)

    monkeypatch.setattr(plain.PreadSource, "read", counted_read)
    monkeypatch.setattr(container, "crc32c", counted_crc)
    try:
        with evs.open(path, backend="pread") as ds:
            outcome = f"{len(ds)} records"
    except evs.FormatError as exc:
        outcome = exc.reason
    monkeypatch.undo()
    return counts["read"], counts["crc"], outcome


@pytest.mark.parametrize("craft", [magic_tail, fake_footer_tail])
def test_the_search_for_the_last_commit_is_linear_in_the_tail(tmp_path, monkeypatch, craft):
    """Bytes read and bytes checksummed by open grow linearly with a hostile tail (1 and
    4 MiB), with a small constant. (Before: the tail was re-read from each magic found, and
    each fake footer was checksummed whole: 9.8 s for 1 MiB of repeated magic.)"""
    costs = {}
    for tail in (MiB, 4 * MiB):
        path = craft(tmp_path / f"t{tail}.evs", tail)
        costs[tail] = _search_cost(monkeypatch, path)
        read, hashed, outcome = costs[tail]
        assert read <= 3 * tail + 4 * MAX_FOOTER, (tail, costs)
        assert hashed <= 2 * tail + 4 * MAX_FOOTER, (tail, costs)
        assert outcome == "1 records" or "no valid commit found" in outcome, outcome


def test_a_tail_of_fake_footers_opens_in_seconds(tmp_path):
    """16 MiB of fake footers (every cheap field right) opens or fails within 10 s for every
    reader of the tail: open (both backends) and recover (before: 13 GB checksummed)."""
    path = fake_footer_tail(tmp_path / "f.evs", 16 * MiB)
    code = textwrap.dedent(
        """
        import sys, evalue_store as evs
        path = sys.argv[1]
        for backend in ("mmap", "pread"):
            try:
                evs.open(path, backend=backend).close()
            except evs.FormatError:
                pass
        try:
            evs.recover(path)
        except evs.FormatError:
            pass
        """
    )
    _child(code, path, timeout=10)


# ------------------------------------------------------------------------------ child runs


def _child(code: str, *args, timeout: float = 60, headroom: int = 384 * MiB) -> str:
    """Run ``code`` in a child whose address space is capped ``headroom`` above its
    baseline (after imports); returns its stdout. Fails on a timeout or a non-zero exit."""
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS and /proc are Linux's")
    prelude = textwrap.dedent(
        f"""
        import resource, sys
        import numpy, zstandard, evalue_store, evalue_store.cli
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) * 1024
        limit = used + {headroom}
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            bytearray({headroom} + (256 << 20))
            sys.exit("the limit does not hold")
        except MemoryError:
            pass
        """
    )
    env = dict(os.environ, PYTHONPATH=str(Path(evs.__file__).parent.parent))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", prelude + textwrap.dedent(code), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"no result within {timeout} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# ------------------------------------------------------------------------------ items 13, 15


def test_recover_does_not_trust_a_tail_frame_s_claimed_size(tmp_path):
    """A 417-byte frame claiming 2^40 bytes after the last seek table: recover and mode 'a'
    keep the commit and move the frame to the side file (before: MemoryError)."""
    path = zstd_tail_frame_claiming(tmp_path / "f.evs.zst")
    copy = tmp_path / "g.evs.zst"
    shutil.copy(path, copy)
    out = _child(
        """
        import evalue_store as evs
        report = evs.recover(sys.argv[1])
        print(report.committed_records, report.salvaged_records, report.damaged_bytes)
        with evs.Writer(sys.argv[2], "a") as w:
            print(w.salvage.damaged_bytes)
        """,
        path,
        copy,
    )
    assert out.split() == ["1", "0", "417", "417"]
    with evs.open(path) as ds:
        assert ds[0][0].tolist() == [0, 1, 2, 3]


def test_recover_bounds_the_decompressed_tail(tmp_path):
    """24 valid 64 MiB frames of zeros after the last seek table (1.5 GiB in 50 KB): recovery
    salvages at most 64 MiB + 64x the compressed tail, the rest goes to the side file."""
    path = zstd_tail_of_zero_frames(tmp_path / "f.evs.zst", 24)
    out = _child(
        """
        import evalue_store as evs
        report = evs.recover(sys.argv[1])
        print(report.committed_records, report.salvaged_records, report.tail_bytes)
        """,
        path,
        timeout=120,
    )
    assert out.split() == ["1", "0", str(24 * len(zero_frame()))]
    with evs.open(path) as ds:
        assert len(ds) == 1 and ds.uncommitted_bytes == 0


def test_verify_of_a_padding_run_holds_a_frame_not_the_run(tmp_path):
    """A valid 33 KB compressed file with 1 GiB of zero padding (16 frames of 64 MiB, each
    under every cap): verify succeeds in bounded memory (before: MemoryError)."""
    path = zstd_padding_run(tmp_path / "f.evs.zst")
    assert path.stat().st_size < 40_000
    out = _child(
        """
        import evalue_store as evs
        with evs.open(sys.argv[1], max_record_bytes=1 << 20) as ds:
            report = ds.verify()
            print(report.ok, len(ds), report.problems)
        """,
        path,
        timeout=120,
    )
    assert out.startswith("True 1 []"), out


# ------------------------------------------------------------------------------ item 16


def _manifest(tmp_path: Path, shards=None, records=None, raw: str | None = None) -> Path:
    """A manifest next to one real shard; ``shards`` replaces its shard list."""
    shard = tmp_path / "s-0.evs"
    if not shard.exists():
        _plain(shard)
    with evs.open(shard) as ds:
        good = {"path": "s-0.evs", "records": 1, "bytes": ds.commit.end}
        good["footer_sha256"] = evs.shards.footer_checksum(ds)
    shards = [good] if shards is None else [dict(good, **s) for s in shards]
    total = sum(s["records"] for s in shards) if records is None else records
    doc = {"format": "evalue_store.shards", "version": 1, "records": total, "shards": shards}
    path = tmp_path / "m.manifest.json"
    path.write_text(raw if raw is not None else json.dumps(doc))
    return path


HOSTILE_MANIFESTS = {
    "deep nesting": (
        dict(raw='{"format": "evalue_store.shards", "version": 1, "x": ' + "[" * 100_000),
        "not JSON",
    ),
    "records 10**30": (dict(shards=[{"records": 10**30}]), r"shards\[0\].records"),
    "two counts of 2^63-1": (
        dict(shards=[{"records": 2**63 - 1}, {"records": 2**63 - 1}]),
        "records is not an integer in",
    ),
    "two counts of 2^63-1, total wrapped": (
        dict(shards=[{"records": 2**63 - 1}, {"records": 2**63 - 1}], records=2**63 - 2),
        "record total",
    ),
    "bytes -1": (dict(shards=[{"bytes": -1}]), r"shards\[0\].bytes"),
    "records true": (dict(shards=[{"records": True}]), r"shards\[0\].records"),
    "total 1.0": (dict(records=1.0), "records is not an integer"),
    "NUL in a path": (dict(shards=[{"path": "s-0.evs\x00x"}]), r"shards\[0\].path"),
    "path a number": (dict(shards=[{"path": 7}]), r"shards\[0\].path"),
    "missing shard": (dict(shards=[{"path": "gone.evs"}]), r"shards\[0\].path .*gone.evs"),
    "shard a directory": (dict(shards=[{"path": "."}]), "not a regular file"),
    "bad digest": (dict(shards=[{"footer_sha256": "zz"}]), "footer_sha256"),
    "shards not a list": (
        dict(raw='{"format": "evalue_store.shards", "version": 1, "records": 0, "shards": 5}'),
        "'shards' is not a list",
    ),
    "shard not an object": (
        dict(raw='{"format": "evalue_store.shards", "version": 1, "records": 0, "shards": [1]}'),
        r"shards\[0\] is not an object",
    ),
}


@pytest.mark.parametrize("name", HOSTILE_MANIFESTS)
def test_hostile_manifests_are_format_errors_at_open(tmp_path, name):
    """Each is a FormatError from open_shards (and merge_manifests' reading), naming the
    manifest and the field (before: RecursionError, OverflowError, a len() that raised,
    a bare ValueError, or a missing shard accepted until its first read)."""
    kwargs, reason = HOSTILE_MANIFESTS[name]
    path = _manifest(tmp_path, **kwargs)
    with pytest.raises(evs.FormatError, match=reason) as info:
        evs.open_shards(path)
    assert info.value.path == str(path)


def test_counts_that_overflow_only_together_are_refused(tmp_path):
    """Two manifests each holding 2^63-1 records: their union does not fit the index."""
    first = _manifest(tmp_path, shards=[{"records": 2**63 - 1}])
    second = tmp_path / "n.manifest.json"
    doc = json.loads(first.read_text())
    (tmp_path / "t-0.evs").write_bytes((tmp_path / "s-0.evs").read_bytes())
    doc["shards"][0]["path"] = "t-0.evs"
    second.write_text(json.dumps(doc))
    with pytest.raises(evs.FormatError, match="2\\^63-1 records in all"):
        evs.open_shards([first, second])


# ------------------------------------------------------------------------------ item 17


@pytest.fixture
def fifo(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "pipe.evs"
    os.mkfifo(path)
    return path


def test_special_files_are_refused_without_blocking(tmp_path, fifo):
    """A FIFO (nobody writing), /dev/zero and a directory: open, open_shards (as a file, a
    shard of a manifest, a manifest), read_dictionary and the CLI refuse them at once
    (before: a FIFO hung forever)."""
    (tmp_path / "pipe.json").symlink_to(fifo)
    manifest = _manifest(tmp_path, shards=[{"path": "pipe.evs"}])
    out = _child(
        """
        import evalue_store as evs
        from evalue_store.cli import main
        fifo, json_fifo, manifest = sys.argv[1:4]
        for path in (fifo, "/dev/zero"):
            for fn in (evs.open, evs.open_shards):
                try:
                    fn(path)
                except evs.FormatError as exc:
                    print(exc.reason)
        for path in (json_fifo, manifest):
            try:
                evs.open_shards(path)
            except evs.FormatError as exc:
                print(exc.reason)
        try:
            evs.read_dictionary(fifo)
        except evs.FormatError as exc:
            print(exc.reason)
        for cmd in ("info", "verify", "head"):
            print("exit", main([cmd, fifo]))
        try:
            evs.open(sys.argv[4])
        except IsADirectoryError:
            print("directory")
        """,
        fifo,
        tmp_path / "pipe.json",
        manifest,
        tmp_path,
        timeout=20,
    )
    lines = out.splitlines()
    assert lines[:2] == ["not a regular file (a FIFO)"] * 2
    assert all("special file" in line for line in lines[2:4])
    assert lines[4] == "not a regular file (a FIFO)"
    assert "shards[0].path" in lines[5] and "not a regular file" in lines[5]
    assert lines[6:] == ["not a regular file (a FIFO)", "exit 2", "exit 2", "exit 2", "directory"]


# ------------------------------------------------------------------------------ the table


def _fuzz_tool():
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("evs_tools_fuzz_b", root / "tools" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


CRAFTED = {
    "plain, 4 MiB tail of end magics": lambda p: magic_tail(p, 4 * MiB),
    "plain, 4 MiB tail of fake footers": lambda p: fake_footer_tail(p, 4 * MiB),
    "zstd, tail frame claiming 2^40 bytes": zstd_tail_frame_claiming,
    "zstd, tail of 24 x 64 MiB zero frames": zstd_tail_of_zero_frames,
    "zstd, 1 GiB padding run": zstd_padding_run,
    "zstd, index of 174,762 zero entries": zstd_zero_index,
    "metadata NaN": lambda p: with_metadata(p, b'{"x": NaN}'),
    "metadata lone surrogate": lambda p: with_metadata(p, b'{"\\ud800": 1}'),
    "metadata nested 100k deep": lambda p: with_metadata(p, b"[" * 100_000 + b"]" * 100_000),
}

ENTRY_POINTS = textwrap.dedent(
    """
    import os, shutil, signal, time, traceback
    import evalue_store as evs
    from evalue_store import cli

    class Timeout(Exception):
        pass

    def alarm(*_):
        raise Timeout()

    signal.signal(signal.SIGALRM, alarm)

    def scratch(path):
        copy = path + ".copy"
        for name in os.listdir(os.path.dirname(path)):  # side files of earlier runs
            if name.startswith(os.path.basename(copy)):
                os.remove(os.path.join(os.path.dirname(path), name))
        shutil.copy(path, copy)
        return copy

    def read(path):
        for backend in ("mmap", "pread"):
            with evs.open(path, backend=backend) as ds:
                try:
                    for _ in ds:
                        pass
                except evs.FormatError:
                    pass
                if len(ds):
                    try:
                        ds[-1]
                    except evs.FormatError:
                        pass

    def append(path):
        with evs.Writer(scratch(path), "a") as w:
            w.append([1])

    def run_cli(*argv):
        return lambda path: cli.main([argv[0], "--debug", path, *argv[1:]])

    ENTRIES = {
        "open": lambda p: evs.open(p).metadata,
        "read": read,
        "verify": lambda p: evs.open(p).verify(),
        "recover": lambda p: evs.recover(scratch(p)),
        "mode a": append,
        "open_shards": lambda p: sum(1 for _ in evs.open_shards(p)),
        "cli info": run_cli("info"),
        "cli show": run_cli("show", "0"),
        "cli head": run_cli("head"),
        "cli stats": run_cli("stats"),
        "cli verify": run_cli("verify"),
        "cli copy": lambda p: cli.main(["copy", "--debug", p, "-o", scratch(p) + ".out"]),
    }
    failures = 0
    for path in sys.argv[1:]:
        for name, entry in ENTRIES.items():
            start = time.monotonic()
            signal.alarm(60)
            try:
                entry(path)
                outcome = "ok"
            except (evs.FormatError, cli.CliError) as exc:
                outcome = "FormatError"
            except BaseException as exc:
                outcome = "FAIL " + "".join(traceback.format_exception_only(exc)).strip()
                failures += 1
            finally:
                signal.alarm(0)
            print(f"{os.path.basename(path)} | {name} | {outcome} | {time.monotonic() - start:.2f}")
    print("failures", failures)
    """
)


def test_every_entry_point_is_bounded_on_every_crafted_file(tmp_path):
    """Crafted hostile files (the ones of issue 11 and the fuzzer's hand-built lies) x every
    entry point that reads a file: each ends in a result or a FormatError (the CLI: its
    error), within 60 s, in a process that cannot allocate 640 MiB; never MemoryError,
    RecursionError, OverflowError, a hang or a crash."""
    paths = []
    for k, craft in enumerate(CRAFTED.values()):
        paths.append(craft(tmp_path / f"c{k}.evs"))
    fuzz = _fuzz_tool()
    for k, blob in enumerate(fuzz.hostile_inputs()["container"].values()):
        path = tmp_path / f"h{k}.evs"
        path.write_bytes(fuzz.container_input(blob)[0])
        paths.append(path)
    out = _child(ENTRY_POINTS, *paths, timeout=900)
    lines = [line.split(" | ") for line in out.splitlines() if " | " in line]
    assert len(lines) == len(paths) * 12, out
    failed = [line for line in lines if line[2].startswith("FAIL")]
    assert not failed and out.splitlines()[-1] == "failures 0", "\n".join(map(str, failed))


def test_verify_lists_a_bounded_number_of_bad_records(tmp_path):
    """174,762 bad records in a 3 KB compressed file: verify lists the first 1000 and counts
    the rest (before: one tuple and message per record, so memory grew with the logical
    index, which can be 32768 times the file)."""
    path = zstd_zero_index(tmp_path / "f.evs.zst")
    assert path.stat().st_size < 5000
    with evs.open(path) as ds:
        report = ds.verify()
    assert len(report.bad_records) == 1000 and report.bad_records[0][0] == 0
    assert f"{174_762 - 1000} more bad records" in " ".join(report.problems)
    assert report.bad_records[0] == (0, "bad offset 0")


def test_info_and_stats_stream_an_index_bigger_than_memory(tmp_path):
    """A 40 KB compressed file whose index is 1 GiB (44.7M entries): the CLI's info and
    stats --sample read it in pieces (before: MemoryError from Dataset.entries())."""
    path = zstd_zero_index(tmp_path / "f.evs.zst", ZERO_FRAME, 16)
    assert path.stat().st_size < 50_000
    out = _child(
        """
        from evalue_store.cli import main
        print(main(["info", "--json", sys.argv[1]]), main(["stats", "--sample", "5", sys.argv[1]]))
        """,
        path,
        timeout=300,
    )
    assert out.split()[-2:] == ["1", "1"] and '"records": 44739242' in out


# ------------------------------------------------------------------------------ index lies


def _with_last_commit(path: Path, block: bytes, make_commit) -> Path:
    """Append an aligned ``block`` and the footer of ``make_commit(block offset, number,
    previous footer)`` to a file (checksums valid: a hostile writer's consistent lie)."""
    data = bytearray(path.read_bytes())
    footer = struct.unpack_from("<Q", data, len(data) - TRAILER.size)[0]
    number = struct.unpack_from("<Q", data, footer + 24)[0]
    data += bytes(-len(data) % 64)
    at = len(data)
    data += block + bytes(-len(block) % 64)
    commit = replace(make_commit(at, number + 1, footer), footer_offset=len(data))
    path.write_bytes(bytes(data) + encode_footer(len(data), bytes(data[24:40]), commit, crc32c))
    return path


def _big_record_file(path: Path) -> bytes:
    """Write a file holding one 1 MiB record; returns its index entry."""
    with evs.Writer(path) as w:
        w.append([np.zeros(MiB, np.uint8)])
    with evs.open(path) as ds:
        return ds.entries()[:1].tobytes()


def test_an_index_pointing_many_entries_at_one_record_is_read_once(tmp_path):
    """2000 index entries all pointing at one 1 MiB record (every checksum valid): iterating
    stops at the second with a FormatError, and verify reads the record once and reports
    the others as bad (before: 2000 MiB were read and checksummed for a 1 MiB file)."""
    path = tmp_path / "f.evs"
    segment = _big_record_file(path) * 2000
    _with_last_commit(
        path,
        segment,
        lambda at, n, prev: Commit(
            n, 2000, 0, 0, prev, 0, 0, 0, (Segment(at, 2000, crc32c(segment), 0),)
        ),
    )
    for backend in ("mmap", "pread"):
        with evs.open(path, backend=backend) as ds:
            assert len(ds) == 2000 and ds[1999][0].nbytes == MiB  # random access still reads
            seen = []
            with pytest.raises(evs.FormatError, match="record 1: starts before an earlier"):
                for record in ds:
                    seen.append(record)
            assert len(seen) == 1
            report = ds.verify()
            assert report.bytes_checked < path.stat().st_size
            assert len(report.bad_records) == 1000 and "999 more bad records" in report.problems[-1]
            assert report.bad_records[0] == (1, evs.bounded.SHADOWED)


def test_overlapping_segments_in_one_footer_are_refused_at_open(tmp_path):
    """One segment listed 4096 times would make an index of n entries count 4096 n records
    (FORMAT.md §8 rule 2: an impossible footer)."""
    path = tmp_path / "f.evs"
    entry = _big_record_file(path)
    _with_last_commit(
        path,
        entry,
        lambda at, n, prev: Commit(
            n, 2, 0, 0, prev, 0, 0, 0, (Segment(at, 1, crc32c(entry), 0),) * 2
        ),
    )
    with pytest.raises(evs.FormatError, match="index segments overlap"):
        evs.open(path)


def test_earlier_footers_naming_overlapping_blocks_are_checked_once(tmp_path):
    """3000 earlier footers, each naming a different index segment over the same 8 MiB
    (24 GB to checksum for an 8.8 MB file): verify stops once it has checksummed as much
    as the file holds, and says so (blocks of a valid file never overlap)."""
    path = tmp_path / "f.evs"
    with evs.Writer(path) as w:
        w.append([1])
    data = bytearray(path.read_bytes())
    file_id = bytes(data[24:40])
    footer = struct.unpack_from("<Q", data, len(data) - TRAILER.size)[0]
    number, _, _ = struct.unpack_from("<QQQ", data, footer + 24)
    real_entry = bytes(data[struct.unpack_from("<Q", data, footer + 72)[0] :][:24])
    data += bytes(-len(data) % 64)
    region = len(data)
    data += bytes(8 * MiB)
    prev = footer
    count = (8 * MiB - 64 * 3000) // 24
    crc = _zeros_crc(count * 24)
    for k in range(3000):
        seg = Segment(region + 64 * k, count, crc, 0)
        number += 1
        commit = Commit(number, count, len(data), 0, prev, 0, 0, 0, (seg,))
        prev = len(data)
        data += encode_footer(len(data), file_id, commit, crc32c)
        data += bytes(-len(data) % 64)
    seg_at = len(data)
    data += real_entry + bytes(-(len(data) + 24) % 64)
    commit = Commit(
        number + 1, 1, len(data), 0, prev, 0, 0, 0, (Segment(seg_at, 1, crc32c(real_entry), 0),)
    )
    data += encode_footer(len(data), file_id, commit, crc32c)
    path.write_bytes(bytes(data))
    out = _child(
        """
        import evalue_store as evs
        with evs.open(sys.argv[1]) as ds:
            print(ds[0], ds.verify().problems)
        """,
        path,
        timeout=10,
    )
    assert out.startswith("[1]") and "overlapping blocks" in out


def test_a_socket_is_refused_as_a_file_that_is_not_regular(tmp_path):
    """A Unix socket at the path (the kernel will not open one: ENXIO): open, open_shards,
    recover and a Writer in mode "a" raise FormatError, as for a FIFO, not OSError."""
    import socket

    path = tmp_path / "s.evs"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        for action in (evs.open, evs.open_shards, evs.recover, lambda p: evs.Writer(p, "a")):
            with pytest.raises(evs.FormatError, match="not a regular file"):
                action(path)
    finally:
        server.close()


def test_a_proc_file_is_refused_by_writers_and_recovery():
    """A /proc file is regular by its type but takes no write at an offset (ESPIPE): recover
    and a Writer in mode "a" raise FormatError naming that and write nothing; open reads it
    as the empty file its size says it is. /proc/self/comm: its owner may open it to write."""
    path = "/proc/self/comm"
    before = open(path).read()
    for action in (evs.recover, lambda p: evs.Writer(p, "a")):
        with pytest.raises(evs.FormatError, match="cannot be written at an offset"):
            action(path)
    with pytest.raises(evs.FormatError, match="empty file"):
        evs.open(path)
    assert open(path).read() == before
    completed = subprocess.run(
        [sys.executable, "-m", "evalue_store", "recover", path], capture_output=True, text=True
    )
    assert completed.returncode == 2 and "Traceback" not in completed.stderr, completed.stderr
