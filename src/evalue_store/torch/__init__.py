"""PyTorch adapter: containers as ``torch.utils.data`` datasets, without copying tensors.

* ``EValueDataset``: map-style, for samplers (``shuffle=True``, ``DistributedSampler``).
* ``ShardedIterableDataset``: shard-aware shuffling, split over ranks and DataLoader
  workers, deterministic per (seed, epoch), resumable mid-epoch with ``state_dict``.
* ``collate``: stacks same-shape tensors and pads variable-length ones (``Padded``).

Tensors are ``torch.from_numpy`` views of the reader's private copy-on-write mapping: no
copy, no warning, and bfloat16 arrives as ``torch.bfloat16``. Writing into them changes only
this process's mapping (never the file), but later reads of the same record in this process
see the change, so transforms should not modify tensors in place.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

try:
    import torch
except ModuleNotFoundError as exc:  # evalue_store itself never needs torch
    if exc.name != "torch":
        raise
    raise ImportError(
        "evalue_store.torch needs PyTorch, which is not installed: "
        "pip install 'evalue_store[torch]'"
    ) from None
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from ..dataset import indexing
from ..dataset.reader import Dataset as FileDataset
from ..errors import BatchError, UsageError
from ..shards import ShardedDataset, Source, open_shards
from ..shards.batching import sharded_batch
from .batching import BatchSamples, Columns, Padded, as_torch, as_torch_record, collate

__all__ = [
    "BatchSamples",
    "EValueDataset",
    "Padded",
    "ShardedIterableDataset",
    "as_torch",
    "as_torch_record",
    "collate",
]

STATE_VERSION = 1
FETCH = 64  # records read per get_many in the iterable dataset


def _open(
    source: Source | ShardedDataset | FileDataset,
    backend: str,
    verify: bool,
    as_dict: bool | None,
) -> ShardedDataset:
    """The shards of ``source``. An open ShardedDataset is used as it is, an open Dataset
    stands for its file (reopened, as a worker would); their ``as_dict`` is the default,
    which an explicit ``as_dict`` may repeat (a ShardedDataset's) but not contradict."""
    if isinstance(source, ShardedDataset):
        own = source.open_options.get("as_dict", False)
        if as_dict is not None and as_dict != own:
            raise UsageError(
                f"as_dict={as_dict} contradicts the ShardedDataset's as_dict={own}: "
                "open_shards decides it for a ShardedDataset source"
            )
        return source
    if isinstance(source, FileDataset):
        return open_shards(
            source.path,
            backend=backend,
            verify=verify,
            as_dict=source.as_dict if as_dict is None else as_dict,
            filesystem=source.filesystem,
            storage_options=source.storage_options,
        )
    return open_shards(source, backend=backend, verify=verify, as_dict=bool(as_dict))


class EValueDataset(Dataset):
    """Map-style dataset over one or many container files (any ``open_shards`` source, or
    an open ShardedDataset or Dataset, whose ``as_dict`` is then the default).

    ``ds[i]`` is the record as a list (a dict by field names with ``as_dict=True``), tensors
    as ``torch.Tensor``, then ``transform(record)`` if given. ``__getitems__`` lets
    DataLoader fetch a whole batch with one grouped read. Pickling sends the shard table
    only (with ``as_dict``); workers open the files themselves.
    """

    def __init__(
        self,
        source: Source | ShardedDataset | FileDataset,
        transform: Callable[[Any], Any] | None = None,
        *,
        backend: str = "mmap",
        verify: bool = True,
        as_dict: bool | None = None,
    ):
        self.data = _open(source, backend, verify, as_dict)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def _sample(self, record: list | dict) -> Any:
        sample = as_torch_record(record)
        return sample if self.transform is None else self.transform(sample)

    def __getitem__(self, index: Any) -> Any:
        """The sample for an integer index (int, numpy or 0-d tensor); a list of samples
        for a slice, an integer array/tensor or a boolean mask (numpy's rules)."""
        where = indexing.normalize(index, len(self.data))
        if isinstance(where, int):
            return self._sample(self.data[where])
        if isinstance(where, range):
            where = np.arange(where.start, where.stop, where.step)
        return [self._sample(r) for r in self.data.get_many(where)]

    def __getitems__(self, indices: Sequence[int]) -> Sequence:
        """The samples of a batch. Without a transform they come as one ``BatchSamples``:
        every fixed-shape tensor field already stacked (``get_batch``; in a DataLoader
        worker, into shared memory), which ``collate`` hands on as it is; any other
        collate_fn sees an ordinary sequence of samples. Records with different numbers
        of values make no columns: they come as a list of samples, as ``ds[i]`` gives them.

        ``indices`` are what a sampler yielded, one per sample: never a boolean mask. A
        bool among them (``bool``, ``np.bool_``, a 0-d bool tensor; a bool array or tensor)
        is a TypeError, as ``ds[True]`` is, whatever their number."""
        _refuse_bools(indices)
        if self.transform is not None:
            return [self._sample(r) for r in self.data.get_many(indices)]
        made = Columns()
        try:
            columns = sharded_batch(self.data, indices, new=made.new)
        except BatchError:  # (no out buffers here: only value counts that differ)
            return [self._sample(r) for r in self.data.get_many(indices)]
        items = columns.items() if isinstance(columns, dict) else enumerate(columns)
        torch_columns = {key: made.to_torch(column) for key, column in items}
        return BatchSamples(torch_columns, len(indices), self.data.open_options["as_dict"])


def _refuse_bools(indices: Any) -> None:
    """TypeError if a batch's indices hold a bool: ``len(ds)`` of them would otherwise be
    read as a mask (other records than the sampler named), and any other number of them
    as a mask of the wrong length."""
    seq = isinstance(indices, (list, tuple))  # (a bool array or tensor has a bool dtype)
    if indexing._is_bool(indices) or (seq and any(indexing._is_bool(i) for i in indices)):
        raise TypeError(
            "a bool is not a record index: a batch's indices (what the sampler yielded) "
            "are integers, one per sample, never a mask"
        )


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in [0, world_size={world_size})")
    return rank, world_size


def _buffer_shuffle(
    chunks: Iterator[np.ndarray], size: int, rng: np.random.Generator
) -> Iterator[int]:
    """Classic shuffle buffer: each new item replaces a random buffered one, which is emitted."""
    buf: list[int] = []
    picks: list[int] = []
    for chunk in chunks:
        for item in chunk.tolist():
            if len(buf) < size:
                buf.append(item)
                continue
            if not picks:
                picks = rng.integers(0, size, 4096).tolist()
            j = picks.pop()
            yield buf[j]
            buf[j] = item
    rng.shuffle(buf)
    yield from buf


class ShardedIterableDataset(IterableDataset):
    """Iterable dataset over shards with shuffling, rank/worker splitting and exact resume.

    Order for an epoch (deterministic in ``seed`` and ``epoch``, see ``set_epoch``):

    1. The shard order is permuted, and the records within each shard are permuted (random
       access is cheap here, so mixing does not rest on the buffer alone); concatenated,
       this is one global sequence of all N records.
    2. Rank r of W takes the contiguous slice [r*N//W, (r+1)*N//W): every record goes to
       exactly one rank and rank sizes differ by at most one. With ``even=True`` every rank
       takes N//W records instead and the at most W-1 records at the end of the sequence
       are skipped this epoch (a different few each epoch), for DDP loops that need equal
       step counts. Each rank reads only about 1/W of the shards.
    3. The rank's slice goes through a shuffle buffer of ``shuffle_buffer`` records.
    4. DataLoader workers split the rank's sequence by batches: batch j (of
       ``batch_size`` records) goes to worker j % num_workers. DataLoader collects batches
       from workers round-robin, so the loader yields the rank's sequence in order whatever
       the number of workers; set ``batch_size`` to the DataLoader's.

    ``shuffle=False`` keeps file order and skips steps 1 and 3. ``len()`` is this rank's
    record count. ``rank``/``world_size`` default to torch.distributed's when it is
    initialized, else to 0 and 1.

    Epoch and resume position live in a small shared-memory tensor, so ``set_epoch`` and
    ``load_state_dict`` reach persistent workers too.
    """

    def __init__(
        self,
        source: Source | ShardedDataset | FileDataset,
        *,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 1024,
        rank: int | None = None,
        world_size: int | None = None,
        batch_size: int = 1,
        even: bool = False,
        transform: Callable[[Any], Any] | None = None,
        backend: str = "mmap",
        verify: bool = True,
        as_dict: bool | None = None,
    ):
        if batch_size < 1 or shuffle_buffer < 0:
            raise UsageError("batch_size must be positive and shuffle_buffer non-negative")
        self.data = _open(source, backend, verify, as_dict)
        self.shuffle = shuffle
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.batch_size = batch_size
        self.even = even
        self.transform = transform
        self._shared = torch.zeros(2, dtype=torch.int64).share_memory_()  # epoch, start
        self._position: int | None = None  # records handed out by iterating in this process

    # ------------------------------------------------------------------ order

    @property
    def epoch(self) -> int:
        return int(self._shared[0])

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order. A position loaded by ``load_state_dict`` for this same
        epoch is kept (so the usual ``set_epoch(e)`` after resuming does not undo it)."""
        if epoch != self.epoch:
            self._shared[1] = 0
        self._shared[0] = epoch
        self._position = None

    def _rank_range(self) -> tuple[int, int]:
        n, w, r = len(self.data), self.world_size, self.rank
        if self.even:
            share = n // w
            return r * share, (r + 1) * share
        return r * n // w, (r + 1) * n // w

    def __len__(self) -> int:
        lo, hi = self._rank_range()
        return hi - lo

    def _rank_chunks(self, epoch: int) -> Iterator[np.ndarray]:
        """This rank's slice of the global sequence, as arrays of global record indices."""
        counts, offsets = self.data.counts, self.data.offsets
        lo, hi = self._rank_range()
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(counts)) if self.shuffle else range(len(counts))
        pos = 0
        for k in order:
            n = int(counts[k])
            a, b = max(lo - pos, 0), min(hi - pos, n)
            pos += n
            if a < b:
                self.data.shard(int(k))  # opened, so n is checked before n indices are made
                if self.shuffle:  # the same for every rank: it depends on (seed, epoch, k)
                    local = np.random.default_rng([self.seed, epoch, int(k)]).permutation(n)[a:b]
                else:
                    local = np.arange(a, b)
                yield offsets[k] + local
            if pos >= hi:
                return

    def rank_order(self, epoch: int) -> Iterator[int]:
        """Global record indices in the order this rank reads them in ``epoch``."""
        chunks = self._rank_chunks(epoch)
        if not self.shuffle or self.shuffle_buffer < 2:
            return (i for chunk in chunks for i in chunk.tolist())
        rng = np.random.default_rng([self.seed, epoch, self.rank, 1])
        return _buffer_shuffle(chunks, self.shuffle_buffer, rng)

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        epoch, start = int(self._shared[0]), int(self._shared[1])
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        in_process = info is None
        if in_process:
            self._position = start
        stream = itertools.islice(self.rank_order(epoch), start, None)
        pending: list[int] = []
        for q, index in enumerate(stream):
            if (q // self.batch_size) % workers == worker:
                pending.append(index)
                if len(pending) == FETCH:
                    yield from self._fetch(pending, in_process)
                    pending = []
        yield from self._fetch(pending, in_process)

    def _fetch(self, indices: list[int], in_process: bool) -> Iterator[Any]:
        for record in self.data.get_many(indices) if indices else []:
            sample = as_torch_record(record)
            if in_process:
                self._position += 1  # before the yield: the consumer has it once it resumes us
            yield sample if self.transform is None else self.transform(sample)

    # ------------------------------------------------------------------ resume

    def _fingerprint(self) -> dict:
        return {
            "records": len(self.data),
            "shards": len(self.data.counts),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "world_size": self.world_size,
            "even": self.even,
        }

    def state_dict(self, consumed: int | None = None) -> dict:
        """Where this rank is in the epoch, to resume exactly there.

        ``consumed``: records this rank has taken from the DataLoader since the current
        iteration began (e.g. steps * batch_size). Required with DataLoader workers, whose
        progress this process cannot see; with ``num_workers=0`` (or plain iteration) it
        defaults to what this object handed out. In DDP lockstep every rank is at the same
        position, so rank 0's state resumes all ranks.
        """
        if consumed is None:
            if self._position is None:
                raise UsageError(
                    "this dataset was not iterated in this process (DataLoader workers?): "
                    "pass consumed= the number of records taken from the loader"
                )
            position = self._position
        else:
            if isinstance(consumed, bool) or not hasattr(consumed, "__index__"):
                kind = type(consumed).__name__
                raise TypeError(f"consumed must be a whole number of records, not {kind}")
            position = int(self._shared[1]) + operator.index(consumed)
        if not 0 <= position <= len(self):
            raise UsageError(f"position {position} is outside this rank's {len(self)} records")
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "position": position,
            **self._fingerprint(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume at a ``state_dict`` position: the next iteration yields exactly the records
        the interrupted one had not yet handed out, in the same order."""
        if state.get("version") != STATE_VERSION:
            raise UsageError(f"unknown state version {state.get('version')!r}")
        saved = {k: state.get(k) for k in self._fingerprint()}
        if saved != self._fingerprint():
            raise UsageError(
                f"state was saved for {saved}, this dataset is {self._fingerprint()}: "
                "resuming would not be exact"
            )
        position = state.get("position")
        if type(position) is not int or not 0 <= position <= len(self):
            raise UsageError(f"position {position!r} is not one of this rank's {len(self)} records")
        self._shared[0] = state["epoch"]
        self._shared[1] = position
        self._position = None
