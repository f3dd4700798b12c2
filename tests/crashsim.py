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

A file may be replaced by a new one under its name (a compressed file rebuilt with the
dictionary its writer trained, FRAMES.md section 7): each file has its own image, and until
the directory is fsynced after the rename a power cut may leave the name on either.
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
INDEX_MAGIC = (0x184D2A5C).to_bytes(4, "little")  # and its first 4
SECTOR = 512


@dataclass
class Log:
    """What a workload did to the files under one name, in order. Ops: ("write", offset,
    bytes, file), ("truncate", length, file), ("fsync", file), ("rename", file): the name is
    now ``file``'s, ("dirsync",): the name's directory is fsynced, ("returned", records).
    ``file`` is the inode; the first file written is taken to hold the name from the start."""

    ops: list[tuple] = field(default_factory=list)


@contextlib.contextmanager
def _recording(path: str, log: Log) -> Iterator[None]:
    target = os.path.realpath(path)
    fds: dict[int, int] = {}  # descriptor -> inode, of the name's file and temporary files
    dirs: set[int] = set()  # descriptors of the name's directory
    names = ("open", "close", "pwrite", "ftruncate", "fsync", "replace")
    real = {name: getattr(os, name) for name in names}

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
            fds[fd] = os.fstat(fd).st_ino
        elif isinstance(p, (str, os.PathLike)) and os.path.realpath(p) == folder:
            dirs.add(fd)
        return fd

    def _close(fd: int) -> None:
        fds.pop(fd, None)
        dirs.discard(fd)
        real["close"](fd)

    def _pwrite(fd: int, data: Any, offset: int) -> int:
        n = real["pwrite"](fd, data, offset)
        if fd in fds:
            log.ops.append(("write", offset, bytes(memoryview(data).cast("B")[:n]), fds[fd]))
        return n

    def _ftruncate(fd: int, length: int) -> None:
        real["ftruncate"](fd, length)
        if fd in fds:
            log.ops.append(("truncate", length, fds[fd]))

    def _fsync(fd: int) -> None:
        real["fsync"](fd)
        if fd in fds:
            log.ops.append(("fsync", fds[fd]))
        elif fd in dirs:
            log.ops.append(("dirsync",))

    def _replace(src: Any, dst: Any, **kwargs: Any) -> None:
        inode = os.stat(src).st_ino
        real["replace"](src, dst, **kwargs)
        if os.path.realpath(dst) == target:
            log.ops.append(("rename", inode))

    patched = {
        "open": _open,
        "close": _close,
        "pwrite": _pwrite,
        "ftruncate": _ftruncate,
        "fsync": _fsync,
        "replace": _replace,
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


class _File:
    """One file's bytes: as fsynced, as written, and the pages written since the fsync."""

    def __init__(self) -> None:
        self.durable = bytearray()
        self.current = bytearray()
        self.dirty: set[int] = set()

    def apply(self, op: tuple) -> None:
        kind = op[0]
        if kind == "write":
            _, offset, data, _ = op
            if offset + len(data) > len(self.current):
                self.current.extend(bytes(offset + len(data) - len(self.current)))
            self.current[offset : offset + len(data)] = data
            self.dirty.update(_pages(offset, offset + len(data)))
        elif kind == "truncate":
            length = op[1]
            if length < len(self.current):
                self.dirty.update(_pages(length, len(self.current)))
                del self.current[length:]
            else:
                self.dirty.update(_pages(len(self.current), length))
                self.current.extend(bytes(length - len(self.current)))
        else:  # fsync
            self.durable = bytearray(self.current)
            self.dirty.clear()


class _Name:
    """The files a workload wrote and which of them the name is on: ``durable`` (as the
    directory was last fsynced) and ``current`` (after the last rename)."""

    def __init__(self) -> None:
        self.files: dict[int, _File] = {}
        self.durable: int | None = None
        self.current: int | None = None

    def apply(self, op: tuple) -> None:
        if op[0] == "rename":
            self.current = op[1]
        elif op[0] == "dirsync":
            self.durable = self.current
        else:
            inode = op[-1]
            if self.current is None:  # the first file holds the name from the start
                self.durable = self.current = inode
            self.files.setdefault(inode, _File()).apply(op)

    def candidates(self) -> list[_File]:
        """The files a power cut may leave under the name."""
        inodes = dict.fromkeys(i for i in (self.durable, self.current) if i is not None)
        return [self.files.setdefault(i, _File()) for i in inodes]


def crash_points(log: Log) -> Iterator[CrashPoint]:
    """Every point between two ops of the log, with what a crash there starts from (one
    per file the name may be on)."""
    name = _Name()
    returned = -1  # no commit has returned yet
    for index, op in enumerate(log.ops):
        if op[0] == "returned":  # a fact about the ops before it, not an op of its own
            returned = op[1]
            continue
        name.apply(op)
        for f in name.candidates():
            yield CrashPoint(index, bytes(f.durable), bytes(f.current), sorted(f.dirty), returned)


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
    commit: number, file id, checksums). A file that took the name by a rename holds the
    last returned commit again (a rebuilt file's first index block), durable before it."""
    found = []
    name = _Name()
    count = -1
    for op in log.ops:
        if op[0] == "returned":
            count = op[1]
            found.append((*_marker(bytes(name.files[name.current].current)), count))
        else:
            name.apply(op)
            if op[0] == "rename":
                found.append((*_first_index_block(bytes(name.files[op[1]].durable)), count))
    return found


def _first_index_block(image: bytes) -> tuple[int, bytes]:
    """The first layout-2 index block of ``image``, by the spec: found from its tag."""
    at = image.find(INDEX_TAG)
    while at >= 0:
        (size,) = struct.unpack_from("<I", image, at - 4)
        start = at + 4 - size
        if start >= 0 and image[start : start + 4] == INDEX_MAGIC:
            return start, image[start : at + 4]
        at = image.find(INDEX_TAG, at + 1)
    raise AssertionError("a file took the name without a commit")


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
