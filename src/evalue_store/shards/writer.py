"""Writing sharded datasets: ``ShardWriter`` rolls to a new container file at a record or
byte limit and, when it closes, writes the manifest (``manifest``) that lists its shards."""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..container import ENTRY_SIZE
from ..dataset.fields import FIELDS_KEY, Fields
from ..dataset.writer import KEPT_BY_APPEND, Writer
from ..errors import ClosedError, UsageError
from ..physical import remote
from ..physical.zstd import AUTO
from . import object_store
from .manifest import (
    DIRECTORY_MANIFEST,
    MANIFEST_SUFFIX,
    SHARD_SUFFIXES,
    PathLike,
    ShardInfo,
    describe_shard,
    manifest_doc,
    write_manifest,
)


def _default_manifest(pattern: str) -> str:
    """``data/train-{:05d}.evs`` -> ``data/train.manifest.json``; no prefix -> manifest.json.
    What follows the placeholder, but the shard suffix, is kept, so that distinct patterns
    get distinct manifests: ``train-{:05d}-part1.evs`` -> ``train-part1.manifest.json``."""
    directory, name = os.path.split(pattern)
    before, after = name.split("{", 1)[0], name.rsplit("}", 1)[-1]
    for suffix in (*SHARD_SUFFIXES, os.path.splitext(after)[1]):
        if after.endswith(suffix):
            after = after[: len(after) - len(suffix)]
            break
    stem = before.rstrip("-_.") + after if after else before.rstrip("-_.")
    return os.path.join(directory, stem + MANIFEST_SUFFIX if stem else DIRECTORY_MANIFEST)


def shared_dictionary(
    writer_options: dict[str, Any], finished: Writer, shared: bytes | None
) -> bytes | None:
    """After a shard is finished: the dictionary the job's next shards are offered
    (``Writer._offer_dictionary``), ``shared`` until then. If ``writer_options`` leave each
    file to choose its own (the default), the first one a shard of the job kept: one
    training per job instead of one per shard, and one dictionary to decompress the shards
    with (``zstd -d -D``), where it pays (a small last shard may keep none)."""
    if shared is None and writer_options.get("dictionary", AUTO) == AUTO:
        return finished.dictionary
    return shared


def check_limits(max_records: Any, max_bytes: Any) -> None:
    """A shard's ``max_records`` and ``max_bytes`` (``ShardWriter``'s, ``EValueDatasink``'s):
    None or a whole number of at least 1 (an int or a numpy integer). A float (1.5, 1e3)
    would be taken as a limit nobody wrote, and a bool is no count: both are a TypeError."""
    for name, limit in (("max_records", max_records), ("max_bytes", max_bytes)):
        if limit is None:
            continue
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral):  # np.bool_ isn't
            kind = type(limit).__name__
            raise TypeError(f"{name} must be an integer (or None), not {kind}: {limit!r}")
        if limit < 1:
            raise UsageError(f"{name} must be positive, not {limit}")


def shard_full(writer: Writer, max_records: int | None, max_bytes: int | None) -> bool:
    """Whether a shard being written has reached a limit, so the next record starts a new one."""
    n = len(writer)
    if max_records is not None and n >= max_records:
        return True
    # tell() is the logical end, buffer included; each record adds an index entry at commit.
    size = writer.tell() + ENTRY_SIZE * n
    return max_bytes is not None and size >= max_bytes


