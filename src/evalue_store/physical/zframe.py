"""One standard zstd frame: its header rules, a block walk that needs no decoding, bounded
decompression, and buffers placed at their logical alignment.

Container-independent: the seek-table layout (``seekable``) and the indexed layout
(``zstd_layout``) both store frames that record their content size and checksum, and both
read them through these checks before anything is allocated. A violation raises ``FrameError``
(``ValueError``); callers turn it into a ``FormatError`` with the file offset.
"""

from __future__ import annotations

import array
import struct
import threading
from typing import Any

import numpy as np
import zstandard

from ..buffers import read_only
from ..byteio import Gather
from ..errors import UsageError

ZSTD_FRAME_MAGIC = 0xFD2FB528
"""Magic number of a Zstandard frame (zstd_compression_format.md, Zstandard frames)."""
SKIPPABLE_MAGIC_MIN = 0x184D2A50
"""Skippable frames use any magic 0x184D2A50..0x184D2A5F (zstd_compression_format.md)."""
MAGIC_NUMBER = struct.Struct("<I")
"""Every frame, zstd or skippable, starts with a 4-byte little-endian magic number."""
SKIPPABLE_HEADER = struct.Struct("<II")
"""Skippable frame header: 4-byte magic + 4-byte Frame_Size (User_Data follows)."""
SKIPPABLE_HEADER_SIZE = SKIPPABLE_HEADER.size
CONTENT_CHECKSUM = struct.Struct("<I")
"""Content_Checksum: the last 4 bytes of a zstd frame that has one (low 32 bits of XXH64)."""
BLOCK_SIZE_MAX = 128 * 1024
"""Block_Maximum_Size is at most 128 KiB, for decompressed and compressed block size."""
MIN_ZSTD_FRAME_HEADER = 6
"""Magic (4) + Frame_Header_Descriptor (1) + Window_Descriptor or 1-byte FCS (1)."""
MAX_FRAME_HEADER = 18
"""Magic (4) + descriptor (1) + window (1) + dictionary id (4) + content size (8)."""
MIN_BLOCK_SIZE = 4
"""Smallest block that produces output: 3-byte header + 1 byte (RLE block content)."""
MAX_EXPANSION_RATIO = BLOCK_SIZE_MAX // MIN_BLOCK_SIZE
"""32768: no zstd frame decompresses to more than 32768 bytes per compressed byte (a block
yields at most 128 KiB and costs at least 4 bytes; headers and checksum only add bytes)."""
MIN_FRAME_SIZE = SKIPPABLE_HEADER_SIZE
"""No frame is smaller than 8 bytes (a bare skippable header; a zstd frame needs 9)."""
SMALL_FRAME = 256 << 10  # frames up to this size are decompressed in one decoder call
DEFAULT_LEVEL = 1  # measured: smaller and faster than 3 on frames of a few KiB of records


class FrameError(ValueError):
    """A frame that breaks a rule; the caller names where it is."""


def frame_checksum(buf: Any, end: int | None = None) -> int:
    """The Content_Checksum of the zstd frame that ends at ``buf[end]`` (default: at the end
    of ``buf``); the caller knows the frame has one (Content_Checksum_Flag set)."""
    at = (len(buf) if end is None else end) - CONTENT_CHECKSUM.size
    return CONTENT_CHECKSUM.unpack_from(buf, at)[0]


def new_compressor(
    level: int = DEFAULT_LEVEL, dict_data: zstandard.ZstdCompressionDict | None = None
) -> zstandard.ZstdCompressor:
    """A compressor whose frames record their content size and content checksum (reuse it:
    it keeps its context and loaded dictionary). Frames do not name the dictionary: the
    file has one (4 bytes a frame, 1% of a small record's)."""
    return zstandard.ZstdCompressor(
        level=level,
        dict_data=dict_data,
        write_content_size=True,
        write_checksum=True,
        write_dict_id=False,
    )


def new_decompressor(
    dict_data: zstandard.ZstdCompressionDict | None = None,
) -> zstandard.ZstdDecompressor:
    """A decompressor with zstd's default 128 MiB window limit."""
    if dict_data is None:
        return zstandard.ZstdDecompressor()
    return zstandard.ZstdDecompressor(dict_data=dict_data)


