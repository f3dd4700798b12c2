"""Reader: random access to committed records, tensors as zero-copy views."""

from __future__ import annotations

import bisect
import json
import mmap
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from .codec import compile_layout, decode_payload
from .container import (
    ENTRY,
    ENTRY_DTYPE,
    ENTRY_SIZE,
    FRAME_SIZE,
    HEADER_FIXED,
    Commit,
    Header,
    check_frame,
    crc32,
    find_last_commit,
    parse_footer_from,
    parse_header,
)
from .errors import FormatError
from .frames import DEFAULT_CACHE_BYTES, MAX_FRAME_SIZE, ZstdSource, is_compressed

Index = Union[int, slice, Sequence[int], np.ndarray]
MAX_LAYOUTS = 1024  # record structures remembered per reader (bounded: lengths may all differ)
SCAN_CHUNK = 512  # index entries a scan decodes at a time
OPEN_ATTEMPTS = 5  # opens retried while a writer changes the file's tail underneath


def aligned_buffer(size: int, alignment: int) -> np.ndarray:
    """A writable uint8 buffer of ``size`` bytes whose first byte is ``alignment``-aligned."""
    raw = np.empty(size + alignment, np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip : skip + size]


class _MmapSource:
    """The file through a private copy-on-write mapping.

    ACCESS_COPY pages are writable (so torch.from_numpy takes views without a warning) but
    writes stay private to this process and never reach the file.
    """

    def __init__(self, fd: int, size: int):
        self.size = size
        self.map = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        # Reads slice this one view: each np.frombuffer / slice of the mmap itself would
        # first make a memoryview of it (half the cost of a small tensor view).
        self.view = memoryview(self.map)

    def read(self, offset: int, n: int) -> memoryview:
        return self.view[offset : offset + n]

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        """(buffer, position) such that buffer[position:position + n] is file[offset:...]."""
        return self.view, offset

    def rfind(self, needle: bytes, start: int, end: int) -> int:
        return self.map.rfind(needle, start, end)

    def close(self) -> None:
        try:
            self.view.release()  # tensors hold views of their own
            self.map.close()
        except BufferError:
            pass  # views into it are still alive; the mapping goes when the last one does


class _PreadSource:
    """The file through os.pread: for filesystems where mmap is slow (NFS, FUSE)."""

    CHUNK = 1 << 20

    def __init__(self, fd: int, size: int, alignment: int = 64):
        self.fd = fd
        self.size = size
        self.alignment = alignment

    def read(self, offset: int, n: int) -> memoryview:
        buf = aligned_buffer(n, self.alignment)
        view = memoryview(buf)
        done = 0
        while done < n:
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got <= 0:
                raise FormatError(f"file ends early: wanted {n} bytes", offset + done)
            done += got
        return view

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        return self.read(offset, n), 0

    def rfind(self, needle: bytes, start: int, end: int) -> int:
        # Backwards over chunks that overlap by len(needle) - 1 bytes so no match is cut.
        while end - start >= len(needle):
            lo = max(start, end - self.CHUNK)
            hit = bytes(self.read(lo, end - lo)).rfind(needle)
            if hit >= 0:
                return lo + hit
            end = lo + len(needle) - 1
            if lo == start:
                break
        return -1

    def close(self) -> None:
        pass


@dataclass
class VerifyReport:
    """What ``Dataset.verify`` found; ``ok`` is True when nothing is wrong."""

    records: int = 0
    bytes_checked: int = 0
    bad_records: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    uncommitted_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.bad_records and not self.problems


