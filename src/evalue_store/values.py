"""The EValue kinds and how plain Python / numpy / torch values map onto them.

Mapping (documented in README "Values"):

=====================  =====================  ==========================
Python value           EValue kind            comes back as
=====================  =====================  ==========================
None                   None                   None
bool, numpy.bool_      Bool                   bool
int, numpy.integer     Int (int64; checked)   int
float, numpy.floating  Double                 float
str                    String (UTF-8)         str
bytes, bytearray,      String (raw bytes)     bytes
memoryview
numpy.ndarray          Tensor                 numpy.ndarray (zero-copy view)
torch.Tensor           Tensor                 numpy.ndarray
list/tuple of bool     ListBool               list[bool]
list/tuple of int      ListInt                list[int]
list/tuple of float    ListDouble             list[float]
list/tuple of arrays   ListTensor             list[numpy.ndarray]
arrays and Nones       ListOptionalTensor     list[numpy.ndarray | None]
empty list/tuple       ListInt                []
=====================  =====================  ==========================

A numpy masked array (and np.ma.masked) raises EncodeError: a Tensor has no mask.
A list mixing ints and floats (or other kinds) is ambiguous and raises EncodeError; wrap it
(``ListDouble([1, 2.5])``) to say what you mean. The typed wrappers choose the kind; they
convert between numbers only, and refuse (EncodeError) a value of another kind.
"""

from __future__ import annotations

import enum
from collections import abc
from typing import Any, NamedTuple

import numpy as np

from .dtypes import BFLOAT16, dtype_code
from .errors import EncodeError

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
MAX_RANK = 64  # numpy's own limit on dimensions


class Kind(enum.IntEnum):
    """EValue tags, numbered as in ExecuTorch's ``Tag`` enum."""

    NONE = 0
    TENSOR = 1
    STRING = 2
    DOUBLE = 3
    INT = 4
    BOOL = 5
    LIST_BOOL = 6
    LIST_DOUBLE = 7
    LIST_INT = 8
    LIST_TENSOR = 9
    LIST_OPTIONAL_TENSOR = 11


class Typed(NamedTuple):
    """A value with an explicit kind; build it with the helpers below (``Int(3)``...)."""

    kind: Kind
    value: Any


def Tensor(value: Any) -> Typed:  # noqa: N802 - reads like a type, as in ExecuTorch
    return Typed(Kind.TENSOR, value)


def String(value: str | bytes) -> Typed:  # noqa: N802
    return Typed(Kind.STRING, value)


def Double(value: float) -> Typed:  # noqa: N802
    return Typed(Kind.DOUBLE, value)


def Int(value: int) -> Typed:  # noqa: N802
    return Typed(Kind.INT, value)


def Bool(value: bool) -> Typed:  # noqa: N802
    return Typed(Kind.BOOL, value)


def ListBool(value: Any) -> Typed:  # noqa: N802
    return Typed(Kind.LIST_BOOL, value)


def ListDouble(value: Any) -> Typed:  # noqa: N802
    return Typed(Kind.LIST_DOUBLE, value)


def ListInt(value: Any) -> Typed:  # noqa: N802
    return Typed(Kind.LIST_INT, value)


def ListTensor(value: Any) -> Typed:  # noqa: N802
    return Typed(Kind.LIST_TENSOR, value)


def ListOptionalTensor(value: Any) -> Typed:  # noqa: N802
    return Typed(Kind.LIST_OPTIONAL_TENSOR, value)


def _is_torch_tensor(value: Any) -> bool:
    # Checked by name so that importing evalue_store never imports torch.
    cls = type(value)
    return cls.__module__.startswith("torch") and cls.__name__ in ("Tensor", "Parameter")


def masked_problem(value: Any) -> str | None:
    """Why a numpy masked array (or ``np.ma.masked``) cannot be stored, or None for any
    other value: a Tensor has no mask, and its data alone would read back as ordinary values."""
    if value is np.ma.masked:
        return "np.ma.masked (a missing value) has no EValue kind: store None, or a value"
    if isinstance(value, np.ma.MaskedArray):
        return (
            f"a numpy masked array (shape {value.shape}, dtype {value.dtype}): a Tensor has no "
            "mask, which would be lost; store a.filled(value), or a.data and "
            "np.ma.getmaskarray(a) as two tensors"
        )
    return None


