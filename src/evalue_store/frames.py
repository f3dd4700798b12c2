"""The zstd frame layer: the container's bytes stored as seekable zstd frames.

The logical byte stream is exactly a plain container (docs/FORMAT.md). The
physical file is a sequence of standard zstd frames plus, after every commit, a seek table
(zstd seekable format), so ``zstd -d`` turns it back into the plain container while a reader
decompresses only the frames it needs. Frames end on block boundaries; a block bigger than
the target frame size is split into frames of its own. See docs/FRAMES.md.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from collections import OrderedDict
from typing import Any

import numpy as np
import zstandard

from .bounded import open_regular
from .container import Commit, Header, parse_footer_at
from .errors import FormatError
from .seekable import (
    EMPTY_CHECKSUM,
    MAX_FRAME_DECOMPRESSED_SIZE,
    SEEK_TABLE_SKIPPABLE_MAGIC,
    SeekTable,
    _walk_blocks,
    aligned_bytes,
    aligned_empty,
    decompress_frame,
    encode_seek_table,
    find_last_seek_table,
    new_compressor,
    new_decompressor,
    read_seek_table,
)

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DICT_FRAME_MAGIC = 0x184D2A5D  # skippable frame holding our zstd dictionary (first frame)
DEFAULT_FRAME_SIZE = 4 << 10  # random reads decompress a frame: smaller is faster
BIG_FRAME_SIZE = 1 << 20
# The largest frame_size a Writer takes (frames this big already compress as well as any
# larger), so the largest frame it makes; readers refuse bigger ones by default.
MAX_FRAME_SIZE = 64 << 20
DEFAULT_CACHE_BYTES = 32 << 20
SMALL_FRAME = 64 << 10  # frames up to this size take the short decompression path
MAX_DICT_SIZE = 1 << 20


def is_compressed(prefix: bytes) -> bool:
    """True for a file that starts with a zstd frame or with our dictionary frame."""
    return prefix[:4] == ZSTD_MAGIC or (
        len(prefix) >= 4 and struct.unpack_from("<I", prefix)[0] == DICT_FRAME_MAGIC
    )


def dictionary_frame(dictionary: bytes) -> bytes:
    """The skippable frame that carries the dictionary at the start of the file."""
    return struct.pack("<II", DICT_FRAME_MAGIC, len(dictionary)) + dictionary


def read_dictionary(src: Any, size: int) -> bytes | None:
    """The dictionary stored in the file's first frame, or None."""
    if size < 8:
        return None
    magic, length = struct.unpack("<II", bytes(src[:8]))
    if magic != DICT_FRAME_MAGIC:
        return None
    if length > MAX_DICT_SIZE or 8 + length > size:
        raise FormatError(f"dictionary frame claims {length} bytes", 4)
    return bytes(src[8 : 8 + length])


def table_from_lists(csizes: list, dsizes: list, checksums: list) -> SeekTable:
    """A SeekTable over frames the writer tracks in memory (no table in the file yet)."""
    c = np.asarray(csizes, np.int64)
    d = np.asarray(dsizes, np.int64)
    coff = np.zeros(len(c) + 1, np.int64)
    doff = np.zeros(len(c) + 1, np.int64)
    np.cumsum(c, out=coff[1:])
    np.cumsum(d, out=doff[1:])
    return SeekTable(c, d, np.asarray(checksums, np.uint32), coff, doff, int(coff[-1]), 0)


def last_seek_table(data: Any, size: int, max_frame_size: int) -> SeekTable:
    """The file's last seek table, or if that one is damaged (a torn tail), the last valid
    earlier one: the previous commit. A last table that is valid but lists a frame over
    ``max_frame_size`` is an error, not a torn tail to fall back from."""
    try:
        return read_seek_table(data, size, max_frame_size=max_frame_size)
    except FormatError as exc:
        try:
            read_seek_table(data, size, max_frame_size=MAX_FRAME_DECOMPRESSED_SIZE)
        except FormatError:
            pass
        else:
            reason = f"{exc.reason} (open with a larger max_frame_size to read it)"
            raise FormatError(reason, exc.offset) from None
    # The last valid table whatever its frames' sizes: the commit to fall back to. Skipping
    # tables over the cap instead would silently open an even older commit.
    found = find_last_seek_table(data, size, max_frame_size=MAX_FRAME_DECOMPRESSED_SIZE)
    if found is None:
        raise FormatError("compressed file holds no valid seek table", size)
    table = found[0]
    sizes = table.decompressed_sizes
    if len(sizes) and int(sizes.max()) > max_frame_size:
        k = int(sizes.argmax())
        raise FormatError(
            f"frame {k} decompresses to {int(sizes[k])} bytes, over the reader cap "
            f"{max_frame_size} (open with a larger max_frame_size to read it)",
            int(table.compressed_offsets[k]),
        )
    return table


