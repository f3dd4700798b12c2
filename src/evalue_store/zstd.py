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
from collections import OrderedDict
from typing import Any

import numpy as np
import zstandard

from .bounded import open_regular
from .container import (
    DEFAULT_VERSION,
    FRAME_SIZE,
    MAGIC,
    Commit,
    Header,
    align_up,
    checksum_function,
    open_container,
    parse_footer_at,
    version_flags,
)
from .errors import FormatError
from .plain import pwrite_all
from .salvage import Salvage, scan_tail, side_file
from .seekable import (
    EMPTY_CHECKSUM,
    MAGIC_NUMBER,
    MAX_FRAME_DECOMPRESSED_SIZE,
    SEEK_TABLE_SKIPPABLE_MAGIC,
    SKIPPABLE_HEADER,
    SeekTable,
    _walk_blocks,
    aligned_bytes,
    aligned_empty,
    decompress_frame,
    encode_seek_table,
    find_last_seek_table,
    frame_checksum,
    frame_extent,
    new_compressor,
    new_decompressor,
    read_seek_table,
)

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DICT_FRAME_MAGIC = 0x184D2A5D  # skippable frame holding our zstd dictionary (first frame)
_DICT_MAGIC = SKIPPABLE_HEADER.pack(DICT_FRAME_MAGIC, 0)[:4]  # its magic's bytes
DEFAULT_FRAME_SIZE = 4 << 10  # random reads decompress a frame: smaller is faster
BIG_FRAME_SIZE = 1 << 20
# The largest frame_size a Writer takes (frames this big already compress as well as any
# larger), so the largest frame it makes; readers refuse bigger ones by default.
MAX_FRAME_SIZE = 64 << 20
DEFAULT_CACHE_BYTES = 32 << 20
SMALL_FRAME = 64 << 10  # frames up to this size take the short decompression path
SALVAGE_EXPANSION = 64  # recovery decompresses at most this much per byte of compressed tail
MAX_DICT_SIZE = 1 << 20


def is_compressed(prefix: bytes) -> bool:
    """True for a file that starts with a zstd frame or with our dictionary frame."""
    return prefix[:4] == ZSTD_MAGIC or prefix[:4] == _DICT_MAGIC


def dictionary_frame(dictionary: bytes) -> bytes:
    """The skippable frame that carries the dictionary at the start of the file."""
    return SKIPPABLE_HEADER.pack(DICT_FRAME_MAGIC, len(dictionary)) + dictionary


def read_dictionary(src: Any, size: int) -> bytes | None:
    """The dictionary stored in the file's first frame, or None."""
    head = SKIPPABLE_HEADER.size
    if size < head:
        return None
    magic, length = SKIPPABLE_HEADER.unpack(bytes(src[:head]))
    if magic != DICT_FRAME_MAGIC:
        return None
    if length > MAX_DICT_SIZE or head + length > size:
        raise FormatError(f"dictionary frame claims {length} bytes", 4)
    return bytes(src[head : head + length])


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

    compressed = True
    checks_content = True  # every frame's content checksum is checked as it is decompressed
    mapped = None  # the logical bytes exist only in decompressed frames

    @property
    def physical_end(self) -> int:
        """File bytes up to the last commit: to the end of its seek table."""
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
            if sums is not None and frame_checksum(frame) != sums[k]:
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
            magic = MAGIC_NUMBER.unpack_from(self.map, start)[0]
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


def open_zstd(
    fd: int, size: int, *, cache_bytes: int, max_frame_size: int
) -> tuple[ZstdSource, Header, Commit]:
    """Open a compressed container at its last commit; the descriptor is closed (the source
    keeps its own mapping)."""
    try:
        source = ZstdSource(fd, size, cache_bytes=cache_bytes, max_frame_size=max_frame_size)
    finally:
        os.close(fd)
    try:
        header, commit = open_container(source)
    except BaseException:
        source.close()
        raise
    return source, header, commit


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
        self._offsets: tuple[list[int], list[int]] = ([0], [0])  # frames' file, logical starts

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
        checksum = frame_checksum(frame)
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
        """Logical bytes already in frames (the writer reads old index segments to merge).

        Frame offsets are kept from call to call and extended by the frames written since
        (frames are only ever appended), so a read costs the frames it decompresses."""
        self.flush()
        coff, doff = self._offsets
        for k in range(len(coff) - 1, len(self.csizes)):
            coff.append(coff[-1] + self.csizes[k])
            doff.append(doff[-1] + self.dsizes[k])
        src = _FdSource(self.fd)
        out = bytearray()
        k = bisect.bisect_right(doff, offset) - 1
        while len(out) < n:
            # a one-frame table: decompress_frame checks frame k against these entries
            table = SeekTable(
                np.array(self.csizes[k : k + 1], np.int64),
                np.array(self.dsizes[k : k + 1], np.int64),
                np.array(self.checksums[k : k + 1], np.uint32),
                np.array(coff[k : k + 2], np.int64),
                np.array(doff[k : k + 2], np.int64),
                coff[k + 1],
                0,
            )
            data = decompress_frame(src, table, 0, dctx=self.dctx)
            start = offset + len(out) - doff[k]
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