# Not a collection of items in an order of its own: text is one value, not its letters; a
# mapping or a set iterates in its keys' order (for strings, one the hash seed picks).
NOT_A_SEQUENCE = (str, bytes, bytearray, memoryview, abc.Mapping, abc.Set, abc.MappingView)


def is_sequence(value: Any) -> bool:
    """Whether ``value`` is a sized collection of items in an order of its own (a list, a
    tuple, an array, a range): what an argument listing names, positions or numbers takes."""
    return hasattr(value, "__len__") and not isinstance(value, NOT_A_SEQUENCE)


def as_array(value: Any) -> np.ndarray:
    """A numpy array for a tensor-like value (ndarray, torch.Tensor, nested lists)."""
    if isinstance(value, np.ndarray):
        if isinstance(value, np.ma.MaskedArray):
            raise EncodeError(masked_problem(value))
        array = value
    elif _is_torch_tensor(value):
        array = _torch_to_numpy(value)
    else:
        array = np.asarray(value)
    dtype_code(array.dtype)  # raises EncodeError for dtypes without a ScalarType
    if array.ndim > MAX_RANK:
        raise EncodeError(f"tensor rank {array.ndim} exceeds {MAX_RANK}")
    return canonical_bools(array)


def canonical_bools(array: np.ndarray) -> np.ndarray:
    """A bool array viewed from other bytes (uint8 masks: ``m.view(bool)``) holds bytes
    other than 0 and 1, which the format does not allow (FORMAT.md section 5): the values
    numpy sees in it, as 0 and 1. Any other array as it is."""
    if array.dtype == np.bool_ and array.size and array.view(np.uint8).max() > 1:
        return array.view(np.uint8) != 0
    return array


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    import torch

    tensor = tensor.detach()
    if tensor.device.type == "meta":
        raise EncodeError("a tensor on the meta device has no data to store")
    if tensor.is_nested:
        raise EncodeError("a nested tensor: store its parts (.unbind()) as tensors")
    if tensor.layout != torch.strided:
        raise EncodeError(f"a {tensor.layout} tensor: store its .to_dense(), or its parts")
    if tensor.dim() > MAX_RANK:  # (before .numpy(), whose ValueError would say less)
        raise EncodeError(f"tensor rank {tensor.dim()} exceeds {MAX_RANK}")
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    # A lazily conjugated or negated view (x.conj(), x.conj().imag) holds other values than
    # its memory: numpy cannot view it until they are computed (a copy; else a no-op).
    tensor = tensor.resolve_conj().resolve_neg()
    try:
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(BFLOAT16)
        return tensor.numpy()
    except (RuntimeError, TypeError) as exc:  # a quantized or other tensor numpy cannot hold
        raise EncodeError(f"a torch tensor of dtype {tensor.dtype}: {exc}") from None


