"""Verification: every checksum, every record, every byte between blocks (docs/FORMAT.md,
"Verification"), in memory bounded whatever the file claims, reported rather than raised."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import bounded
from ..bounded import SHADOWED
from ..container import ENTRY_DTYPE, ENTRY_SIZE, FRAME_SIZE, Commit, parse_footer_from
from ..errors import INDEX, ZSTD_FRAME, FormatError

MAX_LISTED = 1000  # bad records verify lists one by one (it counts the others)
SPAN = 1 << 20  # logical bytes of a compressed file decompressed at a time, in file order


@dataclass
class VerifyReport:
    """What ``Dataset.verify`` found; ``ok`` is True when nothing is wrong. ``bad_records``
    lists the first MAX_LISTED bad records; ``problems`` counts any more."""

    records: int = 0
    bytes_checked: int = 0
    bad_records: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    uncommitted_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.bad_records and not self.problems


def verify_dataset(ds: Any, progress: Any = None) -> VerifyReport:
    """Check every checksum and every record's structure of an open dataset; never
    raises for bad data. ``progress`` is called with the number of records checked."""
    report = VerifyReport(records=ds._len, uncommitted_bytes=ds.uncommitted_bytes)
    try:
        _ = ds.metadata  # parses and checks it
    except FormatError as exc:
        report.problems.append(str(exc))
    index_at = len(report.problems)  # where the index's own problems go (found below)
    commits = _history(ds, report)  # first: the padding check needs every commit's blocks
    source = ds._source
    frame, read = source.frame, source.read
    if source.compressed:  # records and padding read in one pass in file order
        source.track_checks()  # so that its frame pass skips the frames this pass checks
        in_order = InOrder(source)
        frame, read = in_order.frame, in_order.read
    mapped = None if source.mapped is None else np.frombuffer(source.mapped, np.uint8)
    layout = bounded.Layout(_blocks(ds, commits), read, mapped)
    saved, ds._crc_on_read = ds._crc_on_read, True  # verify checks every record CRC
    reach = unlisted = 0
    index_problems: list[str] = []
    try:
        for first, count, piece in _pieces(ds, index_problems):
            if isinstance(piece, FormatError):  # (padding is then not reported: not ok)
                bad = _by_record(ds, report, first, count, piece)
            else:
                layout.add_records(piece)
                if source.mapped is not None:
                    bad, reach = _mapped_piece(ds, report, first, piece, reach, layout)
                else:
                    bad, reach = _piece(ds, report, first, piece, reach, frame, layout)
            for i, reason in bad:
                if len(report.bad_records) < MAX_LISTED:
                    report.bad_records.append((i, reason))
                else:  # a compressed index can hold billions: memory stays bounded
                    unlisted += 1
            if progress is not None:
                progress(first + count)
    finally:
        ds._crc_on_read = saved
    layout.add_records(None)  # no more
    report.problems[index_at:index_at] = index_problems
    if unlisted:
        report.problems.append(f"{unlisted} more bad records (the first {MAX_LISTED} listed)")
    if report.ok:  # gaps are only meaningful between blocks known to be sound
        report.problems += layout.problems()
    report.problems += source.verify_frames()
    if ds.uncommitted_bytes:
        report.problems.append(
            f"{ds.uncommitted_bytes} byte{'s' * (ds.uncommitted_bytes != 1)} after the last "
            "commit (a writer crashed or is still writing); recovery salvages complete "
            "records from them"
        )
    return report


class InOrder:
    """Reads of a compressed source's logical bytes made in file order (verify's records
    and the padding between them), served from spans of SPAN bytes that ``source.span`` decompresses
    at once: each frame is read and decompressed once a pass, where a read of each record
    on its own (``source.frame``) costs a lookup and a decompression of every frame it
    touches. A read the current span does not hold starts the next span there. A span
    that fails (a bad frame in it) is not tried again: the reads up to its end go to
    ``source.frame`` one by one, whose errors name what is wrong."""

    def __init__(self, source: Any):
        self.source = source
        self.buf: Any = None  # holds logical bytes [lo, hi) from position ``at`` on
        self.lo = self.hi = self.at = 0
        self.failed = 0  # the end of the last span that failed

    def _holds(self, offset: int, n: int) -> bool:
        return self.buf is not None and self.lo <= offset <= offset + n <= self.hi

    def frame(self, offset: int, n: int) -> tuple[Any, int]:
        if not self._holds(offset, n):
            self._next(offset, n)
        if self._holds(offset, n):
            return self.buf, self.at + offset - self.lo
        return self.source.frame(offset, n)

    def read(self, offset: int, n: int) -> memoryview:
        buf, pos = self.frame(offset, n)
        return buf[pos : pos + n]

    def _next(self, offset: int, n: int) -> None:
        self.buf = None
        self.lo = self.hi = offset
        want = min(max(n, SPAN), self.source.size - offset)
        if offset < self.failed or want < n:
            return
        try:
            self.buf, self.at = self.source.span(offset, want)
        except FormatError:
            self.failed = offset + want
            return
        self.hi = offset + min(want, len(self.buf) - self.at)


def _mapped_piece(
    ds: Any,
    report: VerifyReport,
    first: int,
    entries: np.ndarray,
    reach: int,
    layout: bounded.Layout,
) -> tuple[list[tuple[int, str]], int]:
    """``_piece`` for a mapped plain file: each run of records of one payload length laid
    end to end (as writers append them), sound and after ``reach``, is checked and decoded
    together as a scan reads it (``Records._scan_run``: checksums and structure); a run
    that cannot be, and each record of a run that fails there, goes to ``_piece``, which
    reads it alone and says what is wrong. Bad records are named exactly as ``_piece``
    names them."""
    bad: list[tuple[int, str]] = []
    frame = ds._source.frame
    starts = entries["offset"].astype(np.int64)
    ends = starts + FRAME_SIZE + entries["length"].astype(np.int64)
    sound = ds._sound(entries)
    lengths = entries["length"]
    for a, b in ds._runs(entries):
        while a < b and int(lengths[a]) not in ds._layouts:  # read alone until learned
            more, reach = _piece(ds, report, first + a, entries[a : a + 1], reach, frame, layout)
            bad, a = bad + more, a + 1
        if a == b:
            continue
        run = None
        if sound[a:b].all() and starts[a] >= reach:
            layout.check_before(int(starts[b - 1]))  # the padding before each record
            run = ds._scan_run(entries[a:b], ds._source.mapped)
        if run is None:
            more, reach = _piece(ds, report, first + a, entries[a:b], reach, frame, layout)
            bad += more
            continue
        if not run[1]:  # every record of the run checked together (the common case)
            report.bytes_checked += int((ends[a:b] - starts[a:b]).sum())
            reach = int(ends[b - 1])
            continue
        for k, values in enumerate(run[0], a):
            if values is None:  # read alone: it says what is wrong, or it is fine after all
                one = entries[k : k + 1]
                more, reach = _piece(ds, report, first + k, one, reach, frame, layout)
                bad += more
            else:
                report.bytes_checked += int(ends[k] - starts[k])
                reach = int(ends[k])
    return bad, reach


def _piece(
    ds: Any,
    report: VerifyReport,
    first: int,
    entries: np.ndarray,
    reach: int,
    frame: Any,
    layout: bounded.Layout | None,
) -> tuple[list[tuple[int, str]], int]:
    """Read and check records ``first``... of a piece of the index (their bytes read by
    ``frame``), each after the padding before it (``layout``, if given); returns the bad ones and
    the new reach (the end of the last good frame). A record starting before it is bad
    unread, so no byte is checked twice however the index points."""
    bad = []
    for i, (offset, length, crc, reserved) in enumerate(entries.tolist(), first):
        try:
            if reserved:
                reason = "index entry has reserved bits set"
                raise FormatError(reason, offset, record=i, code=INDEX)
            if offset < reach:
                raise FormatError(SHADOWED, offset, record=i, code=INDEX)
            if layout is not None:
                layout.check_before(offset)
            try:
                ds._read(i, offset, length, crc, frame=frame)
            except FormatError as exc:
                if exc.code != ZSTD_FRAME or not _reads_by_locator(ds, i, (offset, length, crc)):
                    raise
            report.bytes_checked += FRAME_SIZE + length
            reach = offset + FRAME_SIZE + length
        except FormatError as exc:
            bad.append((i, exc.detail))  # the record is named beside it
    return bad, reach


def _reads_by_locator(ds: Any, i: int, entry: tuple[int, int, int]) -> bool:
    """Whether record ``i`` of a compressed file, whose frame the decoder of verify's pass
    refused, reads right as ``ds[i]`` reads it (its locator's frame, decompressed by the
    compiled reader, checked): zstd versions disagree on some damaged frames whose content
    checksum still holds (libzstd 1.5.4 decodes some that 1.5.7 refuses), and a record is
    bad only if its reads fail. The frame itself is reported apart, by the frame pass."""
    source = ds._source
    record_frame = getattr(source, "record_frame", None)  # (layout 2: a locator per record)
    if record_frame is None or not 0 <= i < source.block.record_count:
        return False
    found = record_frame(i)
    if found is None or tuple(found[2:5]) != entry:
        return False
    buf, pos, offset, length, crc = found[:5]
    try:
        ds._decode(i, buf, pos, offset, length, crc)
    except FormatError:
        return False
    return True


def _by_record(
    ds: Any, report: VerifyReport, first: int, count: int, error: FormatError
) -> list[tuple[int, str]]:
    """Records of an index piece that could not be read, checked one by one through the
    source's own lookup (a compressed file's locators): each bad one is named, and a
    record that every read returns right is not (the index's damage is reported apart)."""
    bad = []
    for i in range(first, first + count):
        try:
            offset, length, crc, reserved = ds._entry_of(i)
        except FormatError:
            bad.append((i, f"index entry unreadable: {error.reason}"))
            continue
        entry = np.array([(offset, length, crc, reserved)])
        bad += _piece(ds, report, i, entry, 0, ds._source.frame, None)[0]
    return bad


def _pieces(ds: Any, index_problems: list[str]) -> Iterator[tuple]:
    """(first record, count, entries) over every index segment, CHUNK bytes at a time
    (entries is the FormatError where they cannot be read), each segment's checksum checked
    on the way, its problems added to ``index_problems``: the index is read once for both,
    in memory bounded whatever it holds."""
    first = 0
    step = bounded.CHUNK // ENTRY_SIZE
    for k, seg in enumerate(ds._segments):
        crc, unreadable = 0, None
        for lo in range(0, seg.count, step):
            count = min(step, seg.count - lo)
            try:
                raw = ds._source.read(seg.offset + lo * ENTRY_SIZE, count * ENTRY_SIZE)
                piece: Any = np.frombuffer(raw, ENTRY_DTYPE, count)
                crc = ds.header.checksum(piece, crc)
            except FormatError as exc:
                piece = exc
                unreadable = unreadable or exc
            yield first + lo, count, piece
        if unreadable is not None:
            index_problems.append(f"index segment {k} unreadable: {unreadable}")
        elif crc != seg.crc:
            index_problems.append(f"index segment {k} at {seg.offset}: checksum mismatch")
        first += seg.count


def _history(ds: Any, report: VerifyReport) -> list[Commit]:
    """Walk the chain of earlier footers and check them and the index segments they name;
    returns the commits walked, the last one first."""
    checked = {seg.offset for seg in ds._segments}  # segments' and metadata offsets
    checked.add(ds.commit.metadata_offset)
    commit = ds.commit
    commits, hashed = [commit], 0  # footers and blocks are disjoint: at most the file
    while commit.prev_footer and hashed <= ds.commit.end:
        try:
            older = parse_footer_from(
                ds._source.read, commit.prev_footer, commit.footer_offset, ds.header
            )
        except FormatError:
            older = None
        if older is None or older.number != commit.number - 1:
            report.problems.append(
                f"footer of commit {commit.number - 1} at {commit.prev_footer} is damaged"
            )
            return commits
        hashed += older.end - older.footer_offset
        for offset, length, crc, what in _checksummed_blocks(older):
            if offset not in checked:
                checked.add(offset)
                hashed += length
                if hashed > ds.commit.end:
                    break
                if not bounded.intact(ds._source.read, offset, length, crc, ds.header.checksum):
                    report.problems.append(
                        f"{what} at {offset} of commit {older.number} is damaged"
                    )
        commit = older
        commits.append(commit)
    if commit.prev_footer:
        report.problems.append("earlier footers name overlapping blocks: not all checked")
    return commits


def _blocks(ds: Any, commits: list[Commit]) -> list[tuple[int, int]]:
    """(start, end) of the header and of every block the ``commits`` name: no byte between
    them may be non-zero (docs/FORMAT.md §2). No checksum covers these gaps and no read
    looks at them, so verify's padding check is the only check they get."""
    blocks = [(0, ds.header.length)]
    for commit in commits:
        blocks.append((commit.footer_offset, commit.end))
        blocks += [(offset, offset + n) for offset, n, _, _ in _checksummed_blocks(commit)]
    return blocks


def _checksummed_blocks(commit: Commit) -> list[tuple[int, int, int, str]]:
    """(offset, length, checksum, name) of the index segments and metadata block a footer names."""
    blocks = [
        (seg.offset, seg.count * ENTRY_SIZE, seg.crc, "index segment") for seg in commit.segments
    ]
    if commit.metadata_length:
        blocks.append(
            (commit.metadata_offset, commit.metadata_length, commit.metadata_crc, "metadata block")
        )
    return blocks
