"""Tensors for PyTorch: decoded values as tensors, and batches of samples collated.

``as_torch`` turns a decoded value into a tensor that no later read shares; ``BatchSamples``
is a batch read as columns (``EValueDataset.__getitems__``) that ``collate`` hands on without
restacking; ``collate`` stacks same-shape tensors and pads variable-length ones (``Padded``).

In a DataLoader worker, ``collate``'s batch travels to the main process as a pickle. Torch
sends a tensor as a shared-memory file whose descriptor the main process fetches from the
worker over a socket: about a millisecond of both processes' time per tensor, whatever its
size. So a tensor smaller than ``SHARE_BYTES`` is allocated in ordinary memory and pickled
by value (its bytes in the pickle), and a bigger one is allocated in shared memory (as
torch's default_collate does) and sent as such (benchmarks/bench_loader.py).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..buffers import private
from ..dataset import indexing
from ..dtypes import BFLOAT16
from ..errors import BatchError

SHARE_BYTES = 256 << 10  # in a DataLoader worker, tensors this big go to the main process
# in shared memory, smaller ones by value: measured on a 2-core machine, a 256 KiB tensor by
# value costs half the CPU time of one in shared memory, a 1 MiB tensor twice as much


def as_torch(value: Any) -> Any:
    """A decoded value with numpy arrays turned into writable tensors that no later read
    shares: big ones without a copy (``evalue_store.buffers.private``), small ones copied.

    Tensor lists (ListTensor, ListOptionalTensor) become lists of tensors (None kept);
    every other kind is returned as is. A big-endian array (``evalue_store.java``'s) is
    copied into native byte order, which torch needs.
    """
    if isinstance(value, np.ndarray):
        if not value.dtype.isnative:  # Java's big-endian tensors (evalue_store.java): torch
            # takes native byte order only; the copy is private already
            value = value.astype(value.dtype.newbyteorder("="))
        value = private(value)  # writable, and no later read shares its memory
        if value.dtype == BFLOAT16:
            return torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(value)
    if isinstance(value, list) and value and (value[0] is None or isinstance(value[0], np.ndarray)):
        return [None if v is None else as_torch(v) for v in value]
    return value


def as_torch_record(record: list | dict) -> list | dict:
    """A record (a list, or a dict from ``as_dict``) with its values through ``as_torch``."""
    if isinstance(record, dict):
        return {name: as_torch(v) for name, v in record.items()}
    return [as_torch(v) for v in record]


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {BFLOAT16: torch.bfloat16}


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return found


def _numpy_of(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BFLOAT16)
    return tensor.numpy()


def _empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized CPU tensor; in a DataLoader worker, a big one (``SHARE_BYTES``) in
    shared memory, so that sending the batch to the main process does not copy it again."""
    shape = tuple(shape)
    numel = math.prod(shape)
    if numel * dtype.itemsize < SHARE_BYTES or get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    like = torch.empty(0, dtype=dtype)
    return like.new(like._typed_storage()._new_shared(numel)).view(shape)


class Columns:
    """Allocates a batch's stacked columns as tensors and knows each one's tensor."""

    def __init__(self) -> None:
        self.made: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # keeps arrays alive

    def new(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A column's buffer: a tensor's numpy view (``_empty``)."""
        tensor = _empty(shape, _torch_dtype(dtype))
        array = _numpy_of(tensor)
        self.made[id(array)] = (array, tensor)
        return array

    def to_torch(self, column: Any) -> Any:
        if isinstance(column, np.ndarray):
            array, tensor = self.made.get(id(column), (None, None))
            return tensor if array is column else as_torch(column)
        if isinstance(column, torch.Tensor):
            return column
        if set(map(type, column)).isdisjoint((np.ndarray, list)):  # (decoded: exact types)
            return column  # strings, numbers, None: as they are
        return [as_torch(v) for v in column]


class BatchSamples(Sequence):
    """A batch from ``EValueDataset.__getitems__``: its fields as columns (stacked tensors,
    or lists), and, as a sequence, its samples (built on demand from rows of the columns:
    a scalar field's value is then a 0-d tensor, which default_collate stacks alike)."""

    def __init__(self, columns: dict, count: int, as_dict: bool):
        self.columns = columns  # by field name, or position
        self.count = count
        self.as_dict = as_dict

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(self.count))]
        k = indexing.one(k, self.count)
        values = {key: column[k] for key, column in self.columns.items()}
        return values if self.as_dict else list(values.values())

    def collated(self, pad: Collection[Hashable] | None, pad_value: float) -> Any:
        """What ``collate`` gives for these samples, from the columns."""
        names = list(self.columns) if self.as_dict else list(range(len(self.columns)))
        _check_pad(pad, names)
        out = {}
        for name, column in zip(names, self.columns.values()):
            if isinstance(column, torch.Tensor) and not (pad and name in pad):
                out[name] = column
            else:
                items = list(column.unbind(0)) if isinstance(column, torch.Tensor) else column
                padded = None if pad is None else name in pad
                out[name] = _collate_field(name, items, padded, pad_value)
        return out if self.as_dict else list(out.values())


# ----------------------------------------------------------------------------- collate


class Padded(NamedTuple):
    """A batch of tensors that differ in their first dimension, padded to the longest.

    ``values``: [B, L, *rest], padded with ``pad_value`` after each sample's own length;
    ``lengths``: int64 [B]; ``mask``: bool [B, L], True where ``values`` holds real data.
    """

    values: torch.Tensor
    lengths: torch.Tensor
    mask: torch.Tensor


def _pad(name: Hashable, tensors: Sequence[torch.Tensor], pad_value: float) -> Padded:
    first = tensors[0]
    rest = first.shape[1:]
    if first.ndim == 0 or any(t.shape[1:] != rest or t.dtype != first.dtype for t in tensors):
        shapes = sorted({(tuple(t.shape), str(t.dtype)) for t in tensors})
        raise BatchError(
            f"field {name!r}: cannot stack or pad tensors of shapes/dtypes {shapes[:4]}: only "
            "the first dimension may differ; pass your own collate_fn"
        )
    if not _holds(first.dtype, pad_value):
        raise BatchError(
            f"field {name!r}: pad_value {pad_value!r} does not fit its {first.dtype} tensors; "
            "padding would store another value"
        )
    lengths = torch.tensor([len(t) for t in tensors], dtype=torch.int64)
    longest = int(lengths.max())
    values = _empty((len(tensors), longest, *rest), first.dtype).fill_(pad_value)
    for row, t in zip(values, tensors):
        row[: len(t)] = t
    mask = torch.arange(longest) < lengths[:, None]
    return Padded(values, lengths, mask)


def _holds(dtype: torch.dtype, value: float) -> bool:
    """Whether ``value`` is one of ``dtype``'s values: fill_ would store 1 for 1.5 in an
    integer tensor and True for 2 in a bool one (it refuses only overflows)."""
    if dtype.is_floating_point or dtype.is_complex:  # rounded to the nearest value, as a
        # float pad means (0.1 has no exact float32 either); an overflow is refused
        real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype)
        return not math.isfinite(value) or abs(value) <= torch.finfo(real or dtype).max
    if dtype == torch.bool:
        return value in (0, 1)
    if isinstance(value, float) and not value.is_integer():
        return False
    info = torch.iinfo(dtype)
    return info.min <= value <= info.max


