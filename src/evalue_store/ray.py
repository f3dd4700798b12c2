"""Ray Data integration: package a ``ray.data.Dataset`` into shards, read shards back as one.

    import evalue_store.ray as evr
    ds.write_datasink(evr.EValueDatasink("out/", max_records=100_000))
    evs.open_shards("out/")                      # the same dataset, by its manifest
    evr.read_evalue_store("out/").iter_torch_batches(batch_size=256)

Writing: every write task writes the blocks it is given into shards of its own, named
``{prefix}-{task:05d}-{n:05d}.evs`` (the task's index within the write, then its shard
number), rolled at ``max_records``/``max_bytes`` as ``ShardWriter`` does. When every task
has finished, the driver writes the one manifest (``manifest.json``, the format of
``evalue_store.shards``) listing all of them, in task order: a dataset with no manifest is
not finished. If any task fails, the failing task removes its own shards, and the driver
removes every shard of this write's pattern it can find and logs what it removed (and what
it could not): no manifest is written, and an empty marker ``.{prefix}-write-failed`` tells
tasks still running to remove theirs. Column names and order come from the block schema
(``evalue_store.arrowmap`` has the type mapping) and are stored as the field names.

A target that is an fsspec URL (``s3://bucket/dir``, ``file:///...``) is written through
local temporary files: each finished shard is uploaded whole (object stores do not append),
the manifest last, so a reader that finds the manifest finds complete shards.

Reading: ``read_evalue_store`` opens what ``open_shards`` opens (a directory, manifest,
glob, list) and splits it by shard and record range into read tasks; each block has one
column per field, tensors as Ray tensor columns.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import numbers
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from ray.data import Datasink, Datasource, ReadTask, read_datasource
from ray.data.block import BlockAccessor, BlockMetadata

from .arrowmap import block_columns, pick_columns, ray_batch
from .container import ENTRY_SIZE
from .dataset.fields import FIELDS_KEY
from .dataset.writer import Writer
from .errors import EncodeError, UsageError
from .shards import (
    DIRECTORY_MANIFEST,
    ShardedDataset,
    ShardInfo,
    check_limits,
    describe_shard,
    open_shards,
    shard_full,
    shared_dictionary,
    write_manifest,
)
from .targets import Target, publish_file

logger = logging.getLogger(__name__)

__all__ = ["EValueDatasink", "EValueDatasource", "read_evalue_store"]


# ----------------------------------------------------------------------------- writing


class EValueDatasink(Datasink):
    """A Ray Data sink writing evalue_store shards and one manifest into ``path``.

    ``path`` is a local directory (a file there is a NotADirectoryError naming it) or an
    fsspec URL (``storage_options`` or ``filesystem`` as for fsspec). ``max_records`` /
    ``max_bytes`` roll each task's shards like ``ShardWriter``; ``metadata`` goes into every
    shard; other keywords (``compression``, ``alignment``...) go to each ``Writer``. Ray
    gives each write task at least ``min_rows_per_write`` rows (an integer of at least 1;
    default ``max_records``) and, with ``max_bytes``, about that many bytes, so that many
    small blocks do not make as many small shards.

    Writing into a directory that already holds a manifest or shards of this ``prefix``
    raises FileExistsError unless ``overwrite``, which removes them first: a rerun must not
    mix old and new shards. After the write, ``shards`` lists what the manifest lists and
    ``manifest`` is its path; after a failed one, ``removed`` lists the shards removed.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        prefix: str = "part",
        max_records: int | None = None,
        max_bytes: int | None = None,
        metadata: dict | None = None,
        overwrite: bool = False,
        durable: bool = True,
        min_rows_per_write: int | None = None,
        filesystem: Any = None,
        storage_options: dict | None = None,
        **writer_options: Any,
    ):
        check_limits(max_records, max_bytes)
        rows = min_rows_per_write
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, numbers.Integral)):
            raise TypeError(f"min_rows_per_write must be an integer (or None), not {rows!r}")
        if rows is not None and rows < 1:
            raise UsageError(f"min_rows_per_write must be positive, not {rows}")
        if not prefix or "/" in prefix or os.sep in prefix:
            raise UsageError(f"prefix must be a file name prefix, not {prefix!r}")
        if metadata is not None and FIELDS_KEY in metadata:
            raise UsageError(f"metadata must not set {FIELDS_KEY}: the block schema names fields")
        self.target = Target(os.fspath(path), filesystem, storage_options)
        self.prefix = prefix
        self.suffix = ".evs.zst" if writer_options.get("compression") == "zstd" else ".evs"
        self.max_records = None if max_records is None else int(max_records)
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self.metadata = metadata
        self.overwrite = overwrite
        self.durable = durable
        self.writer_options = writer_options
        self._min_rows = min_rows_per_write
        # this write's shard names, and an earlier one's with the other suffix
        self._pattern = re.compile(re.escape(prefix) + r"-[0-9]{5,}-[0-9]{5,}\.evs(\.zst)?")
        self._started = False  # driver side: whether shards of this write may exist
        self.shards: list[ShardInfo] = []
        self.manifest: str | None = None
        self.removed: list[str] = []

    @property
    def min_rows_per_write(self) -> int | None:
        return self._min_rows if self._min_rows is not None else self.max_records

    @property
    def min_bytes_per_write(self) -> int | None:
        return self.max_bytes

    @property
    def failed_marker(self) -> str:
        """Left in the target by a failed write. A task that finishes after the failure
        finds it and removes its own shards (the driver's listing may predate them)."""
        return f".{self.prefix}-write-failed"

    def shard_name(self, task: int, n: int) -> str:
        return f"{self.prefix}-{task:05d}-{n:05d}{self.suffix}"

    def _ours(self) -> list[str]:
        """The names of this write's shard files now in the target."""
        return sorted(name for name in self.target.names() if self._pattern.fullmatch(name))

    def on_write_start(self, schema: Any = None) -> None:
        """Driver, before any write task: refuse (or, with ``overwrite``, clear) a target
        holding an earlier dataset."""
        old = self._ours()
        has_manifest = self.target.exists(DIRECTORY_MANIFEST)
        if (old or has_manifest) and not self.overwrite:
            raise FileExistsError(
                f"{self.target.join('')}: holds "
                + (f"{DIRECTORY_MANIFEST}" if has_manifest else f"shards such as {old[0]}")
                + " from an earlier write (pass overwrite=True to replace it)"
            )
        self.target.makedirs()  # first: a file there fails the write before it starts
        self._started = True
        if has_manifest:  # first: no reader may follow it to shards being replaced
            self.target.remove([DIRECTORY_MANIFEST])
        self.target.remove(old + [self.failed_marker])

    def write(self, blocks: Iterable[Any], ctx: Any) -> dict:
        """One write task: its blocks into its own shards. Returns what the manifest needs."""
        shards = _TaskShards(self, ctx.task_idx)
        try:
            for block in blocks:
                table = BlockAccessor.for_block(block).to_arrow()
                if table.num_rows:
                    shards.add(table)
            return shards.finish()
        except BaseException:
            shards.discard()
            raise

    def on_write_complete(self, write_result: Any) -> None:
        """Driver, after every task: write the manifest, last."""
        if not self._started:  # Ray skips on_write_start when there is no input at all
            self.on_write_start()
        results = sorted(
            (r for r in write_result.write_returns if r and r["shards"]), key=lambda r: r["task"]
        )
        names = {tuple(r["fields"]) for r in results}
        if len(names) > 1:
            raise EncodeError(f"write tasks saw different columns: {sorted(names)}")
        listed = [name for r in results for name, *_ in r["shards"]]
        # A task that Ray retried may have left shards of its failed attempt: not listed.
        self.target.remove(sorted(set(self._ours()) - set(listed)))
        with tempfile.TemporaryDirectory(prefix="evalue_store-ray-") as staging:
            base = self.target.root if self.target.fs is None else staging
            self.shards = [
                ShardInfo(os.path.join(base, name), records, nbytes, digest)
                for r in results
                for name, records, nbytes, digest in r["shards"]
            ]
            local = write_manifest(
                os.path.join(base, DIRECTORY_MANIFEST), self.shards, self.durable
            )
            publish_file(local, self.target, DIRECTORY_MANIFEST)
        self.manifest = self.target.join(DIRECTORY_MANIFEST)

    def on_write_failed(self, error: Exception) -> None:
        """Driver, after a failure: no manifest; remove the shards written so far."""
        if not self._started:  # failed before this write created anything
            return
        self.target.touch(self.failed_marker)  # first: tasks still running see it
        found = self._ours()
        kept = self.target.remove(found)
        self.removed = [name for name in found if name not in kept]
        logger.warning(
            "evalue_store write to %s failed (%s): no manifest written; removed %d shards%s",
            self.target.join(""),
            error,
            len(self.removed),
            f"; could not remove {kept}" if kept else "",
        )