def train_dictionary(records: Any, size: int = 64 << 10, alignment: int = 64) -> bytes:
    """Train a zstd dictionary on sample records (lists of values), for ``Writer(dictionary=)``.

    Small records compress poorly one frame at a time; a dictionary trained on a few
    hundred typical records recovers most of what whole-file compression would gain.
    """
    from .codec import encode_record
    from .fields import Fields

    checksum = checksum_function(version_flags(DEFAULT_VERSION))  # as a new file's records

    samples = []
    for record in records:
        values, _ = Fields().values(record)  # a dict record: its values, as a writer stores
        chunks, _, _ = encode_record(values, alignment, checksum)
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
        head = f.read(SKIPPABLE_HEADER.size)
        if not head.startswith(_DICT_MAGIC):
            return None
        size = os.fstat(f.fileno()).st_size
        return read_dictionary(head + f.read(min(MAX_DICT_SIZE, size - len(head))), size)


class ZstdFile:
    """An existing compressed container opened for appending.

    A crash leaves frames after the last seek table; the complete ones whose bytes are
    complete records are kept (their frames stay as they are), the rest goes to a side file.
    """

    def __init__(self, fd: int, size: int, path: str):
        source = ZstdSource(fd, size, cache_bytes=DEFAULT_CACHE_BYTES, map_tail=True)
        try:
            self.header, self.commit = open_container(source)
            if self.commit.end != source.size:
                raise FormatError("the last seek table does not end at a commit", size)
            self.dictionary = source.dictionary
            table = source.table
            if table.checksums is None:  # valid seekable, but its next table could not list them
                reason = "seek table has no checksums (Checksum_Flag 0): cannot append to it"
                raise FormatError(reason, table.table_offset)
            frames = [list(x) for x in table.entries_for_next_table()]
            self.found, self.keep, kept = self._salvage(source, table.end, size)
            for csize, dsize, checksum in kept:
                frames[0].append(csize)
                frames[1].append(dsize)
                frames[2].append(checksum)
            self.frames = frames
            self.logical_end = source.size + sum(d for _, d, _ in kept)
            side = None
            if size > self.keep:
                side = side_file(path, fd, self.keep, size)
            self.salvage = None
            if size > table.end:
                self.salvage = Salvage(
                    self.commit.record_count,
                    len(self.found),
                    size - table.end,
                    size - self.keep,
                    side,
                )
        finally:
            source.close()

    def sink(self, fd: int, *, level: int, frame_size: int) -> ZstdSink:
        """The sink that goes on after the kept frames, with the file's own dictionary."""
        return ZstdSink(
            fd,
            self.keep,
            self.logical_end,
            self.frames,
            dictionary=self.dictionary,
            level=level,
            frame_size=frame_size,
        )

    def _salvage(self, source: ZstdSource, start: int, size: int) -> tuple:
        # Decompressed tail bytes are held in memory: bounded by the reader's frame cap per
        # frame, and in all by SALVAGE_EXPANSION times the compressed tail plus one frame.
        # Frames past either bound are not salvaged (they go to the side file).
        frames, logical, pos = [], bytearray(), start
        room = MAX_FRAME_SIZE + SALVAGE_EXPANSION * (size - start)
        while pos < size:
            n = frame_extent(source.map, pos, size)
            if n is None:
                break
            data = decompress_tail_frame(source, pos, n, min(MAX_FRAME_SIZE, room))
            if data is None:
                break
            frames.append((n, len(data), frame_checksum(source.map, pos + n), pos + n))
            logical += data
            room -= len(data)
            pos += n
        base = source.size
        if not frames:
            return [], start, []

        def read(offset: int, n: int) -> memoryview:
            return memoryview(logical)[offset - base : offset - base + n]

        found, good_end = scan_tail(
            read,
            self.header,
            align_up(base, self.header.alignment),
            base + len(logical),
            logical,
            base,
        )
        if not found:  # frames of alignment padding alone are no records: nothing to keep
            return [], start, []
        kept, logical_end, keep = [], base, start
        for csize, dsize, checksum, physical_end in frames:
            if logical_end + dsize > good_end:
                break  # a frame holding anything but complete records is not kept
            kept.append((csize, dsize, checksum))
            logical_end += dsize
            keep = physical_end
        found = [f for f in found if f[0] + FRAME_SIZE + f[1] <= logical_end]
        return found, keep, kept


def died_before_first_commit(fd: int, size: int) -> bytes | None:
    """For a compressed file whose writer died while creating it (its header frame is
    written, the first seek table is not): the file's dictionary (b"" if none). None for any
    other file: one with a seek table, or one that does not start with our header."""
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
        # Any valid table, whatever its frames' sizes: one over the cap is an error for
        # opening the file to raise, not a file to start afresh.
        if find_last_seek_table(data, size, max_frame_size=MAX_FRAME_DECOMPRESSED_SIZE):
            return None
        dictionary = read_dictionary(data, size)
        start = SKIPPABLE_HEADER.size + len(dictionary) if dictionary else 0
        length = frame_extent(data, start, size)
        if length is None:
            return None
        dict_data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        try:
            reader = new_decompressor(dict_data).stream_reader(data[start : start + length])
            head = reader.read(len(MAGIC))  # bounded, whatever the frame claims
        except zstandard.ZstdError:
            return None
    return (dictionary or b"") if head == MAGIC else None


def decompress_tail_frame(source: ZstdSource, pos: int, n: int, cap: int) -> Any:
    """The bytes of the complete zstd frame at ``pos`` (``n`` bytes; no seek table lists it),
    or None if it declares more than ``cap`` bytes or does not decompress to what it
    declares: checked before any allocation (its header, its blocks' capacity)."""
    frame = source.map[pos : pos + n]
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
    except zstandard.ZstdError:
        return None
    if declared > cap:  # frame_extent already refused an unknown content size
        return None
    table = table_from_lists([n], [declared], [frame_checksum(frame, n)])
    try:
        return memoryview(decompress_frame(frame, table, 0, dctx=source.dctx))
    except FormatError:
        return None
