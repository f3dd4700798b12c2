"""Layout 1 of the zstd frame layer: seekable-format files (docs/FRAMES.md §12).

Files written before the indexed layout end every commit with a seek table listing every
frame so far. They stay readable, verifiable and appendable: an append goes on in layout 1
(so that every earlier reader still opens the file), and ``evalue-store compress`` rewrites
one in layout 2. The file is read through a byte reader (``byteio``), never mapped.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Any

import numpy as np
import zstandard

from ..buffers import read_only
from ..byteio import FdReader
from ..container import ENTRY, MAGIC, Commit, Header, open_container, parse_footer_at
from ..errors import (
    COMMIT,
    DICTIONARY,
    LIMIT,
    OUT_OF_BOUNDS,
    SEEK_TABLE,
    UNSUPPORTED,
    ZSTD_FRAME,
    FormatError,
)
from .plain import pwrite_all
from .seekable import (
    EMPTY_CHECKSUM,
    MAX_FRAME_DECOMPRESSED_SIZE,
    SEEK_TABLE_SKIPPABLE_MAGIC,
    SeekTable,
    decompress_frame,
    encode_seek_table,
    find_last_seek_table,
    read_at,
    read_seek_table,
)
from .zframe import (
    MAGIC_NUMBER,
    SKIPPABLE_HEADER,
    FrameCutter,
    FrameError,
    LogicalReads,
    aligned_bytes,
    aligned_empty,
    check_frame,
    decompress_small,
    frame_checksum,
    frame_extent,
    new_compressor,
    new_decompressor,
)
from .zsalvage import salvage_frames, tail_salvage

DICT_FRAME_MAGIC = 0x184D2A5D  # skippable frame holding the zstd dictionary (first frame)
DICT_MAGIC = SKIPPABLE_HEADER.pack(DICT_FRAME_MAGIC, 0)[:4]  # its magic's bytes
MAX_FRAME_SIZE = 64 << 20
MAX_DICT_SIZE = 1 << 20
SMALL_FRAME = 64 << 10  # frames up to this size take the short decompression path


def read_dictionary(reader: Any, size: int) -> bytes | None:
    """The dictionary stored in a layout-1 file's first frame (a byte reader or a buffer of
    ``size`` bytes), or None."""
    head = SKIPPABLE_HEADER.size
    if size < head:
        return None
    magic, length = SKIPPABLE_HEADER.unpack(bytes(read_at(reader, 0, head)))
    if magic != DICT_FRAME_MAGIC:
        return None
    if length > MAX_DICT_SIZE or head + length > size:
        raise FormatError(f"dictionary frame claims {length} bytes", 4, code=LIMIT)
    return bytes(read_at(reader, head, length))


def last_seek_table(reader: Any, size: int, max_frame_size: int) -> SeekTable:
    """The file's last seek table, or if that one is damaged (a torn tail), the last valid
    earlier one: the previous commit. A last table that is valid but lists a frame over
    ``max_frame_size`` is an error, not a torn tail to fall back from."""
    try:
        return read_seek_table(reader, size, max_frame_size=max_frame_size)
    except FormatError as exc:
        try:
            read_seek_table(reader, size, max_frame_size=MAX_FRAME_DECOMPRESSED_SIZE)
        except FormatError:
            pass
        else:
            reason = f"{exc.reason} (open with a larger max_frame_size to read it)"
            raise FormatError(reason, exc.offset, code=exc.code) from None
    # The last valid table whatever its frames' sizes: the commit to fall back to. Skipping
    # tables over the cap instead would silently open an even older commit.
    found = find_last_seek_table(reader, size, max_frame_size=MAX_FRAME_DECOMPRESSED_SIZE)
    if found is None:
        raise FormatError("compressed file holds no valid seek table", size, code=SEEK_TABLE)
    table = found[0]
    sizes = table.decompressed_sizes
    if len(sizes) and int(sizes.max()) > max_frame_size:
        k = int(sizes.argmax())
        raise FormatError(
            f"frame {k} decompresses to {int(sizes[k])} bytes, over the reader cap "
            f"{max_frame_size} (open with a larger max_frame_size to read it)",
            int(table.compressed_offsets[k]),
            code=LIMIT,
        )
    return table


class ZstdSource(LogicalReads):
    """Random access to the logical bytes of a layout-1 file, through a byte reader.

    Decompressed frames are kept in a small LRU cache (``cache_bytes``), so neighbouring
    reads and sequential scans decompress each frame once. Buffers are placed so that a
    logical offset that is a multiple of the alignment is an aligned address.
    """

    def __init__(self, reader: Any, *, cache_bytes: int, max_frame_size: int = MAX_FRAME_SIZE):
        self.reader = reader
        self.table = last_seek_table(reader, reader.size, max_frame_size)
        self.dictionary = read_dictionary(reader, self.table.end)
        try:
            self._decode_with(self.dictionary)
        except zstandard.ZstdError as exc:
            raise FormatError(
                f"dictionary frame holds no usable dictionary: {exc}", 8, code=DICTIONARY
            ) from None
        self.size = self.table.logical_size
        self.alignment = 64
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[int, memoryview] = OrderedDict()
        self._cached = 0
        # A random read does a few lookups in the table: memoryviews of its arrays give
        # Python ints (indexing a numpy array makes a numpy scalar, several times slower).
        table = self.table
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
        buf = read_only(self._decompress(k))  # later reads of the frame share it
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
        and checksum, and the block walk must pass (FRAMES.md §3 rule 3: libzstd versions
        differ on blocks over Block_Maximum_Size); libzstd then decompresses the whole
        frame, checking content size and checksum.
        """
        size = self._dsizes[k]
        if not 0 < size <= SMALL_FRAME:
            return memoryview(
                decompress_frame(
                    self.reader, self.table, k, dctx=self.dctx, alignment=self.alignment
                )
            )
        start = self._coffsets[k]
        frame = read_at(self.reader, start, self._csizes[k])
        try:
            _, declared = check_frame(frame, size)
            if declared != size:
                raise FrameError("frame header disagrees with the seek table")
            sums = self._checksums  # None: a table without Checksum_Flag (valid, not ours)
            if sums is not None and frame_checksum(frame) != sums[k]:
                raise FrameError("frame checksum disagrees with the seek table")
            data = decompress_small(frame, size, self.dctx)
        except FrameError as exc:
            raise FormatError(f"frame {k}: {exc}", start, code=ZSTD_FRAME) from None
        # One allocation per frame: a buffer shared by several frames would keep evicted
        # frames' memory alive for as long as any of them is cached or viewed.
        out = aligned_bytes(size, self._doffsets[k], self.alignment)
        out[:] = data
        return out

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        """(buffer, position): logical bytes [offset, offset + n) are buffer[position:...]."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise FormatError(
                f"read of {n} bytes runs past the logical end {self.size}",
                offset,
                code=OUT_OF_BOUNDS,
            )
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
                decompress_frame(self.reader, self.table, k, out[pos - offset :], dctx=self.dctx)
            else:
                out[pos - offset : pos - offset + take] = self._frame(k)[pos - f_start :][:take]
            pos += take
        return read_only(out), 0  # read-only like the cached frames

    def entry(self, at: int, i: int) -> tuple[int, int, int, int]:
        return ENTRY.unpack_from(*self.frame(at, ENTRY.size))

    def chunks(self) -> Any:
        """Every frame's logical bytes in order (decompressing each once, uncached)."""
        for k in range(self.table.num_frames):
            if self.table.decompressed_sizes[k]:
                yield memoryview(decompress_frame(self.reader, self.table, k, dctx=self.dctx))

    def verify_frames(self) -> list[str]:
        """Decompress every frame (zstd checks each content checksum) and check that each
        earlier seek table agrees with the final one; returns the problems found."""
        problems = []
        table = self.table
        for k in range(table.num_frames):
            try:
                decompress_frame(self.reader, table, k, dctx=self.dctx)
            except FormatError as exc:
                problems.append(str(exc))
                continue
            start = int(table.compressed_offsets[k])
            magic = MAGIC_NUMBER.unpack_from(read_at(self.reader, start, 4))[0]
            if table.decompressed_sizes[k] == 0 and magic == SEEK_TABLE_SKIPPABLE_MAGIC:
                # An earlier seek table. Other skippable frames (the dictionary, a foreign
                # tool's) are opaque: decompress_frame has checked all there is to check.
                end = int(table.compressed_offsets[k + 1])
                try:
                    old = read_seek_table(self.reader, end)
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
                "the last seek table does not end with a container footer",
                self.table.table_offset,
                code=COMMIT,
            )
        return commit

    def close(self) -> None:
        self._cache.clear()
        self.reader.close()


