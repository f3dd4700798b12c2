"""Recovery after a crash, shared by both physical variants (docs/FORMAT.md, "Recovery").

A writer that died leaves a tail after the last commit. Its complete, checksum-valid,
decodable records are kept; every other byte is first copied to a side file, so nothing is
deleted that was not saved.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from ..codec import decode_payload
from ..container import Header, align_up, scan_frames
from ..files import fsync_dir, temp_name

CHUNK = 1 << 20  # bytes copied to a side file at a time


@dataclass(frozen=True)
class Salvage:
    """What opening a file with an uncommitted tail found after its last commit."""

    committed_records: int
    salvaged_records: int
    tail_bytes: int  # bytes after the last commit
    damaged_bytes: int  # bytes that were not complete records, moved to ``side_file``
    side_file: str | None


def side_file(path: str, fd: int, start: int, end: int) -> str:
    """Save the bytes [start, end) of the file at ``fd``, which recovery will cut off,
    fsynced, under a name nothing else has (not even a dangling symlink). They are copied in
    the kernel, or 1 MiB at a time, so a torn gigabyte is never held in memory."""
    side = temp_name(path, "", f".tail-{start}")  # cut to fit beside a name near NAME_MAX
    counter = 0
    while True:
        try:
            out = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            counter += 1
            side = temp_name(path, "", f".tail-{start}.{counter}")
    try:
        try:
            _copy_range(fd, out, start, end)
            os.fsync(out)
        finally:
            os.close(out)
        fsync_dir(side)  # the bytes are cut from the container next: their new name must last
    except BaseException:
        with contextlib.suppress(OSError):  # a partial copy saves nothing: the file is intact
            os.unlink(side)
        raise
    return side


def _copy_range(fd: int, out: int, start: int, end: int) -> None:
    offset = start
    while offset < end:
        n = min(end - offset, CHUNK)
        try:
            copied = os.copy_file_range(fd, out, n, offset, offset - start)
        except OSError:  # not between these files (another filesystem type): by hand
            data = os.pread(fd, n, offset)
            copied = os.pwrite(out, data, offset - start) if data else 0
        if copied == 0:
            raise OSError(f"the file ended at {offset} while its tail was copied")
        offset += copied


def scan_tail(read: Any, header: Header, start: int, end: int, buf: Any, base: int) -> tuple:
    """Complete, checksum-valid, decodable record frames in logical bytes [start, end).

    ``buf[offset - base]`` holds logical byte ``offset``. Returns (frames, end of the last
    frame including its zero padding, or ``start`` if none).
    """

    def validate(offset: int, length: int) -> None:
        decode_payload(buf, offset - base, length, header.alignment)

    found, good_end = scan_frames(read, start, end, header, validate)
    if not found:
        return found, start
    padded = min(align_up(good_end, header.alignment), end)
    if not any(read(good_end, padded - good_end)):  # the last record's own zero padding
        good_end = padded
    return found, good_end