class ZstdSource:
    """Random access to the logical bytes of a compressed container.

    Decompressed frames are kept in a small LRU cache (``cache_bytes``), so neighbouring
    reads and sequential scans decompress each frame once. Buffers are placed so that a
    logical offset that is a multiple of the alignment is an aligned address.
    """

    def __init__(
        self,
        fd: int,
        size: int,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_frame_size: int = MAX_FRAME_SIZE,
        map_tail: bool = False,
    ):
        """``map_tail``: map the bytes after the last seek table too (a writer salvaging a
        tail, which holds the lock). A reader must not: a writer may cut that tail off at
        any moment, and touching a mapped page past the end of a file kills the process
        (SIGBUS); the tail is searched with pread instead."""
        self.physical_size = size
        self.table = last_seek_table(_FdSource(fd), size, max_frame_size)
        self.map = mmap.mmap(fd, size if map_tail else self.table.end, access=mmap.ACCESS_READ)
        try:
            self.dictionary = read_dictionary(self.map, self.table.end)
            dict_data = zstandard.ZstdCompressionDict(self.dictionary) if self.dictionary else None
            try:
                self.dctx = new_decompressor(dict_data)
            except zstandard.ZstdError as exc:
                reason = f"dictionary frame holds no usable dictionary: {exc}"
                raise FormatError(reason, 8) from None
        except BaseException:
            try:
                self.map.close()
            except BufferError:
                pass  # the error's traceback still holds views of the map; they free it
            raise
        self.size = self.table.logical_size
        self.alignment = 64
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[int, memoryview] = OrderedDict()
        self._cached = 0
        # A random read does a few lookups in the table: memoryviews of its arrays give
        # Python ints (indexing a numpy array makes a numpy scalar, several times slower).
        table = self.table
        self._view = memoryview(self.map)
        self._csizes = memoryview(table.compressed_sizes)
        self._dsizes = memoryview(table.decompressed_sizes)
        self._coffsets = memoryview(table.compressed_offsets)
        self._doffsets = memoryview(table.decompressed_offsets)
        self._checksums = None if table.checksums is None else memoryview(table.checksums)

    @property
    def committed_physical_end(self) -> int:
        return self.table.end

    def set_alignment(self, alignment: int) -> None:
        """Align frame buffers to the container's alignment once its header is known."""
        if alignment != self.alignment:
            self.alignment = alignment
            self._cache.clear()
            self._cached = 0

    def _frame(self, k: int) -> memoryview:
        buf = self._cache.get(k)
        if buf is not None:
            self._cache.move_to_end(k)
            return buf
        buf = self._decompress(k).toreadonly()  # later reads of the frame share it
        self._cache[k] = buf
        self._cached += buf.nbytes
        while self._cached > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached -= old.nbytes
        return buf

    def _decompress(self, k: int) -> memoryview:
        """Frame k's bytes in a buffer aligned to their logical offsets.

        A random read decompresses one small frame, so its fixed costs matter: frames up to
        SMALL_FRAME bytes take a shorter path than decompress_frame's (their allocation is
        small anyway) with the same checks: the header must declare the seek table's size
        and checksum, and the block walk must pass (FRAMES.md check 13: libzstd versions
        differ on blocks over Block_Maximum_Size); libzstd then decompresses the whole
        frame, checking content size and checksum.
        """
        size = self._dsizes[k]
        if not 0 < size <= SMALL_FRAME:
            return memoryview(
                decompress_frame(self.map, self.table, k, dctx=self.dctx, alignment=self.alignment)
            )
        start = self._coffsets[k]
        end = start + self._csizes[k]
        frame = self._view[start:end]
        try:
            params = zstandard.get_frame_parameters(frame)
            if params.content_size != size or not params.has_checksum:
                raise zstandard.ZstdError("frame header disagrees with the seek table")
            try:
                head = zstandard.frame_header_size(frame)
                _, lo, hi = _walk_blocks(frame, head, params.window_size, True)
            except ValueError as exc:
                raise zstandard.ZstdError(str(exc)) from None
            if not lo <= size <= hi:
                raise zstandard.ZstdError(f"blocks can produce {lo}..{hi} bytes, not {size}")
            sums = self._checksums  # None: a table without Checksum_Flag (valid, not ours)
            if sums is not None and int.from_bytes(frame[-4:], "little") != sums[k]:
                raise zstandard.ZstdError("frame checksum disagrees with the seek table")
            data = self.dctx.decompress(frame)
        except zstandard.ZstdError as exc:
            raise FormatError(f"frame {k}: {exc}", start) from None
        # One allocation per frame: a buffer shared by several frames would keep evicted
        # frames' memory alive for as long as any of them is cached or viewed.
        out = aligned_bytes(size, self._doffsets[k], self.alignment)
        out[:] = data
        return out

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        """(buffer, position): logical bytes [offset, offset + n) are buffer[position:...]."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise FormatError(f"read of {n} bytes runs past the logical end {self.size}", offset)
        offsets = self._doffsets
        k = bisect.bisect_right(offsets, offset) - 1
        start = offsets[k]
        if offset + n <= offsets[k + 1]:
            return self._frame(k), offset - start
        # Spans frames (a block split because it is bigger than a frame): assemble it,
        # decompressing frames that lie wholly inside straight into place.
        out = aligned_empty(n, offset, self.alignment)
        pos = offset
        while pos < offset + n:
            k = bisect.bisect_right(offsets, pos) - 1
            f_start, f_end = offsets[k], offsets[k + 1]
            take = min(f_end, offset + n) - pos
            if f_start == pos and f_end <= offset + n and k not in self._cache:
                decompress_frame(self.map, self.table, k, out[pos - offset :], dctx=self.dctx)
            else:
                out[pos - offset : pos - offset + take] = self._frame(k)[pos - f_start :][:take]
            pos += take
        return memoryview(out).toreadonly(), 0  # read-only like the cached frames

    def read(self, offset: int, n: int) -> memoryview:
        buf, pos = self.frame(offset, n)
        return buf[pos : pos + n]

    def chunks(self) -> Any:
        """Every frame's logical bytes in order (decompressing each once, uncached)."""
        for k in range(self.table.num_frames):
            if self.table.decompressed_sizes[k]:
                yield memoryview(decompress_frame(self.map, self.table, k, dctx=self.dctx))

    def verify_frames(self) -> list[str]:
        """Decompress every frame (zstd checks each content checksum) and check that each
        earlier seek table agrees with the final one; returns the problems found."""
        problems = []
        table = self.table
        for k in range(table.num_frames):
            try:
                decompress_frame(self.map, table, k, dctx=self.dctx)
            except FormatError as exc:
                problems.append(str(exc))
                continue
            start = int(table.compressed_offsets[k])
            magic = struct.unpack_from("<I", self.map, start)[0]
            if table.decompressed_sizes[k] == 0 and magic == SEEK_TABLE_SKIPPABLE_MAGIC:
                # An earlier seek table. Other skippable frames (the dictionary, a foreign
                # tool's) are opaque: decompress_frame has checked all there is to check.
                end = int(table.compressed_offsets[k + 1])
                try:
                    old = read_seek_table(self.map, end)
                    n = old.num_frames
                    same = (
                        n == k
                        and np.array_equal(old.compressed_sizes, table.compressed_sizes[:n])
                        and np.array_equal(old.decompressed_sizes, table.decompressed_sizes[:n])
                        and (
                            old.checksums is None
                            or table.checksums is None
                            or np.array_equal(old.checksums, table.checksums[:n])
                        )
                    )
                except FormatError:
                    same = False
                if not same:
                    problems.append(f"earlier seek table (frame {k}) is damaged")
        return problems

    def last_commit(self, header: Header) -> Commit:
        """The commit the last seek table ends with: a compressed file has no tail to search
        (frames after the last table are a crash's, and the table's end is a commit's)."""
        commit = parse_footer_at(self.read, self.size, header)
        if commit is None:
            raise FormatError(
                "the last seek table does not end with a container footer", self.table.table_offset
            )
        return commit

    def close(self) -> None:
        self._cache.clear()
        try:
            self._view.release()  # tensors hold views of their own
            self.map.close()
        except BufferError:
            pass