class _TaskShards:
    """The shards one write task writes: rolled by the sink's limits, published when done."""

    def __init__(self, sink: EValueDatasink, task: int):
        self.sink = sink
        self.task = task
        self.fields: tuple[str, ...] | None = None
        self.done: list[tuple[str, int, int, str]] = []  # (name, records, bytes, footer sha)
        self.writer: Writer | None = None
        self.options = dict(sink.writer_options)
        self.dictionary: bytes | None = None  # the task's shards share one where it pays
        self.remote = sink.target.fs is not None
        self.local_dir = tempfile.mkdtemp(prefix="evalue_store-ray-") if self.remote else None

    def add(self, table: Any) -> None:
        names, columns = block_columns(table)
        if self.fields is None:
            self.fields = names
        elif names != self.fields:
            raise EncodeError(
                f"a block has columns {list(names)}, earlier ones {list(self.fields)}"
            )
        append_rows(self, columns, table.num_rows)

    def room(self) -> Writer:
        """The writer of the current shard, a new one if the last reached a limit."""
        sink = self.sink
        if self.writer is not None and shard_full(self.writer, sink.max_records, sink.max_bytes):
            self._finish_shard()
        if self.writer is None:
            name = sink.shard_name(self.task, len(self.done))
            path = os.path.join(self.local_dir, name) if self.remote else sink.target.join(name)
            metadata = {**(sink.metadata or {}), FIELDS_KEY: list(self.fields or ())}
            # "w": a retried task replaces its failed attempt's files (same names)
            self.writer = Writer(path, "w", metadata=metadata, durable=sink.durable, **self.options)
            self.writer._offer_dictionary(self.dictionary)
        return self.writer

    def _finish_shard(self) -> None:
        writer, self.writer = self.writer, None
        assert writer is not None
        writer.close()
        self.dictionary = shared_dictionary(self.options, writer, self.dictionary)
        info = describe_shard(writer.path)
        name = os.path.basename(writer.path)
        publish_file(writer.path, self.sink.target, name)
        self.done.append((name, info.records, info.nbytes, info.footer_sha256))

    def finish(self) -> dict:
        if self.writer is not None:
            self._finish_shard()
        self._cleanup_local()
        if self.sink.target.exists(self.sink.failed_marker):  # the write failed meanwhile
            self.sink.target.remove(name for name, *_ in self.done)
        return {"task": self.task, "fields": list(self.fields or ()), "shards": self.done}

    def discard(self) -> None:
        """After a failure: abort the shard in progress, remove the finished ones."""
        try:
            if self.writer is not None:
                writer, self.writer = self.writer, None
                writer.abort()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(writer.path)
            self.sink.target.remove(name for name, *_ in self.done)
        finally:
            self._cleanup_local()

    def _cleanup_local(self) -> None:
        if self.local_dir is not None:
            shutil.rmtree(self.local_dir, ignore_errors=True)