def _scalar(value: Any) -> Any:
    """A 0-d array's item; anything else unchanged (a masked one is refused: its item is
    the data under the mask, np.ma.masked's 0)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        if isinstance(value, np.ma.MaskedArray):
            raise EncodeError(masked_problem(value))
        return value.item()
    return value


def check_int(value: Any) -> int:
    value = _scalar(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise EncodeError(f"Int needs an integer, not {value!r}")
    number = int(value)
    if not INT64_MIN <= number <= INT64_MAX:
        raise EncodeError(f"int {number} does not fit in int64")
    return number


def _list_kind(items: list[Any]) -> Kind:
    if not items:
        return Kind.LIST_INT
    if all(isinstance(x, (bool, np.bool_)) for x in items):
        return Kind.LIST_BOOL
    if all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in items):
        return Kind.LIST_INT
    if all(isinstance(x, (float, np.floating)) for x in items):
        return Kind.LIST_DOUBLE
    tensors = [x is None or isinstance(x, np.ndarray) or _is_torch_tensor(x) for x in items]
    if all(tensors):
        return Kind.LIST_OPTIONAL_TENSOR if any(x is None for x in items) else Kind.LIST_TENSOR
    raise EncodeError(_list_problem(items))


def _list_problem(items: list[Any]) -> str:
    """What is wrong with a list no EValue list kind holds, and what to do instead."""
    for x in items:
        problem = masked_problem(x)
        if problem is not None:
            return problem
    if all(isinstance(x, (str, bytes, bytearray, memoryview)) for x in items):
        return (
            "a list of strings is not an EValue kind: store each string as its own value "
            "of the record, or join them into one string"
        )
    if any(isinstance(x, (list, tuple)) for x in items):
        return "a nested list is not an EValue kind: store it as a tensor (np.array(...))"
    kinds = ", ".join(sorted({type(x).__name__ for x in items}))
    if all(isinstance(x, (int, float, np.integer, np.floating)) for x in items):
        return f"list mixes {kinds}: wrap it to choose a kind (evs.ListDouble, evs.ListInt)"
    return (
        f"list mixes {kinds}: a list holds only bools, only ints, only floats, or tensors "
        "(with None for a ListOptionalTensor)"
    )


def classify(value: Any) -> tuple[Kind, Any]:
    """The kind of a value and the value normalized for encoding.

    Normalized forms: Tensor -> ndarray, String -> str or bytes, Double -> float,
    Int -> int, Bool -> bool, lists -> list of normalized items, None -> None.
    """
    cls = type(value)
    if cls is np.ndarray:
        return Kind.TENSOR, as_array(value)
    if cls is int:
        return Kind.INT, check_int(value)
    if cls is str:
        return Kind.STRING, value
    if isinstance(value, Typed):
        return value.kind, _coerce(value.kind, value.value)
    if value is None:
        return Kind.NONE, None
    if isinstance(value, (bool, np.bool_)):
        return Kind.BOOL, bool(value)
    if isinstance(value, (int, np.integer)):
        return Kind.INT, check_int(value)
    if isinstance(value, (float, np.floating)):
        return Kind.DOUBLE, float(value)
    if isinstance(value, str):
        return Kind.STRING, value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Kind.STRING, bytes(value)
    if isinstance(value, np.ndarray) or _is_torch_tensor(value):
        return Kind.TENSOR, as_array(value)
    if isinstance(value, (list, tuple)):
        items = list(value)
        kind = _list_kind(items)
        return kind, _coerce(kind, items)
    raise EncodeError(f"no EValue kind for a value of type {type(value).__name__}")


def _coerce(kind: Kind, value: Any) -> Any:
    try:
        kind = Kind(kind)
    except ValueError:
        raise EncodeError(f"unknown EValue kind {kind!r}") from None
    if kind is Kind.NONE:
        if value is not None:
            raise EncodeError("the None kind holds no value")
        return None
    if kind is Kind.TENSOR:
        return as_array(value)
    if kind is Kind.STRING:
        if isinstance(value, str):
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise EncodeError(f"String needs str or bytes, not {type(value).__name__}")
    if kind is Kind.DOUBLE:
        return _check_double(value)
    if kind is Kind.INT:
        return check_int(value)
    if kind is Kind.BOOL:
        return _check_bool(value)
    if isinstance(value, NOT_A_SEQUENCE) or not hasattr(value, "__iter__"):  # (a generator too)
        raise EncodeError(
            f"{_LIST_NAMES[kind]} needs a list (an ordered sequence), not {type(value).__name__}"
        )
    items = list(value)
    if kind is Kind.LIST_BOOL:
        return [_check_bool(x) for x in items]
    if kind is Kind.LIST_DOUBLE:
        return [_check_double(x) for x in items]
    if kind is Kind.LIST_INT:
        return [check_int(x) for x in items]
    if kind is Kind.LIST_TENSOR:
        return [as_array(x) for x in items]
    return [None if x is None else as_array(x) for x in items]


_LIST_NAMES = {
    Kind.LIST_BOOL: "ListBool",
    Kind.LIST_DOUBLE: "ListDouble",
    Kind.LIST_INT: "ListInt",
    Kind.LIST_TENSOR: "ListTensor",
    Kind.LIST_OPTIONAL_TENSOR: "ListOptionalTensor",
}


def _check_double(value: Any) -> float:
    """A real number as a float; strings and bools are refused rather than converted."""
    value = _scalar(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise EncodeError(f"Double needs a real number, not {value!r}")
    try:
        result = float(value)
    except OverflowError:  # an int beyond the doubles (10**400)
        raise EncodeError(f"Double: the integer {value} is too large for a double") from None
    if isinstance(value, (int, np.integer)) and int(value) != result:
        # A double holds every integer up to 2**53 exactly; past that, converting would
        # store another number than the one given, silently.
        raise EncodeError(
            f"Double: the integer {value} has no exact double (nearest {result!r}); "
            "pass float(value) to store it rounded"
        )
    return result


def _check_bool(value: Any) -> bool:
    """A bool; the integers 0 and 1 are accepted as False and True, nothing else."""
    value = _scalar(value)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise EncodeError(f"Bool needs a bool, not {value!r}")
