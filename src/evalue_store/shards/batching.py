"""One batch across shards (``ShardedDataset.get_batch``, the torch ``__getitems__``):
each shard's records read as a batch of that shard (``dataset.batch``) and merged, or read
one by one and stacked; labelled by the first shard's field names."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dataset import indexing
from ..dataset.batch import (
    GROUP_RECORDS,
    Allocator,
    Batch,
    Out,
    _merge,
    field_keys,
    name_columns,
    read_columns,
    stack_records,
)
from ..errors import BatchError


def sharded_batch(sds: Any, indices: Any, out: Out = None, new: Any = None) -> Batch:
    """``ShardedDataset.get_batch``: one batch across shards. The records of each shard
    are read as one batch of that shard; with several shards, their columns are merged
    (one copy more). With fewer than GROUP_RECORDS records per shard on average, the
    records are read one by one and stacked instead."""
    positions = indexing.many(indices, len(sds))
    names = sds.fields
    alloc = Allocator(len(positions), field_keys(names, out), names, new)
    shard_of = np.searchsorted(sds.offsets, positions, side="right") - 1
    shards = sorted(set(shard_of.tolist()))
    if not shards:
        return name_columns([], names, alloc)
    orders = _field_orders(sds, shards, names)
    if orders:  # names in another order somewhere: each record put in the first's order
        records = _one_by_one(sds, positions, shard_of, orders)
        return name_columns(stack_records(records, positions.tolist(), alloc), names, alloc)
    if len(shards) == 1:  # (each shard is held open while read: sds.using)
        with sds.using(shards[0]) as ds:
            columns = read_columns(ds, positions - sds.offsets[shards[0]], alloc)
        return name_columns(columns, names, alloc)
    if len(positions) < GROUP_RECORDS * len(shards):  # a few records per shard: each costs
        # less read by itself than its share of a shard's batch setup and of the merge
        records = _one_by_one(sds, positions, shard_of, {})
        return name_columns(stack_records(records, positions.tolist(), alloc), names, alloc)
    groups, parts, allocs = [], [], []
    for k in shards:
        rows = np.flatnonzero(shard_of == k)
        part = Allocator(len(rows), {}, names)
        with sds.using(k) as ds:
            parts.append(read_columns(ds, positions[rows] - sds.offsets[k], part))
        groups.append(rows)
        allocs.append(part)
    columns = _merge(groups, parts, allocs, len(positions), alloc)
    if columns is None:
        widths = sorted({len(p) for p in parts})
        raise BatchError(f"the shards' records have different numbers of values: {widths}")
    return name_columns(columns, names, alloc)


def _field_orders(sds: Any, shards: list[int], names: tuple[str, ...] | None) -> dict:
    """For each of ``shards`` whose field names are ``names`` in another order, the
    positions of its values in ``names``' order: a batch is labelled by the first shard's
    names, which would put another shard's values under the wrong names (its own labels
    are what ``ds[i]`` gives). Names that are not the same set are a BatchError."""
    if names is None:
        return {}  # a batch by position
    orders = {}
    for k in shards:
        with sds.using(k) as ds:
            own = ds.fields
        if own == names:
            continue
        if own is None or sorted(own) != sorted(names):
            raise BatchError(
                f"shard {k} ({sds.paths[k]}) names its fields {own}, shard 0 {names}: a "
                "batch by field name needs the same names in every shard"
            )
        orders[k] = [own.index(name) for name in names]
    return orders


def _one_by_one(sds: Any, positions: np.ndarray, shard_of: np.ndarray, orders: dict) -> list:
    """The records at ``positions`` (global; ``shard_of``: their shards) as value lists, in
    that order, read shard by shard (each is open while read): from a mapped file record by
    record through ``ds[i]``'s fast path, else together (a compressed file decompresses
    each frame once, a remote one fetches them at once). A shard in ``orders`` has its
    values put in the order given there."""
    local = (positions - sds.offsets[shard_of]).tolist()
    rows_of: dict[int, list[int]] = {}
    for row, k in enumerate(shard_of.tolist()):
        rows_of.setdefault(k, []).append(row)
    records: list = [None] * len(positions)
    for k, rows in rows_of.items():
        with sds.using(k) as ds:
            if ds._mapped is None:
                got = ds._get_positions([local[row] for row in rows])
            elif ds.as_dict:
                got = [list(ds[local[row]].values()) for row in rows]
            else:
                got = [ds[local[row]] for row in rows]
        order = orders.get(k)
        for row, record in zip(rows, got):
            records[row] = record if order is None else [record[j] for j in order]
    return records
