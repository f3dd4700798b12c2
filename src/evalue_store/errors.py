"""Exceptions raised by evalue_store."""

from __future__ import annotations


class FormatError(ValueError):
    """Bytes that do not follow docs/FORMAT.md (or FRAMES.md, JAVA.md): truncated,
    corrupted or hostile input.

    ``offset`` is the byte position the problem was found at (None when it has no single
    place), ``path`` the file it came from (None for in-memory buffers).
    """

    def __init__(self, reason: str, offset: int | None = None, path: str | None = None):
        self.reason = reason
        self.offset = offset
        self.path = path
        where = []
        if path is not None:
            where.append(str(path))
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{': '.join([', '.join(where), reason]) if where else reason}")


class EncodeError(ValueError):
    """A value that has no EValue encoding (wrong type, out of range, unsupported dtype)."""


class WriterLockedError(RuntimeError):
    """Another writer holds the file's lock; only one writer may append at a time."""
