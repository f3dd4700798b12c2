"""Recovery of the zstd frames a crash left after the last commit (either layout).

No table lists these frames, so their headers are all there is to trust: a frame is
decompressed only if it declares at most the frame cap and its blocks can produce it, and
the bytes decompressed in all stay below the cap plus SALVAGE_EXPANSION times the tail's
compressed size. The frames whose bytes are all complete records are kept as they are.
"""

from __future__ import annotations

from typing import Any

import zstandard

from ..container import FRAME_SIZE, Header, align_up
from .salvage import Salvage, scan_tail, side_file
from .zframe import FrameError, check_frame, decompress_into, frame_checksum

SALVAGE_EXPANSION = 64  # recovery decompresses at most this much per byte of compressed tail


def salvage_frames(
    reader: Any,
    dctx: zstandard.ZstdDecompressor,
    header: Header,
    start: int,
    logical_base: int,
    cap: int,
) -> tuple[list, int, list]:
    """(records found, file offset to keep up to, kept frames as (compressed size, logical
    size, checksum)) for the frames from file offset ``start``, whose bytes would begin at
    logical offset ``logical_base``."""
    size = reader.size
    frames, logical, pos = [], bytearray(), start
    room = cap + SALVAGE_EXPANSION * (size - start)
    while pos < size:
        data = reader.pread(pos, min(size - pos, cap + (1 << 20)))
        try:
            n, declared = check_frame(data, min(cap, room), exact=False)
            out = bytearray(declared)
            decompress_into(memoryview(data)[:n], memoryview(out), dctx)
        except FrameError:
            break
        frames.append((n, declared, frame_checksum(data, n), pos + n))
        logical += out
        room -= declared
        pos += n
    if not frames:
        return [], start, []

    def read(offset: int, n: int) -> memoryview:
        return memoryview(logical)[offset - logical_base : offset - logical_base + n]

    first = align_up(logical_base, header.alignment)
    found, good_end = scan_tail(
        read, header, first, logical_base + len(logical), logical, logical_base
    )
    if not found:  # frames of alignment padding alone are no records: nothing to keep
        return [], start, []
    kept, logical_end, keep = [], logical_base, start
    for csize, dsize, checksum, physical_end in frames:
        if logical_end + dsize > good_end:
            break  # a frame holding anything but complete records is not kept
        kept.append((csize, dsize, checksum))
        logical_end += dsize
        keep = physical_end
    found = [f for f in found if f[0] + FRAME_SIZE + f[1] <= logical_end]
    return found, keep, kept


def tail_salvage(
    path: str, fd: int, records: int, found: list, committed_end: int, keep: int, size: int
) -> Salvage | None:
    """What an append found after the last commit (None: nothing): the records kept, and
    the bytes cut off from ``keep`` on, saved to a side file first."""
    if size <= committed_end:
        return None
    side = side_file(path, fd, keep, size) if size > keep else None
    return Salvage(records, len(found), size - committed_end, size - keep, side)