class PlainSink:
    """Writes the logical bytes straight to the file (the uncompressed container)."""

    FLUSH_BYTES = 4 << 20  # buffer small writes up to this much before a write(2)
    DIRECT_BYTES = 1 << 20  # writes at least this large skip the buffer

    def __init__(self, fd: int, pos: int):
        self.fd = fd
        self.pos = pos  # logical end, including the buffer
        self.buf = bytearray(self.FLUSH_BYTES)  # allocated once: [0, fill) waits for a write(2)
        self.fill = 0
        self.marker: tuple[int, bytes] | None = None  # (file offset, bytes) of the last footer

    def write(self, data: Any, size: int) -> None:
        if size >= self.DIRECT_BYTES:
            self.flush()
            pwrite_all(self.fd, memoryview(data).cast("B"), self.pos)
        else:
            if self.fill + size > self.FLUSH_BYTES:
                self.flush()
            if type(data) is not bytearray:  # records are; anything else is seen as bytes
                data = memoryview(data).cast("B")
            self.buf[self.fill : self.fill + size] = data
            self.fill += size
        self.pos += size

    def begin_block(self, size: int, granule: int = 0) -> None:
        """Called before each block; only the frame layer cares where blocks start."""

    def rewind(self, pos: int) -> bool:
        """Forget what was written from logical offset ``pos`` on (a record whose write
        failed part way): the next block goes there, and bytes of it already in the file are
        cut off, so no stray bytes stay between blocks or after the last one. True: done."""
        buffered_from = self.pos - self.fill
        if pos < buffered_from:
            os.ftruncate(self.fd, pos)
        self.fill = max(0, pos - buffered_from)
        self.pos = pos
        return True

    def flush(self) -> None:
        if self.fill:
            with memoryview(self.buf) as view:
                pwrite_all(self.fd, view[: self.fill], self.pos - self.fill)
            self.fill = 0

    def end_commit(self, footer: bytes, sync: Any) -> None:
        """Write the footer (the last ``len(footer)`` logical bytes): the commit's marker,
        whose presence in the file makes the commit visible."""
        self.marker = (self.pos - len(footer), footer)
        self.flush()

    @property
    def physical_end(self) -> int:
        """Bytes in the file once buffered writes are out."""
        return self.pos

    def read(self, offset: int, n: int) -> bytes:
        self.flush()
        data = os.pread(self.fd, n, offset)
        if len(data) != n:
            raise OSError(f"short read of {n} bytes at {offset}")
        return data