class Dataset:
    """Read-only view of a container's last commit. Build it with ``evalue_store.open``.

    Pickling sends only the path and options; the copy reopens lazily on first use, which is
    what DataLoader workers need. ``refresh()`` picks up commits made since opening.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        backend: str = "mmap",
        verify: bool = True,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_record_bytes: int | None = None,
    ):
        if backend not in ("mmap", "pread"):
            raise ValueError(f"backend must be 'mmap' or 'pread', not {backend!r}")
        self.path = os.fspath(path)
        self.backend = backend
        self.verify_reads = verify
        self.cache_bytes = cache_bytes
        self.max_frame_size = max_frame_size
        self.max_record_bytes = max_record_bytes
        self._source: Any = None
        self._load()

    # ------------------------------------------------------------------ opening

    def _load(self) -> None:
        """Open the file at its last commit. A writer may be cutting off an uncommitted tail
        (abort, recovery) while the tail is searched: a FormatError from a file whose size
        changed meanwhile is that race, and the open is tried again."""
        for attempt in range(OPEN_ATTEMPTS):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                stat = os.fstat(fd)
            except BaseException:
                os.close(fd)
                raise
            try:
                return self._load_from(fd, stat.st_size)  # closes fd
            except FormatError:
                now = os.stat(self.path)
                same = (now.st_size, now.st_mtime_ns, now.st_ino) == (
                    stat.st_size,
                    stat.st_mtime_ns,
                    stat.st_ino,
                )
                if same or attempt + 1 == OPEN_ATTEMPTS:
                    raise

    def _load_from(self, fd: int, size: int) -> None:
        try:
            if is_compressed(os.pread(fd, 8, 0)):
                owned, fd = fd, -1
                self._load_compressed(owned, size)  # closes the descriptor itself
                return
            probe = _PreadSource(fd, size)
            header = parse_header(probe.read, size)
            commit = find_last_commit(probe.read, size, header, probe.rfind)
            if self.backend == "mmap":
                source: Any = _MmapSource(fd, commit.end)
                owned, fd = fd, -1  # forgotten first: an interrupt after close(2) never
                os.close(owned)  # leads to a second close of a number reused meanwhile
            else:
                source = _PreadSource(fd, commit.end, header.alignment)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        self._install(source, header, commit, size - commit.end)

    def _load_compressed(self, fd: int, size: int) -> None:
        try:
            source = ZstdSource(
                fd, size, cache_bytes=self.cache_bytes, max_frame_size=self.max_frame_size
            )
        finally:
            os.close(fd)
        try:
            header = parse_header(source.read, source.size)
            source.set_alignment(header.alignment)
            commit = find_last_commit(source.read, source.size, header, source.rfind)
        except BaseException:
            source.close()
            raise
        self._install(source, header, commit, size - source.committed_physical_end)

    @property
    def compressed(self) -> bool:
        """True when the file is stored as zstd frames (docs/FRAMES.md)."""
        self._ensure_open()
        return isinstance(self._source, ZstdSource)

    def _install(self, source: Any, header: Header, commit: Commit, tail: int) -> None:
        self._close_source()
        self._source = source
        self.header = header
        self.commit = commit
        self.uncommitted_bytes = tail
        # A compressed record was checked by its frame's content checksum when the frame
        # was decompressed; checking its CRC on every read would check the same bytes again.
        self._crc_on_read = self.verify_reads and not isinstance(source, ZstdSource)
        self._starts = []
        total = 0
        for seg in commit.segments:
            self._starts.append(total)
            total += seg.count
        self._segments = commit.segments
        self._len = commit.record_count
        self._metadata: dict | None = None
        self._layouts: dict[int, Any] = {}  # payload length -> Layout (or None: not compiled)
        self._lengths_seen: set[int] = set()

    def _close_source(self) -> None:
        if self._source is not None:
            self._source.close()
            if isinstance(self._source, _PreadSource):
                os.close(self._source.fd)
            self._source = None

    def refresh(self) -> bool:
        """Pick up commits made since opening; returns True if the dataset changed."""
        self._ensure_open()
        old = self.commit
        self._load()
        return self.commit.end != old.end

    def close(self) -> None:
        """Release the file. Tensor views handed out earlier stay valid."""
        self._close_source()

    def _ensure_open(self) -> None:
        if self._source is None:
            if getattr(self, "_closed_by_pickle", False):
                self._closed_by_pickle = False
                self._load()
            else:
                raise ValueError(f"{self.path}: dataset is closed")

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {
            "path": self.path,
            "backend": self.backend,
            "verify": self.verify_reads,
            "cache_bytes": self.cache_bytes,
            "max_frame_size": self.max_frame_size,
            "max_record_bytes": self.max_record_bytes,
        }

    def __setstate__(self, state: dict) -> None:
        # Reopen lazily: a DataLoader pickles the dataset into every worker before use.
        self.path = state["path"]
        self.backend = state["backend"]
        self.verify_reads = state["verify"]
        self.cache_bytes = state["cache_bytes"]
        self.max_frame_size = state["max_frame_size"]
        self.max_record_bytes = state["max_record_bytes"]
        self._source = None
        self._closed_by_pickle = True
        self._len = None

    # ------------------------------------------------------------------ properties

    @property
    def metadata(self) -> dict:
        """The user metadata (a dict; empty if the writer gave none)."""
        self._ensure_open()
        if self._metadata is None:
            c = self.commit
            if not c.metadata_length:
                self._metadata = {}
            else:
                raw = bytes(self._source.read(c.metadata_offset, c.metadata_length))
                if crc32(raw) != c.metadata_crc:
                    raise FormatError("metadata checksum mismatch", c.metadata_offset, self.path)
                try:
                    value = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                    # RecursionError: hostile nesting ([[[[...) deeper than json can parse
                    raise FormatError(f"metadata is not JSON: {exc}", c.metadata_offset) from None
                if not isinstance(value, dict):
                    raise FormatError("metadata is not a JSON object", c.metadata_offset, self.path)
                self._metadata = value
        return self._metadata

    @property
    def logical_size(self) -> int:
        """Bytes of the container up to its last commit (of the decompressed stream, if
        the file is compressed)."""
        self._ensure_open()
        return self.commit.end

    def logical_chunks(self, size: int = 1 << 20) -> Iterator[memoryview]:
        """The container's bytes up to its last commit, in order: for a compressed file,
        exactly what ``zstd -d`` writes."""
        self._ensure_open()
        if isinstance(self._source, ZstdSource):
            yield from self._source.chunks()
            return
        for start in range(0, self.commit.end, size):
            yield self._source.read(start, min(size, self.commit.end - start))

    @property
    def alignment(self) -> int:
        self._ensure_open()
        return self.header.alignment

    def __len__(self) -> int:
        if self._len is None:
            self._ensure_open()
        return self._len

    # ------------------------------------------------------------------ index

    def _entry(self, i: int) -> tuple[int, int, int]:
        k = 0 if len(self._starts) == 1 else bisect.bisect_right(self._starts, i) - 1
        seg = self._segments[k]
        at = seg.offset + (i - self._starts[k]) * ENTRY_SIZE
        buf, pos = self._source.frame(at, ENTRY_SIZE)
        offset, length, crc, reserved = ENTRY.unpack_from(buf, pos)
        if reserved:
            raise FormatError(f"index entry of record {i} has reserved bits set", at, self.path)
        return offset, length, crc

    def entries(self) -> np.ndarray:
        """The whole index as one structured array (offset, length, crc, reserved).

        Each segment is a zero-copy view; with several segments they are concatenated.
        """
        self._ensure_open()
        parts = [self._segment_array(seg) for seg in self._segments]
        if not parts:
            return np.zeros(0, ENTRY_DTYPE)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _segment_array(self, seg: Any) -> np.ndarray:
        raw = self._source.read(seg.offset, seg.count * ENTRY_SIZE)
        return np.frombuffer(raw, ENTRY_DTYPE, seg.count)

    def _normalize(self, i: int) -> int:
        n = self._len
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"record {i} out of range for {n} records")
        return j

    # ------------------------------------------------------------------ records

    def _record(self, i: int) -> list:
        return self._read(i, *self._entry(i))

    def _check_entry(self, i: int, offset: int, length: int) -> None:
        if offset % self.header.alignment or offset < self.header.data_start:
            raise FormatError(f"record {i} at bad offset {offset}", offset, self.path)
        if length > self.commit.end - offset - FRAME_SIZE:
            raise FormatError(f"record {i} runs past the committed end", offset, self.path)
        if self.max_record_bytes is not None and length > self.max_record_bytes:
            reason = f"record {i} is {length} bytes, over max_record_bytes={self.max_record_bytes}"
            raise FormatError(reason, offset, self.path)

    def raw(self, index: int) -> memoryview:
        """Record ``index`` as stored: its payload bytes (docs/FORMAT.md section 4), as a
        read-only view valid while the dataset is open.

        Checked: the frame header must match the index entry and, with ``verify``, the
        checksum the payload (the values are not decoded; ``Writer.append_raw`` checks
        them). ``Writer.append_raw(ds.raw(i), ds.alignment)`` copies a record exactly,
        which decoding and re-encoding cannot always do.
        """
        self._ensure_open()
        i = self._normalize(int(index))
        offset, length, crc = self._entry(i)
        self._check_entry(i, offset, length)
        buf, pos = self._source.frame(offset, FRAME_SIZE + length)
        try:
            check_frame(bytes(buf[pos : pos + FRAME_SIZE]), offset, self.commit.end, length, crc)
            payload = memoryview(buf).cast("B")[pos + FRAME_SIZE : pos + FRAME_SIZE + length]
            if self._crc_on_read and zlib.crc32(payload) != crc:
                raise FormatError("record checksum mismatch", offset)
        except FormatError as exc:
            raise FormatError(f"record {i}: {exc.reason}", exc.offset, self.path) from None
        return payload.toreadonly()

    def _read(self, i: int, offset: int, length: int, crc: int) -> list:
        """Record ``i`` given its index entry."""
        align = self.header.alignment
        limit = self.max_record_bytes
        if (
            offset % align
            or offset < self.header.data_start
            or length > self.commit.end - offset - FRAME_SIZE
            or (limit is not None and length > limit)
        ):
            self._check_entry(i, offset, length)  # raises, saying which rule failed
        buf, pos = self._source.frame(offset, FRAME_SIZE + length)
        try:
            if self._crc_on_read:
                payload = memoryview(buf)[pos + FRAME_SIZE : pos + FRAME_SIZE + length]
                if zlib.crc32(payload) != crc:  # say first if the frame disagrees with the index
                    head = bytes(buf[pos : pos + FRAME_SIZE])
                    check_frame(head, offset, self.commit.end, length, crc)
                    raise FormatError("record checksum mismatch", offset)
            layout = self._layouts.get(length)
            if layout is not None:
                values = layout.decode(buf, pos, crc)  # checks the frame header too
                if values is not None:
                    return values
            check_frame(bytes(buf[pos : pos + FRAME_SIZE]), offset, self.commit.end, length, crc)
            try:
                values = decode_payload(buf, pos, length, align)
            except FormatError as exc:  # its offsets are positions in buf: make them the file's
                if exc.offset is not None:
                    exc.offset += offset - pos
                raise
        except FormatError as exc:
            raise FormatError(f"record {i}: {exc.reason}", exc.offset, self.path) from None
        self._learn_layout(buf, pos, length)
        return values

    def _learn_layout(self, buf: Any, pos: int, length: int) -> None:
        """Compile a Layout for a record length seen twice (a repeating structure)."""
        if length in self._layouts or length not in self._lengths_seen:
            if len(self._lengths_seen) > MAX_LAYOUTS:
                self._lengths_seen.clear()
            self._lengths_seen.add(length)
            return
        if len(self._layouts) > MAX_LAYOUTS:
            self._layouts.clear()
        self._layouts[length] = compile_layout(buf, pos, length, self.header.alignment)

    def __getitem__(self, index: Index) -> Any:
        self._ensure_open()
        if isinstance(index, (int, np.integer)):
            return self._record(self._normalize(int(index)))
        if isinstance(index, slice):
            return [self._record(i) for i in range(*index.indices(self._len))]
        return self.get_many(index)

    def get_many(self, indices: Sequence[int] | np.ndarray) -> list[list]:
        """Records for a list of indices, in the order given.

        They are read in file order, so a compressed file decompresses each frame once
        per batch and a plain one reads forward.
        """
        self._ensure_open()
        wanted = sorted((self._normalize(int(i)), k) for k, i in enumerate(indices))
        entries = [self._entry(i) for i, _ in wanted]  # all index lookups, then all records
        result: list = [None] * len(wanted)
        for (i, k), entry in zip(wanted, entries):
            result[k] = self._read(i, *entry)
        return result

    def __iter__(self) -> Iterator[list]:
        self._ensure_open()
        try:
            if isinstance(self._source, _MmapSource):
                yield from self._scan_mapped()
            else:
                yield from self._scan_by_chunks()
        except AttributeError:
            if self._source is None:  # closed during the scan: records handed out stay valid
                raise ValueError(f"{self.path}: dataset is closed") from None
            raise

    def _scan_mapped(self) -> Iterator[list]:
        first = 0
        for seg in self._segments:
            entries = self._segment_array(seg)
            for lo in range(0, seg.count, SCAN_CHUNK):
                chunk = entries[lo : lo + SCAN_CHUNK]
                # Runs: records of one payload length, each frame right after the one before
                # (as a writer appends them), so their frames are ``step`` bytes apart.
                lengths, offsets = chunk["length"], chunk["offset"]
                step = lengths + (FRAME_SIZE + self.header.alignment - 1)
                step -= step % self.header.alignment
                joined = (lengths[1:] == lengths[:-1]) & (offsets[1:] == offsets[:-1] + step[:-1])
                bounds = [0, *(np.flatnonzero(~joined) + 1).tolist(), len(chunk)]
                for a, b in zip(bounds[:-1], bounds[1:]):
                    yield from self._scan_run(first + lo + a, chunk[a:b])
            first += seg.count

    def _scan_by_chunks(self) -> Iterator[list]:
        """Every record in order, for a compressed or pread source: index entries are read
        SCAN_CHUNK at a time instead of one lookup per record. A chunk that cannot be read,
        or an entry with reserved bits, is read record by record by ``_record``, so that
        errors name their record and the records before them are still yielded."""
        first = 0
        for seg in self._segments:
            for lo in range(0, seg.count, SCAN_CHUNK):
                count = min(SCAN_CHUNK, seg.count - lo)
                try:
                    raw = self._source.read(seg.offset + lo * ENTRY_SIZE, count * ENTRY_SIZE)
                except FormatError:
                    for i in range(first + lo, first + lo + count):
                        yield self._record(i)
                    continue
                for i, (offset, length, crc, reserved) in enumerate(
                    ENTRY.iter_unpack(raw), first + lo
                ):
                    yield self._record(i) if reserved else self._read(i, offset, length, crc)
            first += seg.count

    def _scan_run(self, first: int, entries: np.ndarray) -> Iterator[list]:
        """Records ``first``, ``first + 1``... of a run: the same payload length, and frames
        laid end to end from the first entry's offset (unless the index is damaged: any
        record the run decoder cannot vouch for is read by ``_record``, which reports it)."""
        offset, length, _, _ = entries[0].tolist()
        count = len(entries)
        k = 0
        while k < count and length not in self._layouts:  # how a layout is learned
            yield self._record(first + k)
            k += 1
        if k == count:
            return
        layout = self._layouts.get(length)
        align = self.header.alignment
        stride = (FRAME_SIZE + length + align - 1) // align * align
        start = offset + k * stride
        if (
            layout is None
            or entries["reserved"].any()
            or offset % align
            or offset < self.header.data_start
            or start + (count - 1 - k) * stride + FRAME_SIZE + length > self.commit.end
        ):
            for j in range(k, count):
                yield self._record(first + j)
            return
        buf = self._source.view
        crcs = entries["crc"][k:]
        records = layout.decode_run(buf, start, stride, count - k, crcs)
        if self._crc_on_read:
            at = start + FRAME_SIZE
            for j, crc in enumerate(crcs.tolist()):
                if zlib.crc32(buf[at : at + length]) != crc:
                    records[j] = None
                at += stride
        for j, values in enumerate(records, k):
            yield values if values is not None else self._record(first + j)

    # ------------------------------------------------------------------ checking

    def verify(self, progress: Any = None) -> VerifyReport:
        """Check every checksum and every record's structure; never raises for bad data.

        ``progress`` (optional) is called with the number of records checked so far.
        """
        self._ensure_open()
        report = VerifyReport(records=self._len, uncommitted_bytes=self.uncommitted_bytes)
        try:
            _ = self.metadata  # parses and checks it
        except FormatError as exc:
            report.problems.append(str(exc))
        self._verify_index(report)
        saved, self._crc_on_read = self._crc_on_read, True  # verify checks every record CRC
        try:
            for i in range(self._len):
                try:
                    entry = self._entry(i)
                    self._read(i, *entry)
                    report.bytes_checked += FRAME_SIZE + entry[1]
                except FormatError as exc:
                    report.bad_records.append((i, exc.reason))
                if progress is not None and (i & 1023) == 1023:
                    progress(i + 1)
        finally:
            self._crc_on_read = saved
        commits = self._verify_history(report)
        if report.ok:  # gaps are only meaningful between blocks known to be sound
            self._verify_padding(report, commits)
        if isinstance(self._source, ZstdSource):
            report.problems += self._source.verify_frames()
        if self.uncommitted_bytes:
            report.problems.append(
                f"{self.uncommitted_bytes} bytes after the last commit (a writer crashed or is "
                "still writing); recovery salvages complete records from them"
            )
        return report

    def _verify_index(self, report: VerifyReport) -> None:
        """Segment checksums, and record frames in increasing, non-overlapping order."""
        previous_end = self.header.data_start
        base = 0
        for k, seg in enumerate(self._segments):
            try:
                raw = self._source.read(seg.offset, seg.count * ENTRY_SIZE)
            except FormatError as exc:
                report.problems.append(f"index segment {k} unreadable: {exc}")
                base += seg.count
                continue
            if crc32(raw) != seg.crc:
                report.problems.append(f"index segment {k} at {seg.offset}: checksum mismatch")
            entries = np.frombuffer(raw, ENTRY_DTYPE, seg.count)
            starts = entries["offset"].astype(np.int64)
            ends = starts + FRAME_SIZE + entries["length"].astype(np.int64)
            overlaps = np.flatnonzero(starts[1:] < ends[:-1]) + 1
            if starts[0] < previous_end:
                overlaps = np.concatenate([[0], overlaps])
            for j in overlaps[:100]:  # an index problem: the read of each record says which is bad
                j = base + int(j)
                report.problems.append(f"index: records {j - 1} and {j} overlap in the file")
            previous_end = int(ends[-1])
            base += seg.count

    def _verify_history(self, report: VerifyReport) -> list[Commit]:
        """Walk the chain of earlier footers and check them and the index segments they name;
        returns the commits walked, the last one first."""
        checked = {seg.offset for seg in self._segments}  # segments' and metadata offsets
        checked.add(self.commit.metadata_offset)
        commit = self.commit
        commits = [commit]
        while commit.prev_footer:
            try:
                older = parse_footer_from(
                    self._source.read, commit.prev_footer, commit.footer_offset, self.header
                )
            except FormatError:
                older = None
            if older is None or older.number != commit.number - 1:
                report.problems.append(
                    f"footer of commit {commit.number - 1} at {commit.prev_footer} is damaged"
                )
                return commits
            for offset, length, crc, what in _checksummed_blocks(older):
                if offset not in checked:
                    checked.add(offset)
                    if not self._block_intact(offset, length, crc):
                        report.problems.append(
                            f"{what} at {offset} of commit {older.number} is damaged"
                        )
            commit = older
            commits.append(commit)
        return commits

    def _block_intact(self, offset: int, length: int, crc: int) -> bool:
        try:
            return crc32(self._source.read(offset, length)) == crc
        except FormatError:
            return False

    def _verify_padding(self, report: VerifyReport, commits: list[Commit]) -> None:
        """Every byte between blocks must be zero (docs/FORMAT.md section 2). No checksum
        covers these gaps and no read looks at them, so this is the only check they get."""
        header_length = HEADER_FIXED.unpack(bytes(self._source.read(0, HEADER_FIXED.size)))[5]
        blocks = [(0, header_length)]
        for commit in commits:
            blocks.append((commit.footer_offset, commit.end))
            blocks += [(offset, offset + n) for offset, n, _, _ in _checksummed_blocks(commit)]
        fixed = np.array(blocks, np.int64)
        entries = self.entries()
        records = entries["offset"].astype(np.int64)
        starts = np.concatenate([fixed[:, 0], records])
        ends = np.concatenate(
            [fixed[:, 1], records + FRAME_SIZE + entries["length"].astype(np.int64)]
        )
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], np.maximum.accumulate(ends[order])
        gap_starts, gap_ends = ends[:-1], starts[1:]
        keep = gap_ends > gap_starts
        bad = []
        for start, end in zip(gap_starts[keep].tolist(), gap_ends[keep].tolist()):
            if bytes(self._source.read(start, end - start)).count(0) != end - start:
                bad.append(start)
        if bad:
            where = ", ".join(str(b) for b in bad[:10]) + (" ..." if len(bad) > 10 else "")
            report.problems.append(
                f"non-zero bytes in the padding between blocks at {len(bad)} places "
                f"(offsets {where}): no read uses them, but the file was changed there"
            )

    def __repr__(self) -> str:
        state = "closed" if self._source is None else f"{self._len} records"
        return f"<evalue_store.Dataset {self.path!r} {state}>"


def _checksummed_blocks(commit: Commit) -> list[tuple[int, int, int, str]]:
    """(offset, length, crc32, name) of the index segments and metadata block a footer names."""
    blocks = [
        (seg.offset, seg.count * ENTRY_SIZE, seg.crc, "index segment") for seg in commit.segments
    ]
    if commit.metadata_length:
        blocks.append(
            (commit.metadata_offset, commit.metadata_length, commit.metadata_crc, "metadata block")
        )
    return blocks


def open_dataset(
    path: str | os.PathLike,
    *,
    backend: str = "mmap",
    verify: bool = True,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    max_frame_size: int = MAX_FRAME_SIZE,
    max_record_bytes: int | None = None,
) -> Dataset:
    """Open a container for reading at its last commit.

    ``backend``: "mmap" (default; zero-copy views) or "pread" (plain reads, for network
    filesystems). ``verify``: check each record's CRC32 when it is read (default True);
    False skips that check so that big tensors are handed out without touching their pages.
    Compressed files are recognized from their bytes; ``cache_bytes`` bounds the cache of
    decompressed frames. (They are always read through a mapping of the compressed bytes:
    ``backend`` applies to plain files only.)

    Limits for untrusted files: ``max_frame_size`` refuses, at open, a compressed file with a
    frame that decompresses to more (the default is the largest frame a Writer makes);
    ``max_record_bytes`` makes reading a bigger record raise FormatError instead of mapping,
    or for a compressed file decompressing, that much (``verify()`` lists such records as
    bad records, with that reason).
    """
    return Dataset(
        path,
        backend=backend,
        verify=verify,
        cache_bytes=cache_bytes,
        max_frame_size=max_frame_size,
        max_record_bytes=max_record_bytes,
    )
