"""Which shards a source names: files, globs, directories, manifests, or the same in
object storage, resolved to one ordered list of ``ShardInfo`` (``open_shards``)."""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any

from ..dataset.reader import open_dataset
from ..errors import LIMIT, FormatError
from ..physical import remote
from . import object_store
from .manifest import (
    DIRECTORY_MANIFEST,
    MANIFEST_SUFFIX,
    MAX_COUNT,
    SHARD_SUFFIXES,
    ShardInfo,
    Source,
    _check_unique,
    _expand,
    check_shard_files,
    describe_shard,
    directory_members,
    footer_checksum,
    parse_manifest,
    read_manifest,
)


def _directory_members(directory: str) -> list[str]:
    """A directory's manifests or shard files (``directory_members``)."""
    entries = glob.glob(os.path.join(glob.escape(directory), "*"))
    members = directory_members([path for path in entries if os.path.isfile(path)])
    if not members:
        raise FileNotFoundError(
            f"{directory}: no {DIRECTORY_MANIFEST}, no *{MANIFEST_SUFFIX} and no *.evs or "
            "*.evs.zst files"
        )
    return members


def resolve_shards(
    source: Source, filesystem: Any = None, storage_options: dict | None = None
) -> list[ShardInfo]:
    """The shards a source names, in order. See ``open_shards`` for the accepted forms."""
    first = source if isinstance(source, (str, os.PathLike)) else next(iter(source), "")
    if filesystem is not None or remote.is_url(first):
        return _resolve_remote(source, filesystem, storage_options)
    shards: list[ShardInfo] = []
    for path in _expand(source):
        members = _directory_members(path) if os.path.isdir(path) else [path]
        for member in members:
            if member.endswith(".json"):
                listed = read_manifest(member)
                check_shard_files(listed, os.path.abspath(member))
                shards.extend(listed)
            else:
                shards.append(dataclasses.replace(describe_shard(member), by_path=True))
    _check_unique(shards)
    if sum(s.records for s in shards) > MAX_COUNT:
        raise FormatError(
            f"the shards of {source!r:.200} hold more than 2^63-1 records in all", code=LIMIT
        )
    return shards


def _resolve_remote(source: Source, filesystem: Any, options: dict | None) -> list[ShardInfo]:
    shards: list[ShardInfo] = []
    for fs, inner, url in object_store.expand_remote(source, filesystem, options, SHARD_SUFFIXES):
        if inner.endswith(".json"):
            listed = object_store.read_remote_manifest(fs, inner, url, parse_manifest)
            object_store.check_listed(fs, listed, url)
            shards.extend(listed)
        else:
            with open_dataset(inner, verify=False, filesystem=fs) as ds:
                info = ShardInfo(url, len(ds), ds.commit.end, footer_checksum(ds), by_path=True)
                shards.append(info)
    _check_unique(shards)
    return shards
