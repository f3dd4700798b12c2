"""Which records an index names: numpy's rules for a one-dimensional sequence.

Accepted, as numpy accepts them for a 1-D array: an integer of any kind (``int``,
``np.int64``, a 0-d integer array or tensor: anything ``operator.index`` takes), a slice, a
1-D sequence/array/tensor of integers, and a boolean mask of exactly one value per record.
Negative integers count from the end. Anything else is an error rather than a guess: a
``str`` (a sequence of characters), a bool scalar (an int to Python, not to numpy's
indexing), a float, None, a set or a generator raise TypeError; an integer out of range
and a mask of the wrong length raise IndexError (as numpy does).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np

from ..errors import UsageError

Index = Union[int, slice, Sequence[int], np.ndarray]
Positions = Union[int, range, np.ndarray]

_KINDS = "integers, slices, 1-D integer arrays or boolean masks"


def _wrong_kind(index: Any) -> TypeError:
    return TypeError(f"records are indexed by {_KINDS}, not {type(index).__name__}")


def _is_bool(index: Any) -> bool:
    dtype = getattr(index, "dtype", None)
    return isinstance(index, (bool, np.bool_)) or str(dtype) in ("bool", "torch.bool")


def one(i: int, n: int) -> int:
    """``i`` as a position in [0, n), or IndexError."""
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise IndexError(f"record {i} out of range for {n} records")
    return j


def normalize(index: Any, n: int) -> Positions:
    """The records ``index`` names in a sequence of ``n``: an int for one record, else a
    ``range`` (a slice) or a 1-D int64 array of positions in [0, n), in the order named."""
    if type(index) is int:  # the common cases first
        return one(index, n)
    if isinstance(index, np.integer):
        return one(int(index), n)
    if isinstance(index, slice):
        try:
            return range(*index.indices(n))
        except TypeError:
            raise TypeError(f"slice bounds must be integers or None: {index!r}") from None
        except ValueError:  # Python's own for a step of 0: one family, as other refusals
            raise UsageError(f"a slice's step cannot be 0: {index!r}") from None
    ndim = getattr(index, "ndim", None)
    if ndim == 0 or (ndim is None and not _is_sequence(index)):
        if _is_bool(index):
            raise TypeError(
                f"a bool is not a record index (records are indexed by {_KINDS}); "
                "a mask needs one bool per record"
            )
        try:
            i = operator.index(index)
        except TypeError:
            raise _wrong_kind(index) from None
        return one(i, n)
    if isinstance(index, tuple) and len(index) == 1:  # numpy: a[(i,)] is a[i]
        return normalize(index[0], n)
    if isinstance(index, tuple):
        raise IndexError(f"too many indices: records are one-dimensional, got {len(index)}")
    return many(index, n)


def scalar(index: Any, n: int) -> int:
    """The position of the one record an integer index names (TypeError for anything else)."""
    where = normalize(index, n)
    if not isinstance(where, int):
        raise TypeError(f"one record index is needed here, not {type(index).__name__}")
    return where


def _is_sequence(index: Any) -> bool:
    return isinstance(index, (list, tuple, range)) or (
        isinstance(index, Sequence) and not isinstance(index, (str, bytes, bytearray, Mapping))
    )


def many(indices: Any, n: int) -> np.ndarray:
    """Positions in [0, n) (int64, 1-D) of a slice, a sequence, array or tensor of
    integers, or a boolean mask of n values: what ``normalize`` takes for several records."""
    if isinstance(indices, slice):
        where = normalize(indices, n)
        return np.arange(where.start, where.stop, where.step, dtype=np.int64)
    if type(indices) is np.ndarray and indices.ndim == 1 and indices.dtype.kind in "iu":
        if not indices.size:
            return np.zeros(0, np.int64)
        if indices.min() >= 0 and indices.max() < n:  # the common case, checked in two passes
            return indices.astype(np.int64, copy=False)
    if isinstance(indices, (str, bytes, bytearray, Mapping)) or (
        getattr(indices, "ndim", None) is None and not _is_sequence(indices)
    ):
        if isinstance(indices, (int, np.integer)) and not _is_bool(indices):
            raise TypeError(f"a batch's indices are a sequence, not one int: [{indices}]")
        raise _wrong_kind(indices)
    typed = hasattr(indices, "dtype")  # an array or tensor: its dtype counts even when empty
    if hasattr(indices, "detach"):  # a torch tensor, possibly on a GPU
        indices = indices.detach().cpu().numpy()
    try:
        array = np.asarray(indices)
    except (TypeError, ValueError):  # ragged nesting
        raise _wrong_kind(indices) from None
    if array.ndim != 1:
        raise TypeError(f"an index array must be 1-D, not {array.ndim}-D (shape {array.shape})")
    kind = array.dtype.kind
    if kind == "b":
        if len(array) != n:
            raise IndexError(f"boolean mask has {len(array)} values for {n} records")
        return np.flatnonzero(array)
    if array.size == 0:  # ([] is a float64 array; an empty array's dtype is its own)
        if typed and kind not in "iu":
            raise TypeError(f"an index array must hold integers or bools, not {array.dtype}")
        return np.zeros(0, np.int64)
    if kind == "O":  # Python ints beyond int64, or a mixture
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in array.tolist()):
            raise TypeError(f"an index array must hold integers, not {_kinds_of(array)}")
        for v in array.tolist():
            one(v, n)  # some are beyond int64: one of them is out of range
    elif kind not in "iu":
        raise TypeError(f"an index array must hold integers or bools, not {array.dtype}")
    bad = (array >= n) | (array < -n) if kind == "i" else array >= n
    if bad.any():
        raise IndexError(f"record {array[bad][0]} out of range for {n} records")
    array = array.astype(np.int64, copy=False)
    return np.where(array < 0, array + n, array) if kind == "i" else array


def _kinds_of(array: np.ndarray) -> str:
    return ", ".join(sorted({type(v).__name__ for v in array.tolist()}))