class LogicalReads:
    """``read`` and ``gather`` of a compressed source, over its ``frame(offset, n)``, and
    ``dctx``: the calling thread's decompressor. python-zstandard's decompressor is not
    thread-safe (two threads decompressing with one corrupt its context: a crash, seen with
    four threads reading one dataset), and a dataset may be read from any thread; each gets
    its own, made on first use with the file's dictionary."""

    alignment: int
    _local: threading.local

    def _decode_with(self, dictionary: bytes | None) -> None:
        """Decompress with ``dictionary``; zstandard.ZstdError if it cannot be used."""
        self._dict_data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        self._local = threading.local()
        self._local.dctx = new_decompressor(self._dict_data)

    @property
    def dctx(self) -> zstandard.ZstdDecompressor:
        try:
            return self._local.dctx
        except AttributeError:
            self._local.dctx = new_decompressor(self._dict_data)
            return self._local.dctx

    @dctx.setter
    def dctx(self, dctx: zstandard.ZstdDecompressor) -> None:
        self._local.dctx = dctx  # this thread's

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        raise NotImplementedError

    def read(self, offset: int, n: int) -> memoryview:
        buf, pos = self.frame(offset, n)
        return buf[pos : pos + n]

    def span(self, offset: int, n: int) -> tuple[Any, int]:
        """``frame(offset, n)`` for a pass in file order (a scan reads its records a span at
        a time), which a source may serve more cheaply than a random read."""
        return self.frame(offset, n)

    def track_checks(self) -> None:
        """Verify is about to read the records in file order (``span``) before checking
        the frames (``verify_frames``): a source may then skip the frames already checked."""

    def gather(
        self, offsets: np.ndarray, sizes: np.ndarray, *, index: bool = False
    ) -> tuple[memoryview, np.ndarray]:
        """A batch of logical ranges in one buffer, read span by span in file order (so
        each frame is decompressed once): the buffer and each range's position in it."""
        plan = Gather(offsets, sizes, self.alignment, 0)
        out = aligned_empty(plan.size, 0, self.alignment)
        for (start, n), place in zip(plan.spans, plan.places):
            out[place : place + n] = self.read(start, n)
        return read_only(out), plan.positions


def aligned_empty(nbytes: int, logical_start: int = 0, alignment: int = 64) -> np.ndarray:
    """Uninitialised uint8 array of ``nbytes`` whose element ``i`` is meant to hold logical
    byte ``logical_start + i``, placed so that every logical offset that is a multiple of
    ``alignment`` lands on an aligned address (tensors keep their file alignment)."""
    if nbytes < 0 or alignment < 1:
        raise UsageError("nbytes must be >= 0 and alignment >= 1")
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    address = raw.__array_interface__["data"][0]  # cheaper than raw.ctypes.data
    shift = (logical_start - address) % alignment
    return raw[shift : shift + nbytes]


_ZERO_BYTE = array.array("B", [0])


def aligned_bytes(nbytes: int, logical_start: int = 0, alignment: int = 64) -> memoryview:
    """A zeroed, writable memoryview placed as by :func:`aligned_empty`, made faster: an
    array's buffer_info() gives its address for a fraction of what numpy's does, which
    counts when a random read decompresses one small frame."""
    if nbytes < 0 or alignment < 1:
        raise UsageError("nbytes must be >= 0 and alignment >= 1")
    raw = _ZERO_BYTE * (nbytes + alignment)
    shift = (logical_start - raw.buffer_info()[0]) % alignment
    return memoryview(raw)[shift : shift + nbytes]


def walk_blocks(
    frame: Any, header_size: int, window_size: int, has_checksum: bool, exact: bool = True
) -> tuple[int, int, int]:
    """Walk the block headers of one zstd frame without decoding.

    Returns (frame length, min output, max output): raw and RLE blocks give exact sizes, a
    compressed block at most Block_Maximum_Size. With ``exact`` the frame must end exactly at
    ``len(frame)``; without, it may end before (to find where a frame ends).
    """
    block_max = min(window_size, BLOCK_SIZE_MAX)
    limit = len(frame)
    pos = header_size
    lo = hi = 0
    while True:
        if pos + 3 > limit:
            raise FrameError(f"block header at {pos} runs past the frame's {limit} bytes")
        header = frame[pos] | (frame[pos + 1] << 8) | (frame[pos + 2] << 16)
        pos += 3
        block_type = (header >> 1) & 3
        block_size = header >> 3
        if block_size > block_max:
            raise FrameError(f"block size {block_size} over Block_Maximum_Size {block_max}")
        if block_type == 0:
            pos += block_size
            lo += block_size
            hi += block_size
        elif block_type == 1:
            pos += 1
            lo += block_size
            hi += block_size
        elif block_type == 2:
            pos += block_size
            hi += block_max
        else:
            raise FrameError("reserved block type")
        if header & 1:
            break
    if has_checksum:
        pos += 4
    if pos > limit or (exact and pos != limit):
        raise FrameError(f"zstd frame is {pos} bytes long but its entry says {limit}")
    return pos, lo, hi


