"""Verification: every checksum, every record, every byte between blocks (docs/FORMAT.md,
"Verification"), in memory bounded whatever the file claims, reported rather than raised."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import bounded
from ..bounded import SHADOWED
from ..container import ENTRY_SIZE, FRAME_SIZE, Commit, parse_footer_from
from ..errors import INDEX, FormatError

MAX_LISTED = 1000  # bad records verify lists one by one (it counts the others)


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
    _index(ds, report)
    saved, ds._crc_on_read = ds._crc_on_read, True  # verify checks every record CRC
    reach = unlisted = 0
    try:
        for first, count, piece in bounded.index_pieces(ds._source.read, ds._segments):
            if isinstance(piece, FormatError):
                bad = _by_record(ds, report, first, count, piece)
            else:
                bad, reach = _piece(ds, report, first, piece, reach)
            for i, reason in bad:
                if len(report.bad_records) < MAX_LISTED:
                    report.bad_records.append((i, reason))
                else:  # a compressed index can hold billions: memory stays bounded
                    unlisted += 1
            if progress is not None:
                progress(first + count)
    finally:
        ds._crc_on_read = saved
    if unlisted:
        report.problems.append(f"{unlisted} more bad records (the first {MAX_LISTED} listed)")
    commits = _history(ds, report)
    if report.ok:  # gaps are only meaningful between blocks known to be sound
        _padding(ds, report, commits)
    report.problems += ds._source.verify_frames()
    if ds.uncommitted_bytes:
        report.problems.append(
            f"{ds.uncommitted_bytes} bytes after the last commit (a writer crashed or is "
            "still writing); recovery salvages complete records from them"
        )
    return report


def _piece(
    ds: Any, report: VerifyReport, first: int, entries: np.ndarray, reach: int
) -> tuple[list[tuple[int, str]], int]:
    """Read and check records ``first``... of a piece of the index; returns the bad ones
    and the new reach (the end of the last good frame). A record starting before it is
    bad unread, so no byte is checked twice however the index points."""
    bad = []
    for i, (offset, length, crc, reserved) in enumerate(entries.tolist(), first):
        try:
            if reserved:
                reason = "index entry has reserved bits set"
                raise FormatError(reason, offset, record=i, code=INDEX)
            if offset < reach:
                raise FormatError(SHADOWED, offset, record=i, code=INDEX)
            ds._read(i, offset, length, crc)
            report.bytes_checked += FRAME_SIZE + length
            reach = offset + FRAME_SIZE + length
        except FormatError as exc:
            bad.append((i, exc.detail))  # the record is named beside it
    return bad, reach


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
        bad += _piece(ds, report, i, np.array([(offset, length, crc, reserved)]), 0)[0]
    return bad


def _index(ds: Any, report: VerifyReport) -> None:
    """Segment checksums, a chunk at a time (a compressed index can exceed memory)."""
    for k, seg in enumerate(ds._segments):
        try:
            crc = 0
            for _, entries in bounded.index_chunks(ds._source.read, seg):
                crc = ds.header.checksum(entries, crc)
        except FormatError as exc:
            report.problems.append(f"index segment {k} unreadable: {exc}")
            continue
        if crc != seg.crc:
            report.problems.append(f"index segment {k} at {seg.offset}: checksum mismatch")


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


def _padding(ds: Any, report: VerifyReport, commits: list[Commit]) -> None:
    """Blocks must not overlap, and every byte between them must be zero (docs/FORMAT.md
    §2). No checksum covers these gaps and no read looks at them, so this is the only check
    they get."""
    blocks = [(0, ds.header.length)]
    for commit in commits:
        blocks.append((commit.footer_offset, commit.end))
        blocks += [(offset, offset + n) for offset, n, _, _ in _checksummed_blocks(commit)]
    report.problems += bounded.layout_problems(ds._source.read, blocks, ds._segments)


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
