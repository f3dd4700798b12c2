"""Named records: a dict's keys name the values of an EValue[] record.

A record is a list or tuple of values (positional), or a dict (any Mapping) whose keys
name them. Names are not stored in records: a record's bytes are the positional EValue[]
of its values in the order of the file's field names, which are kept once, in the
metadata under ``FIELDS_KEY`` (docs/FORMAT.md section 7). The rules:

* The names are fixed by the file's metadata (mode "a"), else by ``FIELDS_KEY`` in the
  metadata the writer is given (a declaration: what copying ``ds.metadata`` carries over),
  else by the first dict record. Later dict records must have exactly those keys, in any
  order; their values are stored in the fixed order.
* A list or tuple in a named file is positional: it must have one value per name.
* A dict after unnamed records (a file whose records were written as lists, without
  names) raises: the names would be given to records that were not written with them.
* Any other record (a generator, a set, a str, an array as the record itself...) raises.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..codec import decode_payload, value_count
from ..container import FRAME_SIZE
from ..errors import CHECKSUM, FIELDS, EncodeError, FormatError
from ..metadata import parse_metadata
from ..values import Kind, classify

FIELDS_KEY = "evalue_store.fields"
# The first record salvaged from a dict writer killed before its first commit is decoded, up
# to this size, so that a first dict naming it in another key order is caught (a bigger one
# is not read whole for that).
KINDS_READ_BYTES = 64 << 20


def check_names(names: Any, error: type = EncodeError) -> tuple[str, ...]:
    """``names`` as a tuple if it is a non-empty list of distinct strings, else ``error``."""
    if not isinstance(names, (list, tuple)) or not names:
        raise error(f"{FIELDS_KEY} must be a non-empty list of strings, not {names!r:.80}")
    for name in names:
        if not isinstance(name, str):
            raise error(f"field names are strings, not {type(name).__name__} ({name!r:.40})")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the metadata JSON could not be written
            raise error(f"field name {name!r:.40} is not valid Unicode (UTF-8)") from None
    if len(set(names)) != len(names):
        raise error(f"field names repeat: {list(names)!r:.200}")
    return tuple(names)


def stored_names(metadata: dict) -> tuple[str, ...] | None:
    """The field names in a file's metadata (None: unnamed); FormatError if malformed."""
    names = metadata.get(FIELDS_KEY)
    return None if names is None else check_names(names, FormatError)


# Kinds one field may hold in different records (a score written as 1 here, 2.5 there):
# one class, so that records differing only in them never look like names in another order.
NUMBERS = (Kind.INT, Kind.DOUBLE, Kind.BOOL)


def value_kinds(values: Any) -> tuple[tuple[int, str, int], ...] | None:
    """Each value's kind, a tensor's with its dtype and rank (what giving two values each
    other's names would show in), Int, Double and Bool as one; None if a value has none."""
    kinds = []
    for value in values:
        try:
            kind, normal = classify(value)
        except (EncodeError, TypeError, ValueError):
            return None
        tensor = kind == Kind.TENSOR
        kind = Kind.INT if kind in NUMBERS else kind
        kinds.append((int(kind), normal.dtype.str if tensor else "", normal.ndim if tensor else 0))
    return tuple(kinds)


def to_dict(values: list, names: tuple[str, ...], where: str = "a record") -> dict:
    """A record's values as a dict by the file's field names."""
    if len(values) != len(names):
        raise FormatError(
            f"{where} has {len(values)} values for {len(names)} field names", code=FIELDS
        )
    return dict(zip(names, values))