OWN_DESCRIPTOR = 0x64
"""Frame_Header_Descriptor of the frames writers make of 256 B to 64 KiB: a 2-byte content
size, single segment, content checksum, no dictionary id (parsed without the general path)."""
_DID_SIZES = (0, 1, 2, 4)  # Dictionary_ID field bytes by Dictionary_ID_Flag
_FCS_SIZES = (0, 2, 4, 8)  # Frame_Content_Size field bytes by FCS_Field_Size flag
WINDOW_LOG_MAX = 31  # the largest window a decoder accepts on 64-bit (libzstd's limit)


def frame_header(frame: Any) -> tuple[int, int, int, bool]:
    """(header size, content size or -1 if absent, window size, content checksum flag) of
    the zstd frame whose magic has been checked, parsed from its Frame_Header as
    RFC 8878 section 3.1.1.1 defines it (a read decodes one per missed frame: this costs
    less than asking the library twice)."""
    if len(frame) < 5:
        raise FrameError("frame header runs past the frame")
    fhd = frame[4]
    if fhd & 0x08:
        raise FrameError("frame header: reserved bit set")
    single = fhd & 0x20
    pos = 5 if single else 6
    did = _DID_SIZES[fhd & 3]
    fcs_flag = fhd >> 6
    fcs = 1 if single and not fcs_flag else _FCS_SIZES[fcs_flag]
    end = pos + did + fcs
    if len(frame) < end:
        raise FrameError("frame header runs past the frame")
    at = pos + did
    if fcs == 0:
        size = -1
    elif fcs == 1:
        size = frame[at]
    elif fcs == 2:
        size = (frame[at] | frame[at + 1] << 8) + 256
    else:
        size = int.from_bytes(frame[at : at + fcs], "little")
    if single:
        window = size
    else:
        descriptor = frame[5]
        log = 10 + (descriptor >> 3)
        if log > WINDOW_LOG_MAX:
            raise FrameError(f"frame header: window of 2^{log} bytes")
        base = 1 << log
        window = base + (base >> 3) * (descriptor & 7)
    return end, size, window, bool(fhd & 0x04)


def check_frame(frame: Any, cap: int, exact: bool = True) -> tuple[int, int]:
    """(length, content size) of the zstd frame at the start of ``frame``, after every check
    that needs no decoding: magic, a recorded content size no larger than ``cap`` and than
    the blocks can produce, a content checksum, blocks within Block_Maximum_Size."""
    if len(frame) < MIN_ZSTD_FRAME_HEADER + 3:
        raise FrameError(f"{len(frame)} bytes cannot hold a zstd frame")
    (magic,) = MAGIC_NUMBER.unpack_from(frame)
    if magic != ZSTD_FRAME_MAGIC:
        raise FrameError(f"not a zstd frame (magic {magic:#010x})")
    if frame[4] == OWN_DESCRIPTOR:
        header_size, size = 7, (frame[5] | frame[6] << 8) + 256
        window = size
    else:
        header_size, size, window, has_checksum = frame_header(frame)
        if size < 0:
            raise FrameError("frame header does not record its content size")
        if not has_checksum:
            raise FrameError("frame has no content checksum")
    if size > cap:
        raise FrameError(f"frame declares {size} bytes, over the reader cap {cap}")
    at = header_size
    if at + 3 <= len(frame):  # one compressed block, the last: a small frame's usual form
        block = frame[at] | frame[at + 1] << 8 | frame[at + 2] << 16
        length = at + 7 + (block >> 3)
        block_max = min(window, BLOCK_SIZE_MAX)
        if (
            block & 7 == 5
            and block >> 3 <= block_max
            and size <= block_max
            and (length == len(frame) if exact else length <= len(frame))
        ):
            return length, size
    length, lo, hi = walk_blocks(frame, header_size, window, True, exact)
    if not lo <= size <= hi:
        raise FrameError(f"blocks can produce {lo}..{hi} bytes, not the declared {size}")
    return length, size


def decompress_into(frame: Any, target: memoryview, dctx: zstandard.ZstdDecompressor) -> None:
    """Decompress one checked frame into ``target`` (exactly its content size), never
    writing past it: any further output or any decoder error is a FrameError."""
    size = target.nbytes
    try:
        reader = dctx.stream_reader(frame, read_across_frames=False)
        filled = 0
        while filled < size:
            got = reader.readinto(target[filled:])
            if got == 0:
                raise FrameError(f"frame ended after {filled} of {size} declared bytes")
            filled += got
        if reader.read(1):
            raise FrameError(f"frame decompresses to more than its declared {size} bytes")
    except zstandard.ZstdError as exc:
        raise FrameError(f"decompression failed: {exc}") from None


def decompress_small(frame: Any, size: int, dctx: zstandard.ZstdDecompressor) -> bytes:
    """One checked frame of at most a few hundred KiB, in one decoder call (the fast path of
    a random read: libzstd checks the content size and checksum)."""
    try:
        data = dctx.decompress(frame)
    except zstandard.ZstdError as exc:
        raise FrameError(f"decompression failed: {exc}") from None
    if len(data) != size:
        raise FrameError(f"frame decompressed to {len(data)} bytes, declared {size}")
    return data