class ZstdSink:
    """Compresses the logical bytes into zstd frames and ends each commit with a seek table.

    ``frames`` are (compressed size, decompressed size, checksum) of every frame already in
    the file, earlier seek tables included (as empty frames), in file order.
    """

    def __init__(
        self,
        fd: int,
        physical_pos: int,
        logical_pos: int,
        frames: tuple[list, list, list],
        *,
        level: int,
        frame_size: int,
        dictionary: bytes | None,
    ):
        self.fd = fd
        self.physical = physical_pos
        self.pos = logical_pos
        self.csizes, self.dsizes, self.checksums = (list(x) for x in frames)
        self.frame_size = frame_size
        self.dictionary = dictionary
        dict_data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        self.cctx = new_compressor(level, dict_data)
        self.dctx = new_decompressor(dict_data)
        self.pending = bytearray()  # logical bytes of the frame being built
        self.split = frame_size
        self.marker: tuple[int, bytes] | None = None  # as PlainSink.marker: the seek table

    def write(self, data: Any, size: int) -> None:
        view = memoryview(data).cast("B")
        limit = self.split
        while view:
            room = limit - len(self.pending)
            piece = view[:room]
            self.pending += piece
            self.pos += len(piece)  # as it goes: a failed _emit leaves pos matching pending
            view = view[room:]
            if len(self.pending) >= limit:
                self._emit()

    def begin_block(self, size: int, granule: int = 0) -> None:
        """Start a new frame before a block that would not fit in the current one.

        A block bigger than a frame gets frames of its own: a record's of up to
        BIG_FRAME_SIZE bytes (a big tensor decompresses in few calls), an index segment's
        (``granule`` = entry size) of at most frame_size bytes cut between entries, so
        that looking up one entry decompresses one small frame.
        """
        if self.pending and len(self.pending) + size > self.frame_size:
            self._emit()
        if granule:
            self.split = max(granule, self.frame_size - self.frame_size % granule)
        else:
            self.split = max(self.frame_size, BIG_FRAME_SIZE)

    def _emit(self) -> None:
        frame = self.cctx.compress(self.pending)
        (checksum,) = struct.unpack_from("<I", frame, len(frame) - 4)
        pwrite_all(self.fd, memoryview(frame), self.physical)
        self.physical += len(frame)
        self.csizes.append(len(frame))
        self.dsizes.append(len(self.pending))
        self.checksums.append(checksum)
        self.pending = bytearray()

    def flush(self) -> None:
        if self.pending:
            self._emit()

    def rewind(self, pos: int) -> bool:
        """As PlainSink.rewind, when ``pos`` is in the open frame; False when bytes after it
        were already compressed into written frames (the writer then cannot go on)."""
        pending_from = self.pos - len(self.pending)
        if pos < pending_from:
            return False
        del self.pending[pos - pending_from :]
        self.pos = pos
        return True

    def end_commit(self, footer: bytes, sync: Any) -> None:
        """Close the frame holding the footer, make it durable (``sync``), then write the
        seek table: the commit's marker, which makes the frames before it findable. A table
        written with its footer frame could survive a power cut without it."""
        self.marker = None
        self.flush()
        sync()
        table = encode_seek_table(self.csizes, self.dsizes, self.checksums)
        self.marker = (self.physical, table)
        pwrite_all(self.fd, memoryview(table), self.physical)
        self.physical += len(table)
        # The next commit's table lists this one as an empty frame.
        self.csizes.append(len(table))
        self.dsizes.append(0)
        self.checksums.append(EMPTY_CHECKSUM)

    @property
    def physical_end(self) -> int:
        """Bytes in the file (frames already emitted; the open frame is still in memory)."""
        return self.physical

    def read(self, offset: int, n: int) -> bytes:
        """Logical bytes already in frames (the writer reads old index segments to merge)."""
        self.flush()
        table = table_from_lists(self.csizes, self.dsizes, self.checksums)
        src = _FdSource(self.fd)
        out = bytearray()
        offsets = table.decompressed_offsets
        k = int(np.searchsorted(offsets, offset, side="right")) - 1
        while len(out) < n:
            data = decompress_frame(src, table, k, dctx=self.dctx)
            start = offset + len(out) - int(offsets[k])
            out += data[start : start + n - len(out)].tobytes()
            k += 1
        return bytes(out)


