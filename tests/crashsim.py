"""A crash-state explorer for the commit protocol (in the manner of ALICE and CrashMonkey).

``record(path, workload)`` runs a workload against a real file while logging every write,
truncate and fsync the library makes to it, and every commit that returned. ``crash_states``
then replays that log and yields the file as a power cut could leave it at each point:

- what was fsynced survives;
- of the pages written since the last fsync, any subset survives, in any order (a page that
  does not survive holds what it held at the last fsync, zeros past the fsynced length);
- a surviving page may itself be torn: some of its 512-byte sectors new, the others old;
- the file's length is the fsynced one or the newest one.

``check_state`` opens such an image and asserts the promise: every record of every commit
that had returned is readable and exact, and open and recover pick the newest commit whose
marker (the bytes that make it visible: the footer, or for a compressed file the seek table)
survived whole.
"""

from __future__ import annotations

import contextlib
import os
import random
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

PAGE = 4096
SEEKABLE_MAGIC = (0x8F92EAB1).to_bytes(4, "little")
INDEX_TAG = b"EVZI"  # FRAMES.md: the last 4 bytes of a layout-2 index block
SECTOR = 512


@dataclass
class Log:
    """What a workload did to one file, in order. Ops: ("write", offset, bytes),
    ("truncate", length), ("fsync",), ("returned", records)."""

    ops: list[tuple] = field(default_factory=list)