class Fields:
    """The field names of the records one writer (or ShardWriter) appends, and whether
    unnamed records were appended (after which a dict cannot name them)."""

    __slots__ = ("names", "positional", "why", "existing", "counts", "salvaged", "salvaged_kinds")

    def __init__(
        self, names: tuple[str, ...] | None = None, positional: bool = False, why: str = ""
    ):
        self.names = names
        self.positional = positional
        self.existing = positional  # unnamed records were there before: their counts unknown
        self.counts: set[int] = set()  # value counts of the unnamed records appended since
        # value counts of records salvaged from a crash into a file that had none: a
        # writer of dicts killed before its first commit left them without their names
        self.salvaged: set[int] = set()
        self.salvaged_kinds: tuple | None = None  # the first salvaged record's value_kinds
        self.why = why or (
            "a dict record after records without field names: this file's records "
            "are positional (append lists, or write the dicts to a new file)"
        )

    def values(self, record: Any) -> tuple[Any, tuple[str, ...] | None]:
        """(the record's values in stored order, names it would fix or None).

        Nothing changes here: ``accept`` records what an appended record fixed."""
        cls = type(record)
        if cls is list or cls is tuple or isinstance(record, (list, tuple)):
            names = self.names
            if names is not None and len(record) != len(names):
                raise EncodeError(
                    f"a list record in a file of named fields needs {len(names)} values "
                    f"({', '.join(names)}), not {len(record)}"
                )
            return record, None
        if isinstance(record, Mapping):
            return self._from_mapping(record)
        raise EncodeError(
            f"a record is a list, tuple or dict of values, not {cls.__name__}"
            + (" (make it a list)" if hasattr(record, "__iter__") else "")
        )

    def _from_mapping(self, record: Mapping) -> tuple[list, tuple[str, ...] | None]:
        names = self.names
        if names is None:
            if self.positional:
                raise EncodeError(self.why)
            if not record:
                raise EncodeError("a dict record needs at least one field")
            fixed = check_names(list(record.keys()))
            values = [record[name] for name in fixed]
            if self.salvaged:
                self._check_unnamed(fixed)
                self._check_order(fixed, values)
            return values, fixed
        if len(record) != len(names) or any(name not in record for name in names):
            missing = [n for n in names if n not in record]
            extra = [str(k) for k in record if k not in names]
            raise EncodeError(
                f"a dict record must have the file's fields {list(names)}: "
                + "; ".join(
                    part
                    for part in (
                        f"missing {missing}" if missing else "",
                        f"unknown {extra}" if extra else "",
                    )
                    if part
                )
            )
        return [record[name] for name in names], None

    def accept(self, fixed: tuple[str, ...] | None, count: int) -> None:
        """After a record of ``count`` values was appended: the names it fixed, or that it
        was unnamed."""
        if fixed is not None:
            self.names = fixed
        elif self.names is None:
            self.positional = True
            self.counts.add(count)

    def declare(self, names: tuple[str, ...]) -> None:
        """Names given in metadata: they fix the names unless fixed already, and must then
        agree with them."""
        if self.names is not None and self.names != names:
            raise EncodeError(
                f"metadata names the fields {list(names)}, but this file's are {list(self.names)}"
            )
        if self.names is None:
            self._check_unnamed(names)
        self.names = names

    def _check_order(self, names: tuple[str, ...], values: list) -> None:
        """The first dict names salvaged records in its keys' order, which the killed
        writer's first dict may not have had: if its values fit the first salvaged record's
        only once reordered, the names would swap fields silently (attacker's remark,
        session 12, tenth run). Values of other kinds altogether prove nothing: kept."""
        have, given = self.salvaged_kinds, value_kinds(values)
        if have is not None and given is not None and have != given:
            if Counter(have) == Counter(given):
                raise EncodeError(
                    f"the fields {list(names)}, in this order, do not fit the records "
                    "salvaged from a crash, whose values come in another order: append "
                    "first a dict with its keys in the order the crashed writer's first "
                    "dict had (this writer still takes one)"
                )

    def _check_unnamed(self, names: tuple[str, ...]) -> None:
        """Names given to records that have none so far must fit every one of them
        (FORMAT.md section 7 rule 3: one value per name)."""
        if self.existing:
            raise EncodeError(
                f"the fields {list(names)} cannot be given to this file: it holds records "
                "written without names (write them to a new file with the names)"
            )
        wrong = sorted((self.counts | self.salvaged) - {len(names)})
        if wrong:
            raise EncodeError(
                f"{len(names)} field names {list(names)} for records of {wrong} values "
                "appended (or salvaged from a crash) without names"
            )


