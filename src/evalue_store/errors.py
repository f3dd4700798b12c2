"""Exceptions raised by evalue_store: one family, ``evalue_store.Error``.

What a file's bytes get wrong is a ``FormatError`` with fields, so that callers (the CLI
included) never parse messages: ``code`` is a stable word for the kind of problem,
``detail`` says it in words, ``record`` names the record it was found in (or None),
``offset`` the byte it was found at, and ``offset_in`` whether that offset counts bytes of
the file ("file") or of the logical container a compressed file holds ("container").
"""

from __future__ import annotations

# FormatError.code values. New codes may be added; a code's meaning never changes. Kinds of
# problem first, then the structure a problem was found in when no kind says more.
CHECKSUM = "checksum"  # a checksum does not match the bytes it covers
TRUNCATED = "truncated"  # the bytes end before what they must hold
OUT_OF_BOUNDS = "out-of-bounds"  # an offset, length or count points outside where it may
LIMIT = "limit"  # a size over a limit of the format or of the reader (max_record_bytes, ...)
NOT_A_CONTAINER = "not-a-container"  # not evalue_store bytes at all (magic, file type)
UNSUPPORTED = "unsupported"  # a version or flag this reader does not implement
CHANGED = "changed"  # the file or object changed while it was being read
HEADER = "header"  # the file header's fields break a rule (alignment, lengths)
COMMIT = "commit"  # the footers do not chain into commits (no valid commit, numbering)
INDEX = "index"  # an index segment or entry breaks a rule (overlap, reserved bits, frames)
METADATA = "metadata"  # the metadata block is not what the format allows
FIELDS = "fields"  # the records' values do not match the file's field names
VALUE = "value"  # a record's bytes break the value grammar (tags, dtypes, padding, UTF-8)
ZSTD_FRAME = "frame"  # a zstd frame of a compressed file is damaged (header, blocks, content)
SEEK_TABLE = "seek-table"  # a seek table of a layout-1 compressed file is damaged
LAYOUT = "layout"  # a layout-2 structure is damaged: layout frame, index block, frame map
DICTIONARY = "dictionary"  # a compressed file's dictionary cannot be used
MANIFEST = "manifest"  # a shard manifest is malformed or disagrees with its shards
MALFORMED = "malformed"  # a rule of the format that no code above names


class Error(Exception):
    """Base of every exception evalue_store raises about data or files."""


class FormatError(Error, ValueError):
    """Bytes that do not follow docs/FORMAT.md (FRAMES.md, JAVA.md): truncated, corrupted or
    hostile input.

    ``reason`` is the message without its place (``record N: `` first, when ``record`` is
    known); ``detail`` is the same without the record. ``offset`` is None when the problem
    has no single place, ``path`` None for in-memory buffers.
    """

    def __init__(
        self,
        reason: str,
        offset: int | None = None,
        path: str | None = None,
        *,
        record: int | None = None,
        offset_in: str = "file",
        code: str = MALFORMED,
    ):
        self.detail = reason
        self.record = record
        self.reason = reason if record is None else f"record {record}: {reason}"
        self.offset = offset
        self.offset_in = offset_in
        self.path = path
        self.code = code
        where = []
        if path is not None:
            where.append(str(path))
        if offset is not None:
            where.append(f"offset {offset}" if offset_in == "file" else f"logical offset {offset}")
        text = self.reason
        super().__init__(f"{', '.join(where)}: {text}" if where else text)

    def at(
        self,
        *,
        path: str | None = None,
        record: int | None = None,
        shift: int = 0,
        offset_in: str | None = None,
    ) -> FormatError:
        """The same problem placed: in a file, a record, and with its offset moved by
        ``shift`` (a position in a buffer made a position in the file)."""
        return FormatError(
            self.detail,
            None if self.offset is None else self.offset + shift,
            path if path is not None else self.path,
            record=record if record is not None else self.record,
            offset_in=offset_in or self.offset_in,
            code=self.code,
        )


class RemoteError(Error, OSError):
    """A remote object (an fsspec URL) could not be read or written: the server kept
    failing after retries. The message names the URL; the last failure is its cause."""


class EncodeError(Error, ValueError):
    """A value that has no EValue encoding (wrong type, out of range, unsupported dtype)."""


class BatchError(Error, ValueError):
    """A batch that cannot be made as asked: for ``get_batch``, an ``out`` buffer that does
    not fit its field or names no field, or records with different numbers of values (a
    batch's columns are by position); for the torch ``collate``, samples it cannot stack or
    pad, or a ``pad`` or ``pad_value`` it would ignore or change."""


class UsageError(Error, ValueError):
    """An argument value a call refuses: out of the range it takes, or options that
    contradict each other; the message names the argument. (A wrong type raises TypeError and
    an index out of range IndexError, as Python's own calls do.)"""


class WriterLockedError(Error, RuntimeError):
    """Another writer holds the file's lock; only one writer may append at a time."""


class ClosedError(Error, ValueError):
    """A Writer, ShardWriter or Dataset used after it was closed (or, for a Writer, after a
    failure it cannot undo: reopen the file)."""


class InputMismatchError(Error, ValueError):
    """A record that does not fit the inputs of an ExecuTorch program method
    (``evalue_store.executorch``): ``record`` (None when every record is concerned, e.g. a
    field the dataset lacks), ``field`` (its name, or ``"field K"`` for unnamed records),
    ``expected`` (what the method's input wants) and ``found`` (what the record holds)."""

    def __init__(self, record: int | None, field: str, expected: str, found: str):
        self.record = record
        self.field = field
        self.expected = expected
        self.found = found
        where = field if record is None else f"record {record}, {field}"
        super().__init__(f"{where}: the program expects {expected}; found {found}")