def _check_pad(pad: Collection[Hashable] | None, names: Sequence[Hashable]) -> None:
    """Refuse a ``pad`` naming a field the samples lack: it would be ignored silently."""
    if pad is None:
        return
    for name in pad:  # (True == 1 and 1.0 == 1: either would name position 1)
        if isinstance(name, (bool, float, np.bool_, np.floating)):
            raise TypeError(f"pad names a field by a str or a position, not {name!r}")
    unknown = [name for name in pad if name not in names]
    if unknown:
        raise BatchError(
            f"pad names {unknown[:4]}, which the samples do not have; "
            f"their fields are {list(names)[:8]}"
        )


_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")


def _collate_field(name: Hashable, items: list, pad: bool | None, pad_value: float) -> Any:
    kinds = set(map(type, items))  # sets, not all(...): collate runs for every batch
    kind = kinds.pop() if len(kinds) == 1 else None
    try:
        if kind is not None and issubclass(kind, torch.Tensor):
            return _tensors(name, items, pad, pad_value)
        if kind in (bool, int, float):
            return torch.tensor(
                items, dtype={bool: torch.bool, int: torch.int64}.get(kind, torch.float64)
            )
    except BatchError:
        raise
    except (RuntimeError, OverflowError, ValueError) as exc:  # torch's: its shape arithmetic
        # (a dim near 2**62 in a tensor of no element), an int beyond int64
        raise BatchError(
            f"field {name!r}: torch cannot hold these values as one tensor ({exc})"
        ) from None
    return items


def _tensors(name: Hashable, items: list, pad: bool | None, pad_value: float) -> Any:
    """A field of tensors: stacked, or padded (``Padded``)."""
    if not pad and len(set(map(_DTYPE, items))) == 1:
        first = items[0]
        try:  # torch.stack checks the shapes
            return torch.stack(items, out=_empty((len(items), *first.shape), first.dtype))
        except RuntimeError:
            if len(set(map(_SHAPE, items))) == 1:
                raise  # the shapes agree: another error
    if pad is False:
        raise BatchError(f"field {name!r}: tensors differ in shape or dtype; add it to `pad`")
    return _pad(name, items, pad_value)