class _FdSource:
    """A file descriptor as a seekable-module source (read with os.pread)."""

    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def seek(self, *args: Any) -> int:
        raise OSError("read with pread")

    def read(self, *args: Any) -> bytes:
        raise OSError("read with pread")


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    # pwrite: explicit offsets, so nothing depends on the descriptor's file position.
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def train_dictionary(records: Any, size: int = 64 << 10, alignment: int = 64) -> bytes:
    """Train a zstd dictionary on sample records (lists of values), for ``Writer(dictionary=)``.

    Small records compress poorly one frame at a time; a dictionary trained on a few
    hundred typical records recovers most of what whole-file compression would gain.
    """
    from .codec import encode_record
    from .fields import Fields

    samples = []
    for record in records:
        values, _ = Fields().values(record)  # a dict record: its values, as a writer stores
        chunks, _, _ = encode_record(values, alignment)
        samples.append(b"".join(bytes(memoryview(c).cast("B")) for c in chunks))
    if len(samples) < 8:
        raise ValueError(
            f"training a dictionary needs at least 8 sample records, got {len(samples)}"
        )
    try:
        trained = zstandard.train_dictionary(size, samples)
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd could not train a dictionary from these samples: {exc}") from None
    return trained.as_bytes()


def read_dictionary_file(path: str | os.PathLike) -> bytes | None:
    """The dictionary stored in a compressed container (for ``zstd -d -D``), or None."""
    with os.fdopen(open_regular(os.fspath(path)), "rb") as f:  # a FIFO would block
        head = f.read(8)
        if len(head) < 8 or struct.unpack_from("<I", head)[0] != DICT_FRAME_MAGIC:
            return None
        size = os.fstat(f.fileno()).st_size
        return read_dictionary(head + f.read(min(MAX_DICT_SIZE, size - 8)), size)