def frame_extent(frame: Any) -> int | None:
    """Length of the complete zstd frame (with content size and checksum) at the start of
    ``frame``, or None if the bytes do not hold one (recovery walks frames no table lists)."""
    try:
        return check_frame(frame, 1 << 62, exact=False)[0]
    except FrameError:
        return None


BIG_FRAME_SIZE = 1 << 20  # a record bigger than a frame is cut into frames of this size
INDEX_FRAME_SIZE = 64 << 10  # index segments are cut into frames of about this size at least


class FrameCutter:
    """What both zstd sinks share: the logical bytes of the frame being built (``pending``),
    cut into frames at ``split`` bytes and at block starts. ``_emit`` (each sink's own)
    compresses ``pending`` into the file and empties it."""

    compressed = True

    def __init__(self, logical_pos: int, frame_size: int):
        self.pos = logical_pos  # logical end, the open frame included
        self.frame_size = frame_size
        self.pending = bytearray()  # logical bytes of the frame being built
        self.split = frame_size
        # True while a step that changes several of the fields above (and a sink's frame
        # bookkeeping) is under way: an interrupt then leaves them out of step, and
        # ``rewind`` refuses (the writer stops: reopen with mode "a") rather than let a
        # later commit describe bytes that are not where it says (attacker's B07).
        self._torn = False

    def _emit(self) -> None:
        raise NotImplementedError

    def write(self, data: Any, size: int) -> None:
        view = memoryview(data).cast("B")
        limit = self.split
        while view:
            piece = view[: limit - len(self.pending)]
            self._torn = True
            self.pending += piece
            self.pos += len(piece)  # as it goes: a failed _emit leaves pos matching pending
            self._torn = False
            view = view[len(piece) :]
            if len(self.pending) >= limit:
                self._emit()

    def begin_block(self, size: int, granule: int = 0) -> None:
        """Start a new frame before a block that would not fit in the current one.

        A block bigger than a frame gets frames of its own: a record's of up to
        BIG_FRAME_SIZE bytes (a big tensor decompresses in few calls), an index segment's
        (``granule`` = entry size) of at least INDEX_FRAME_SIZE bytes cut between entries
        (lookups read locators, not the index, so its frames are cut for size).
        """
        if self.pending and len(self.pending) + size > self.frame_size:
            self._emit()
        if granule:
            target = max(self.frame_size, INDEX_FRAME_SIZE)
            self.split = max(granule, target - target % granule)
        else:
            self.split = max(self.frame_size, BIG_FRAME_SIZE)

    def write_blocks(self, data: Any, count: int, size: int, block: int = 0) -> None:
        """``count`` records of ``size`` bytes each (``block`` of them the record, the rest
        its alignment padding; default all) laid end to end in ``data``: the frames
        ``begin_block`` and ``write`` would cut for each record in turn, a frame's worth of
        records per step (columnar writes)."""
        view = memoryview(data).cast("B")
        block = block or size
        if block > self.frame_size:  # each record gets frames of its own
            for at in range(0, count * size, size):
                self.begin_block(block)
                self.write(view[at : at + size], size)
            return
        self.split = max(self.frame_size, BIG_FRAME_SIZE)
        done = 0
        while done < count:
            room = self.frame_size - len(self.pending) - block
            if room < 0 and self.pending:
                self._emit()
                continue
            k = min(max(room, 0) // size + 1, count - done)
            full = 0 if self.pending else (count - done - 1) // k  # frames closed already
            if full:  # k records each, straight from ``data``; the last ones stay open
                self._emit_frames(view[done * size : (done + full * k) * size], k * size)
                done += full * k
                continue
            self.write(view[done * size : (done + k) * size], k * size)
            done += k

    def _emit_frames(self, data: memoryview, length: int) -> None:
        """Frames of ``length`` logical bytes each, all of ``data``, when no frame is open:
        ``_emit`` of each (a sink may do them together)."""
        for at in range(0, len(data), length):
            self._torn = True
            self.pending += data[at : at + length]
            self.pos += length
            self._torn = False
            self._emit()

    def flush(self) -> None:
        if self.pending:
            self._emit()

    def rewind(self, pos: int) -> bool:
        """As PlainSink.rewind, when ``pos`` is in the open frame; False when bytes after it
        were already compressed into written frames (the writer then cannot go on)."""
        pending_from = self.pos - len(self.pending)
        if self._torn or pos < pending_from:
            return False
        self._torn = True
        del self.pending[pos - pending_from :]
        self.pos = pos
        self._torn = False
        return True