def collate(
    batch: Sequence[Any],
    *,
    pad: Collection[Hashable] | None = None,
    pad_value: float = 0,
) -> Any:
    """Collate samples field by field; pass it (or a ``functools.partial``) as collate_fn.

    Samples are lists/tuples (fields by position; the result is a list), dicts (fields by
    key; the result is a dict) or single values (treated as field 0; the result is the
    collated field). Per field:

    * tensors of one shape and dtype -> stacked, [B, *shape];
    * tensors whose first dimension differs -> ``Padded(values, lengths, mask)``;
    * Python bool / int / float -> a bool / int64 / float64 tensor [B];
    * anything else (str, bytes, None, lists, tensor lists, mixed kinds) -> a list of B items.

    With ``pad=None`` a field is padded only when its shapes differ in this batch, so its
    type can change from batch to batch; name the variable-length fields in ``pad`` (e.g.
    ``partial(collate, pad={0})``) to always get ``Padded`` for them and stacking for others.

    In a DataLoader worker the result is a dict (list) subclass that sends its small tensors
    to the main process by value (see the module docstring), where it is a plain dict (list).
    """
    if isinstance(pad, (str, bytes)) or not (pad is None or isinstance(pad, Collection)):
        raise TypeError(f"pad must be a collection of field names or positions, not {pad!r}")
    if isinstance(pad_value, complex) or not isinstance(pad_value, (int, float)):
        raise TypeError(f"pad_value must be an int, float or bool, not {pad_value!r}")
    if not batch:
        raise BatchError("cannot collate an empty batch")
    if isinstance(batch, BatchSamples):
        out = batch.collated(pad, pad_value)
    else:
        out = _collate_samples(batch, pad, pad_value)
    if get_worker_info() is None:
        return out
    if type(out) is dict:
        return _ShippedDict(out)
    return _ShippedList(out) if type(out) is list else out


def _collate_samples(
    batch: Sequence[Any], pad: Collection[Hashable] | None, pad_value: float
) -> Any:
    def field(key: Hashable, items: list) -> Any:
        return _collate_field(key, items, None if pad is None else key in pad, pad_value)

    first = batch[0]
    if isinstance(first, Mapping):
        for i, sample in enumerate(batch):
            if not isinstance(sample, Mapping) or sample.keys() != first.keys():
                keys = sorted(map(str, sample.keys())) if isinstance(sample, Mapping) else None
                raise BatchError(
                    f"sample {i} of the batch has fields {keys}, sample 0 has "
                    f"{sorted(map(str, first.keys()))}"
                )
        _check_pad(pad, list(first))
        return {key: field(key, [s[key] for s in batch]) for key in first}
    if isinstance(first, (list, tuple)):
        if any(len(s) != len(first) for s in batch):
            raise BatchError("samples in a batch have different numbers of fields")
        _check_pad(pad, range(len(first)))
        return [field(k, [s[k] for s in batch]) for k in range(len(first))]
    _check_pad(pad, [0])
    return field(0, list(batch))


# ----------------------------------------------------------------------------- worker to main


class _ShippedDict(dict):
    """A batch ``collate`` made in a DataLoader worker: a dict that pickles its small
    tensors by value (``_by_value``); it arrives in the main process as a plain dict."""

    def __reduce__(self) -> tuple:
        return dict, ([(key, _by_value(value)) for key, value in self.items()],)


class _ShippedList(list):
    """As ``_ShippedDict``, for a batch of fields by position."""

    def __reduce__(self) -> tuple:
        return list, ([_by_value(value) for value in self],)


def _by_value(value: Any) -> Any:
    """What pickling sends for a batch's field: a small tensor as its bytes (rebuilt as a
    tensor when unpickled), a Padded or a list of tensors (or of lists of them) as the
    same of those; anything else as it is (torch sends a tensor in shared memory)."""
    kind = type(value)
    if kind is torch.Tensor:
        small = value.nbytes < SHARE_BYTES and value.device.type == "cpu"
        if small and value.is_contiguous() and not (value.requires_grad or value.is_shared()):
            return _TensorBytes(value)
    elif kind is Padded:
        return Padded(*map(_by_value, value))
    elif kind is list and not set(map(type, value)).isdisjoint((torch.Tensor, list)):
        return [_by_value(v) for v in value]  # (a tensor list field: lists of tensors)
    return value


class _TensorBytes:
    """A tensor that pickles as its bytes, and unpickles as a tensor again."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __reduce__(self) -> tuple:
        t = self.tensor
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return _tensor_from_bytes, (data, t.dtype, tuple(t.shape))


def _tensor_from_bytes(data: bytes, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape)


# ----------------------------------------------------------------------------- iterable