@contextlib.contextmanager
def _recording(path: str, log: Log) -> Iterator[None]:
    target = os.path.realpath(path)
    fds: set[int] = set()
    real = {name: getattr(os, name) for name in ("open", "close", "pwrite", "ftruncate", "fsync")}

    # A new file is built under a temporary name beside it (.NAME.<random>.new), then
    # linked to its name: its bytes are the file's from the first write on.
    folder, temp_prefix = os.path.dirname(target), f".{os.path.basename(target)}."

    def _is_target(p: Any) -> bool:
        if not isinstance(p, (str, os.PathLike)):
            return False
        name = os.path.realpath(p)
        if name == target:
            return True
        base = os.path.basename(name)
        return (
            os.path.dirname(name) == folder
            and base.startswith(temp_prefix)
            and base.endswith(".new")
        )

    def _open(p: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real["open"](p, flags, *args, **kwargs)
        if _is_target(p):
            fds.add(fd)
        return fd

    def _close(fd: int) -> None:
        fds.discard(fd)
        real["close"](fd)

    def _pwrite(fd: int, data: Any, offset: int) -> int:
        n = real["pwrite"](fd, data, offset)
        if fd in fds:
            log.ops.append(("write", offset, bytes(memoryview(data).cast("B")[:n])))
        return n

    def _ftruncate(fd: int, length: int) -> None:
        real["ftruncate"](fd, length)
        if fd in fds:
            log.ops.append(("truncate", length))

    def _fsync(fd: int) -> None:
        real["fsync"](fd)
        if fd in fds:
            log.ops.append(("fsync",))

    patched = {
        "open": _open,
        "close": _close,
        "pwrite": _pwrite,
        "ftruncate": _ftruncate,
        "fsync": _fsync,
    }
    try:
        for name, fn in patched.items():
            setattr(os, name, fn)
        yield
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


def record(path: str, workload: Callable[[Callable[[Any], None]], None]) -> Log:
    """Run ``workload(returned)`` on ``path``; it calls ``returned(writer)`` right after each
    ``commit()`` (or close) returns, so the log knows what a crash must not lose."""
    log = Log()

    def returned(writer: Any) -> None:
        log.ops.append(("returned", len(writer)))

    with _recording(path, log):
        workload(returned)
    return log


def _pages(start: int, end: int) -> range:
    return range(start // PAGE, (end + PAGE - 1) // PAGE)


@dataclass
class CrashPoint:
    """The state right after op ``index``: the fsynced image and the newest one."""

    index: int
    durable: bytes
    current: bytes
    dirty: list[int]  # pages written (or cut) since the last fsync
    returned: int  # records of the last commit that had returned (-1: none had)


def crash_points(log: Log) -> Iterator[CrashPoint]:
    """Every point between two ops of the log, with what a crash there starts from."""
    durable = bytearray()
    current = bytearray()
    dirty: set[int] = set()
    returned = -1  # no commit has returned yet
    for index, op in enumerate(log.ops):
        kind = op[0]
        if kind == "write":
            _, offset, data = op
            if offset + len(data) > len(current):
                current.extend(bytes(offset + len(data) - len(current)))
            current[offset : offset + len(data)] = data
            dirty.update(_pages(offset, offset + len(data)))
        elif kind == "truncate":
            length = op[1]
            if length < len(current):
                dirty.update(_pages(length, len(current)))
                del current[length:]
            else:
                dirty.update(_pages(len(current), length))
                current.extend(bytes(length - len(current)))
        elif kind == "fsync":
            durable = bytearray(current)
            dirty.clear()
        else:  # "returned": a fact about the ops before it, not an op of its own
            returned = op[1]
            continue
        yield CrashPoint(index, bytes(durable), bytes(current), sorted(dirty), returned)


def _marker(image: bytes) -> tuple[int, bytes]:
    """The bytes at the end of a committed file that make its last commit visible, found by
    the spec alone: a plain file's footer (from its trailer), a compressed file's index block
    (layout 2: from its trailer) or seek table (layout 1: from the seekable format's footer)."""
    if image[-4:] == INDEX_TAG:
        (size,) = struct.unpack_from("<I", image, len(image) - 8)
        return len(image) - size, image[len(image) - size :]
    if image[-4:] == SEEKABLE_MAGIC:
        (n,) = struct.unpack_from("<I", image, len(image) - 9)
        entry = 12 if image[-5] & 0x80 else 8
        start = len(image) - (8 + n * entry + 9)
        return start, image[start:]
    offset, length, _, magic = struct.unpack_from("<QII8s", image, len(image) - 24)
    assert magic == b"EVSEND01", "a commit returned but the file does not end with a footer"
    return offset, image[offset : offset + length]


def markers(log: Log) -> list[tuple[int, bytes, int]]:
    """(offset, bytes, records) of every commit that returned. A crash state holds a
    commit's marker whole only if the crash came after it was written (its bytes name the
    commit: number, file id, checksums)."""
    found = []
    current = bytearray()
    for op in log.ops:
        if op[0] == "write":
            _, offset, data = op
            if offset + len(data) > len(current):
                current.extend(bytes(offset + len(data) - len(current)))
            current[offset : offset + len(data)] = data
        elif op[0] == "truncate":
            del current[op[1] :]
            current.extend(bytes(op[1] - len(current)))
        elif op[0] == "returned":
            found.append((*_marker(bytes(current)), op[1]))
    return found


def _compose(point: CrashPoint, keep: dict[int, Any], length: int) -> bytes:
    """The image: durable bytes, with page p taken from the newest image where ``keep[p]``
    is True, or sector by sector where it is a list of booleans."""
    out = bytearray(point.durable[:length].ljust(length, b"\0"))
    for page, choice in keep.items():
        lo, hi = page * PAGE, min((page + 1) * PAGE, length)
        if lo >= hi or not choice:
            continue
        sectors = choice if isinstance(choice, list) else [True] * (PAGE // SECTOR)
        for k, take in enumerate(sectors):
            s_lo, s_hi = lo + k * SECTOR, min(lo + (k + 1) * SECTOR, hi)
            if take and s_lo < s_hi:
                new = point.current[s_lo:s_hi].ljust(s_hi - s_lo, b"\0")
                out[s_lo:s_hi] = new
    return bytes(out)


def crash_states(point: CrashPoint, rng: random.Random, subsets: int) -> Iterator[bytes]:
    """Images a power cut at ``point`` may leave: all new, all old, each page alone lost or
    alone kept (when few), ``subsets`` random subsets, and torn pages."""
    lengths = sorted({len(point.durable), len(point.current)})
    dirty = point.dirty
    choices: list[dict[int, Any]] = [{p: True for p in dirty}, {}]
    if len(dirty) <= 8:
        choices += [{q: q != p for q in dirty} for p in dirty]
        choices += [{p: True} for p in dirty]
    for _ in range(subsets if dirty else 0):
        choices.append({p: rng.random() < 0.5 for p in dirty})
        choices.append({p: rng.choice((False, True, "torn")) for p in dirty})
    for keep in choices:
        for page, choice in keep.items():
            if choice == "torn":
                keep[page] = [rng.random() < 0.5 for _ in range(PAGE // SECTOR)]
    seen: set[bytes] = set()
    for length in lengths:
        for keep in choices:
            image = _compose(point, keep, length)
            if image not in seen:
                seen.add(image)
                yield image


def expected_count(image: bytes, commits: list[tuple[int, bytes, int]]) -> int:
    """Records of the newest commit whose marker survived whole (-1 if none did)."""
    best = -1
    for offset, data, count in commits:
        if image[offset : offset + len(data)] == data:
            best = max(best, count)
    return best