class WriterFields:
    """The part of ``Writer`` that keeps field names (mixed in; uses its ``_commit``,
    ``_sink``, ``_metadata_dirty`` and length).

    ``_metadata_bytes`` is what ``commit()`` stores: the metadata the writer was given
    (through ``__init__`` or ``set_metadata``), with ``FIELDS_KEY`` set to the names once
    they are fixed, so neither can clobber the other.
    """

    _commit: Any
    _sink: Any
    _metadata_dirty: bool
    alignment: int

    def _note_salvaged(self, found: list[tuple[int, int, int]]) -> None:
        """Records (offset, length, crc) salvaged into a file that had none: a writer of
        dicts killed before its first commit left them without their names. Their value
        counts, and the first one's value kinds, are what names given to them must fit."""
        self.__dict__["_salvaged_counts"] = {
            value_count(self._sink.read(offset + FRAME_SIZE, 4)) for offset, _, _ in found
        }
        offset, length, _ = found[0]
        if length <= KINDS_READ_BYTES:
            first = self._sink.read(offset, FRAME_SIZE + length)
            self.__dict__["_salvaged_kinds"] = value_kinds(
                decode_payload(first, 0, length, self.alignment)
            )

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The names of this file's record fields (None while its records are positional)."""
        return self._field_state().names

    @property
    def _metadata_bytes(self) -> bytes:
        user = self.__dict__.get("_user_metadata", b"")
        try:
            names = self._field_state().names
        except EncodeError:  # names given disagree with the file's: its own are kept
            names = self._file_names()
        if names is None:
            return user
        doc = json.loads(user) if user else {}
        if doc.get(FIELDS_KEY) == list(names):
            return user
        doc[FIELDS_KEY] = list(names)
        return json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8")

    @_metadata_bytes.setter
    def _metadata_bytes(self, data: bytes) -> None:
        declared = None
        if data:
            doc = json.loads(data)
            if FIELDS_KEY in doc:
                declared = check_names(doc[FIELDS_KEY])
        state = self.__dict__.get("_fields")
        if state is not None and declared is not None:
            state.declare(declared)
        self.__dict__["_user_metadata"] = data
        self.__dict__["_declared_names"] = declared

    def _field_state(self) -> Fields:
        state = self.__dict__.get("_fields")
        if state is None:
            try:
                names, why = self._file_names(), ""
            except FormatError as exc:  # lists can still be appended, by position
                names, why = None, f"the file's field names cannot be read ({exc}): append lists"
            salvaged = self.__dict__.get("_salvaged_counts")  # into a file that had none
            unnamed = len(self) > 0 and not salvaged  # type: ignore
            state = Fields(names, names is None and (unnamed or bool(why)), why)
            if names is None and salvaged:
                state.salvaged = set(salvaged)
                state.salvaged_kinds = self.__dict__.get("_salvaged_kinds")
            declared = self.__dict__.get("_declared_names")
            if declared is not None:
                state.declare(declared)
            self.__dict__["_fields"] = state
        return state

    def _file_metadata(self) -> bytes:
        commit = self._commit
        if not commit.metadata_length:
            return b""
        return bytes(self._sink.read(commit.metadata_offset, commit.metadata_length))

    def _file_names(self) -> tuple[str, ...] | None:
        """The names in the metadata of the file's last commit (mode "a")."""
        raw = self._file_metadata()
        if not raw:
            return None
        offset = self._commit.metadata_offset
        if self._checksum(raw) != self._commit.metadata_crc:
            raise FormatError("metadata checksum mismatch", offset, code=CHECKSUM)
        return stored_names(parse_metadata(raw, offset))  # strict and bounded, as readers

    def _record_values(self, record: Any) -> tuple[Any, tuple[str, ...] | None]:
        """The values to encode for ``record``, and the names it would fix."""
        state = self.__dict__.get("_fields") or self._field_state()
        return state.values(record)

    def _raw_value_count(self, count: int) -> None:
        """A raw record of ``count`` values is about to be appended: it must fit the names."""
        state = self.__dict__.get("_fields") or self._field_state()
        if state.names is not None and count != len(state.names):
            raise EncodeError(
                f"a record in a file of named fields needs {len(state.names)} values "
                f"({', '.join(state.names)}), not {count}"
            )
        state.accept(None, count)

    def _record_appended(self, fixed: tuple[str, ...] | None, count: int) -> None:
        state = self.__dict__["_fields"]
        if fixed is not None:
            if not self._metadata_dirty:  # keep the file's own metadata (mode "a")
                self.__dict__["_user_metadata"] = self._file_metadata()
            self._metadata_dirty = True
        state.accept(fixed, count)