def append_rows(shards: _TaskShards, columns: Sequence[Sequence[Any]], count: int) -> None:
    """A block's rows as records, as many at a time as fit the current shard: whole column
    slices go to ``Writer.extend_columns``, which encodes same-layout rows in one go."""
    assert shards.fields is not None
    done = 0
    while done < count:
        writer = shards.room()
        take = rows_that_fit(writer, shards.sink.max_records, shards.sink.max_bytes, count - done)
        writer.extend_columns(
            {name: column[done : done + take] for name, column in zip(shards.fields, columns)}
        )
        done += take


def rows_that_fit(writer: Writer, max_records: int | None, max_bytes: int | None, rows: int) -> int:
    """How many of ``rows`` more records go into the writer's shard before it reaches a limit
    (at least one): by the bytes per record it holds so far, one if it holds none yet. As
    with ShardWriter the byte limit is soft: the shard ends after the rows that reach it."""
    n = len(writer)
    if max_records is not None:
        rows = min(rows, max_records - n)
    if max_bytes is not None:
        per_record = (writer.tell() + ENTRY_SIZE * n) / n if n else max_bytes
        rows = min(rows, -(-(max_bytes - writer.tell() - ENTRY_SIZE * n) // per_record))
    return max(1, int(rows))


# ----------------------------------------------------------------------------- reading


def plan_reads(counts: Sequence[int], parallelism: int) -> list[list[tuple[int, int, int]]]:
    """Split shards with ``counts`` records into at most ``parallelism`` read tasks of about
    equal records, each a list of (shard, start, stop): whole shards grouped when there are
    at least as many shards as tasks, shards cut into record ranges when there are fewer."""
    total = sum(counts)
    live = [k for k, c in enumerate(counts) if c]
    tasks = max(1, min(parallelism, total)) if total else 0
    if not tasks:
        return []
    if tasks <= len(live):
        plans: list[list[tuple[int, int, int]]] = [[] for _ in range(tasks)]
        seen = 0
        for k in live:  # by the task its first record falls in: contiguous, balanced
            t = min(seen * tasks // total, tasks - 1)
            plans[t].append((k, 0, counts[k]))
            seen += counts[k]
        return [p for p in plans if p]
    pieces = {k: max(1, round(tasks * counts[k] / total)) for k in live}
    return [
        [(k, counts[k] * j // n, counts[k] * (j + 1) // n)]
        for k, n in pieces.items()
        for j in range(n)
        if counts[k] * j // n < counts[k] * (j + 1) // n
    ]


def _read_ranges(
    dataset: ShardedDataset,
    plan: list[tuple[int, int, int]],
    names: Sequence[str],
    positions: Sequence[int],
    rows_per_block: int,
) -> Iterator[Any]:
    """One read task: its record ranges as blocks of at most ``rows_per_block`` rows."""
    try:
        for k, start, stop in plan:
            shard = dataset.shard(k)
            for first in range(start, stop, rows_per_block):
                batch = shard.get_batch(np.arange(first, min(first + rows_per_block, stop)))
                yield BlockAccessor.batch_to_block(ray_batch(batch, names, positions))
    finally:
        dataset.close()


class EValueDatasource(Datasource):
    """A Ray Data source over evalue_store shards (anything ``open_shards`` opens).

    ``columns`` selects fields, a sequence of names (default: all, in stored order; a
    ``str`` is a TypeError, not one-letter names); ``open_options`` go to
    ``open_shards`` (``verify``, ``backend``...). The shard table is read once, here; read
    tasks get it pickled (O(shards)) and open their shards themselves.
    """

    def __init__(self, source: Any, *, columns: Sequence[str] | None = None, **open_options: Any):
        super().__init__()
        self.dataset = open_shards(source, **open_options)
        try:
            fields = self.dataset.fields
            if fields is None:  # positional records: columns "0", "1", ...
                fields = tuple(str(k) for k in range(len(self.dataset[0]) if self.dataset else 0))
        finally:
            self.dataset.close()
        self.columns, self.positions = pick_columns(columns, fields, source)

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(s.nbytes for s in self.dataset.shards)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        shards = self.dataset.shards
        target = getattr(data_context, "target_max_block_size", None) or (128 << 20)
        tasks = []
        for plan in plan_reads([s.records for s in shards], parallelism):
            rows = sum(stop - start for _, start, stop in plan)
            size = sum(shards[k].nbytes * (b - a) // shards[k].records for k, a, b in plan)
            rows_per_block = max(1, target * rows // max(size, 1))
            read = functools.partial(
                _read_ranges, self.dataset, plan, self.columns, self.positions, rows_per_block
            )
            files = tuple(dict.fromkeys(shards[k].path for k, _, _ in plan))
            metadata = BlockMetadata(rows, size, None, input_files=files)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks


def read_evalue_store(
    source: Any,
    *,
    columns: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    ray_remote_args: dict | None = None,
    **open_options: Any,
) -> Any:
    """A ``ray.data.Dataset`` of the records of ``source`` (see ``EValueDatasource``), one
    column per field; ``override_num_blocks`` sets the number of read tasks."""
    return read_datasource(
        EValueDatasource(source, columns=columns, **open_options),
        override_num_blocks=override_num_blocks,
        ray_remote_args=ray_remote_args,
    )