class ZstdSink(FrameCutter):
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
        super().__init__(logical_pos, frame_size)
        self.fd = fd
        self.physical = physical_pos
        self.csizes, self.dsizes, self.checksums = (list(x) for x in frames)
        self.dictionary = dictionary
        dict_data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        self.cctx = new_compressor(level, dict_data)
        self.dctx = new_decompressor(dict_data)
        self.marker: tuple[int, bytes] | None = None  # as PlainSink.marker: the seek table
        self._offsets: tuple[list[int], list[int]] = ([0], [0])  # frames' file, logical starts

    def _emit(self) -> None:
        frame = self.cctx.compress(self.pending)
        checksum = frame_checksum(frame)
        pwrite_all(self.fd, memoryview(frame), self.physical)
        self.physical += len(frame)
        self.csizes.append(len(frame))
        self.dsizes.append(len(self.pending))
        self.checksums.append(checksum)
        self.pending = bytearray()

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
        src = FdReader(self.fd, self.physical)
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


class ZstdFile:
    """An existing compressed container opened for appending.

    A crash leaves frames after the last seek table; the complete ones whose bytes are
    complete records are kept (their frames stay as they are), the rest goes to a side file.
    """

    def __init__(self, fd: int, size: int, path: str):
        source = ZstdSource(FdReader(fd, size), cache_bytes=SMALL_FRAME)
        try:
            self.header, self.commit = open_container(source)
            if self.commit.end != source.size:
                raise FormatError("the last seek table does not end at a commit", size, code=COMMIT)
            self.dictionary = source.dictionary
            table = source.table
            if table.checksums is None:  # valid seekable, but its next table could not list them
                reason = "seek table has no checksums (Checksum_Flag 0): cannot append to it"
                raise FormatError(reason, table.table_offset, code=UNSUPPORTED)
            frames = [list(x) for x in table.entries_for_next_table()]
            self.found, self.keep, kept = salvage_frames(
                source.reader, source.dctx, self.header, table.end, source.size, MAX_FRAME_SIZE
            )
            for csize, dsize, checksum in kept:
                frames[0].append(csize)
                frames[1].append(dsize)
                frames[2].append(checksum)
            self.frames = frames
            self.logical_end = source.size + sum(d for _, d, _ in kept)
            self.salvage = tail_salvage(
                path, fd, self.commit.record_count, self.found, table.end, self.keep, size
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


def died_before_first_commit(reader: Any) -> bytes | None:
    """For a layout-1 file whose writer died while creating it (its header frame is written,
    the first seek table is not): the file's dictionary (b"" if none). None for any other
    file: one with a seek table, or one that does not start with the container header."""
    size = reader.size
    # Any valid table, whatever its frames' sizes: one over the cap is an error for opening
    # the file to raise, not a file to start afresh.
    if find_last_seek_table(reader, size, max_frame_size=MAX_FRAME_DECOMPRESSED_SIZE):
        return None
    dictionary = read_dictionary(reader, size)
    start = SKIPPABLE_HEADER.size + len(dictionary) if dictionary else 0
    return restart_dictionary(reader, start, dictionary)


def restart_dictionary(reader: Any, start: int, dictionary: bytes | None) -> bytes | None:
    """``dictionary`` (b"" if none) if the complete zstd frame at ``start`` begins with the
    container magic: a file whose writer died before its first commit. Else None."""
    head = reader.pread(start, min(reader.size - start, MAX_FRAME_SIZE + (1 << 20)))
    length = frame_extent(head)
    if length is None:
        return None
    dict_data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
    try:
        stream = new_decompressor(dict_data).stream_reader(bytes(head[:length]))
        first = stream.read(len(MAGIC))  # bounded, whatever the frame claims
    except zstandard.ZstdError:
        return None
    return (dictionary or b"") if first == MAGIC else None
