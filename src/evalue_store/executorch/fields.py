"""Which record values feed which inputs of a program method, and how each value becomes
rows of its input (``Field``, ``Layout``): kept apart from the batch reading in
``binding`` so that the rules for a record's values read in one place.

``pick`` resolves ``bind``'s ``fields`` argument. Its mistakes are refused before any
record is read, each naming the entry at fault: a wrong kind of argument is a TypeError
(a ``str`` is not a sequence of names, nor is a set, whose order is the hash seed's; a
bool or a float is not a position), a position that cannot name a value (negative, or
named twice) a ValueError, a name the dataset lacks an ``InputMismatchError``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..dtypes import BFLOAT16
from ..errors import InputMismatchError, UsageError
from ..values import is_sequence
from .program import InputSpec


def value_text(value: Any) -> str:
    if isinstance(value, np.ndarray):
        dtype = "bfloat16" if value.dtype == BFLOAT16 else value.dtype.name
        return f"a {dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    return "None" if value is None else f"a Python {type(value).__name__}"


def _scalar_fits(value: Any, dtype: np.dtype) -> bool:
    """Whether a Python bool/int/float converts to ``dtype`` without loss of kind or range."""
    if dtype == BFLOAT16 or dtype.kind == "c":
        return False
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        if dtype.kind == "f":
            return True
        if dtype.kind not in "iu":
            return False
        info = np.iinfo(dtype)
        return info.min <= value <= info.max
    return isinstance(value, float) and dtype.kind == "f"


@dataclass(frozen=True)
class Layout:
    """How one field's records become one input: ``scalar`` (Python values), else tensors of
    ``shape`` per record, with a leading 1 if ``lead`` (concatenated instead of stacked)."""

    scalar: bool
    lead: bool
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Field:
    """Record value ``position`` (named ``name`` in messages) feeding input ``spec``."""

    position: int
    name: str
    spec: InputSpec

    def expected(self, method: str) -> str:
        spec = self.spec
        trail = tuple(spec.sizes[1:])
        shapes = "shape " + " or ".join(str(s) for s in (trail, (1, *trail)))
        if spec.dynamic:
            shapes += " (sizes at most these)"
        text = f"input {spec.index} of {method!r}, {spec.describe()}: per record a "
        text += f"{spec.dtype_name} tensor of {shapes}"
        if spec.rank == 1 and spec.dtype != BFLOAT16 and spec.dtype.kind != "c":
            text += f", or a Python number that fits {spec.dtype_name}"
        return text

    def layout_of(self, value: Any) -> Layout | None:
        """The layout of one record's value, None if it does not fit the input."""
        spec = self.spec
        if isinstance(value, np.ndarray):
            if value.dtype != spec.dtype:
                return None
            if value.ndim == spec.rank - 1:
                layout = Layout(False, False, value.shape)
            elif value.ndim == spec.rank and value.shape[0] == 1:
                layout = Layout(False, True, value.shape[1:])
            else:
                return None
            for size, bound in zip(layout.shape, spec.sizes[1:]):
                if bound is not None and (size > bound if spec.dynamic else size != bound):
                    return None
            return layout
        if isinstance(value, (bool, int, float)) and spec.rank == 1:
            return Layout(True, False, ()) if _scalar_fits(value, spec.dtype) else None
        return None


def name_of(position: int, names: Sequence[str] | None) -> str:
    """How messages name record value ``position``: by its field name when it has one."""
    if names is not None and position < len(names):
        return f"field {names[position]!r}"
    return f"field {position}"


def pick(
    chosen: Any, specs: Sequence[InputSpec], names: Sequence[str] | None, method: str
) -> list[Field]:
    """The fields feeding ``specs`` (in input order): ``chosen`` names or positions, or by
    default values 0, 1, ... of each record."""
    if chosen is None:
        return [Field(i, name_of(i, names), spec) for i, spec in enumerate(specs)]
    if not is_sequence(chosen):
        unordered = " (a set has no order: it cannot say which feeds which input)"
        raise TypeError(
            f"fields must be a sequence of field names or positions, one per input of "
            f"{method!r}, not {type(chosen).__name__} {chosen!r}"
            + (unordered if isinstance(chosen, Set) else "")
        )
    chosen = list(chosen)
    if len(chosen) != len(specs):
        raise UsageError(f"{method!r} takes {len(specs)} inputs; fields names {chosen}")
    result: list[Field] = []
    for k, (spec, entry) in enumerate(zip(specs, chosen)):
        if isinstance(entry, str):
            if names is None or entry not in names:
                found = f"no field of that name (the dataset's fields: {names})"
                expected = Field(0, entry, spec).expected(method)
                raise InputMismatchError(None, f"field {entry!r}", expected, found)
            position, name = names.index(entry), f"field {entry!r}"
        else:
            position = _position(k, entry)
            name = name_of(position, names)
        if any(f.position == position for f in result):
            raise UsageError(
                f"fields[{k}] ({entry!r}) names {name}, as an earlier entry does: "
                "each input needs a value of its own"
            )
        result.append(Field(position, name, spec))
    return result


def _position(k: int, entry: Any) -> int:
    """Entry ``k`` of ``fields`` as a record value position: an integer (numpy's too) of 0
    or more. Negative positions are refused rather than counted from the end: records of
    a file without names may hold different numbers of values, so -1 has no one meaning."""
    if isinstance(entry, (bool, np.bool_)):
        raise TypeError(f"fields[{k}] is a bool ({entry!r}): a field is a name or a position")
    try:
        position = operator.index(entry)
    except TypeError:
        kind = type(entry).__name__
        raise TypeError(
            f"fields[{k}] is {kind} {entry!r}: a field is a name (str) or a position (int)"
        ) from None
    if position < 0:
        raise UsageError(
            f"fields[{k}] is {position}: a position counts a record's values from 0 "
            "(negative positions are not taken)"
        )
    return position


def as_count(name: str, value: Any, least: int = 0) -> int:
    """``value`` as a count (of batches, epochs, records): an int (numpy's too) of at least
    ``least``; a bool or a float is a TypeError (``epochs=1.5`` ran 2 epochs, ``True`` 1)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, not a bool ({value!r})")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__} {value!r}") from None
    if number < least:
        raise UsageError(f"{name} must be {least} or more, not {number}")
    return number