class ShardWriter:
    """Writes records across shard files named ``pattern.format(n)`` for n = 0, 1, ...

    A new shard starts before a record once the current one holds ``max_records`` records
    or ``max_bytes`` bytes (data plus index; the footer adds ~100 bytes). The byte limit is
    soft, as in WebDataset: a shard ends after the record that reaches the limit, so it
    exceeds ``max_bytes`` by less than one record. Each shard gets ``metadata`` and, for dict
    records, the same field names (``fields``, fixed by the first one, as for ``Writer``).

    ``close()`` (or leaving the ``with`` block normally) commits the last shard and writes the
    manifest atomically (default: the pattern's prefix + ".manifest.json"). Leaving the block
    by an exception keeps the finished shards, discards the records of the shard in progress
    (as ``with Writer`` does) and writes no manifest, so a half-done job does not look done.

    Shards are created with mode "x" unless ``overwrite``: rerunning a job into the same
    place must not mix old and new shards silently. ``resume`` continues an earlier run
    that died instead: its shards are kept, the last one is reopened for appending (a
    crashed writer's tail salvaged first, as with ``Writer(path, "a")``, and reported in
    ``salvage``), and ``len()`` says how many records are already stored, i.e. where the
    input should resume. Other keywords (``alignment``, ``compression``...) go to each
    ``Writer``; ``max_bytes`` counts uncompressed bytes. Compressed shards share the
    dictionary the first one trained (see ``Writer``), unless ``dictionary`` is given.

    For parallel writers give each process its own pattern, e.g.
    ``f"data/train-{rank:02d}-{{:05d}}.evs"``, then ``merge_manifests``.
    """

    def __init__(
        self,
        pattern: PathLike,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        metadata: dict | None = None,
        manifest: PathLike | None = None,
        durable: bool = True,
        overwrite: bool = False,
        resume: bool = False,
        filesystem: Any = None,
        storage_options: dict | None = None,
        **writer_options: Any,
    ):
        self.pattern = os.fspath(pattern)
        self._staging: object_store.Staging | None = None
        try:
            one_placeholder = self.pattern.format(0) != self.pattern.format(1)
        except (IndexError, KeyError, ValueError, TypeError, AttributeError) as exc:
            raise UsageError(
                f"pattern {self.pattern!r} must have one placeholder such as {{:05d}} ({exc})"
            ) from None
        if filesystem is None and not remote.is_url(self.pattern):
            self.pattern = os.path.abspath(self.pattern)  # a later chdir changes nothing
        if not one_placeholder:
            raise UsageError(f"pattern {self.pattern!r} needs a placeholder such as {{:05d}}")
        check_limits(max_records, max_bytes)
        self.max_records = None if max_records is None else int(max_records)
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self.metadata = metadata
        self.manifest_path = os.path.abspath(
            os.fspath(manifest) if manifest is not None else _default_manifest(self.pattern)
        )
        if filesystem is not None or remote.is_url(self.pattern):
            if resume:
                raise UsageError("resume needs a local pattern (an object has no append)")
            self._staging = object_store.Staging(
                self.pattern,
                None if manifest is None else os.fspath(manifest),
                _default_manifest(self.pattern),
                filesystem,
                storage_options,
                overwrite,
            )
            self.pattern = self._staging.local_pattern
            self.manifest_path = self._staging.manifest_url
        self.writer_options = writer_options
        self._dictionary: bytes | None = None  # offered to new shards (shared_dictionary)
        self.durable = durable
        self.mode = "w" if overwrite else "x"
        if self.mode == "x" and not resume and os.path.exists(self.manifest_path):
            raise FileExistsError(
                f"{self.manifest_path}: a finished job's manifest is there; rerunning into the "
                "same place needs overwrite=True (or another pattern or manifest)"
            )
        self.shards: list[ShardInfo] = []
        self._writer: Writer | None = None
        self._fields = Fields()  # the same field names in every shard
        self._count = 0
        self._closed = False
        self.salvage = None  # with resume: what reopening the last shard salvaged, if anything
        self._resumed = resume
        if resume:
            if overwrite:
                raise UsageError("resume and overwrite exclude each other")
            self._resume()

    def _resume(self) -> None:
        """Take over shards 0, 1, ... of an earlier run: all but the last as they are, the
        last reopened for appending."""
        paths: list[str] = []
        while os.path.exists(self.pattern.format(len(paths))):
            paths.append(self.pattern.format(len(paths)))
        if not paths:
            return
        self.shards = [describe_shard(path) for path in paths[:-1]]
        # metadata again: the last shard may have died before its first commit stored it.
        # The last shard keeps its own alignment, version and compression; the options
        # apply to the shards made from now on.
        options = {k: v for k, v in self.writer_options.items() if k not in KEPT_BY_APPEND}
        self._writer = Writer(
            paths[-1], "a", metadata=self.metadata, durable=self.durable, **options
        )
        self.salvage = self._writer.salvage
        self._count = sum(s.records for s in self.shards) + len(self._writer)
        # Unnamed records: in earlier shards, or in the last one unless they were salvaged
        # into it from a crash (then a dict may name them: the Writer checks it).
        earlier = sum(s.records for s in self.shards)
        unnamed = earlier > 0 or self._writer._field_state().positional
        self._fields = Fields(self._writer.fields, self._writer.fields is None and unnamed)

    def _full(self, writer: Writer) -> bool:
        return shard_full(writer, self.max_records, self.max_bytes)

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The names of the record fields, fixed by the first dict record (as for Writer)."""
        return self._fields.names

    def append(self, record: Sequence[Any] | Mapping[str, Any]) -> int:
        """Append one record (a list, or a dict naming its values as for ``Writer``);
        returns its global index across all shards."""
        if self._closed:
            raise ClosedError("ShardWriter is closed")
        values, fixed = self._fields.values(record)  # the same names across shards
        if self._writer is not None and self._full(self._writer):
            self._finish_shard()
        if self._writer is None:
            path = self.pattern.format(len(self.shards))
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            metadata = self.metadata
            if self._fields.names is not None:  # so that a shard of list records names them
                metadata = {**(metadata or {}), FIELDS_KEY: list(self._fields.names)}
            self._writer = Writer(
                path,
                self.mode,
                metadata=metadata,
                durable=self.durable,
                **self.writer_options,
            )
            self._writer._offer_dictionary(self._dictionary)
        self._writer.append(record)
        self._fields.accept(fixed, len(values))
        self._count += 1
        return self._count - 1

    def extend(self, records: Iterable[Sequence[Any]]) -> None:
        for record in records:
            self.append(record)

    def _finish_shard(self) -> None:
        assert self._writer is not None
        self._writer.close()
        self._dictionary = shared_dictionary(self.writer_options, self._writer, self._dictionary)
        info = describe_shard(self._writer.path)
        if self._staging is not None:
            url = self._staging.upload_shard(len(self.shards), info.path)
            info = ShardInfo(url, info.records, info.nbytes, info.footer_sha256)
        self.shards.append(info)
        self._writer = None

    def __len__(self) -> int:
        return self._count

    def close(self) -> str:
        """Commit the last shard and write the manifest; returns the manifest's path."""
        self._finish(manifest=True)
        return self.manifest_path

    def _finish(self, manifest: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._writer is not None and not manifest:
                self._writer.abort()  # as ``with Writer`` does when an exception leaves it
            elif self._writer is not None:
                self._finish_shard()
            if manifest and self._staging is not None:
                self._staging.upload_manifest(manifest_doc(self.shards, lambda p: p))
            elif manifest:
                replace = self.mode == "w" or self._resumed
                write_manifest(self.manifest_path, self.shards, self.durable, replace)
                if self.mode == "w":  # an earlier run's later shards must not be read with ours
                    k = len(self.shards)
                    while os.path.lexists(self.pattern.format(k)):
                        os.unlink(self.pattern.format(k))
                        k += 1
        finally:
            if self._staging is not None:
                self._staging.cleanup()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._finish(manifest=exc_type is None)
