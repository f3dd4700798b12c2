"""Shard manifests: the small JSON file that lists a sharded dataset's shards.

Manifest (``format`` "evalue_store.shards", ``version`` 1)::

    {"format": "evalue_store.shards", "version": 1, "records": 250,
     "shards": [{"path": "train-00000.evs", "records": 100, "bytes": 123456,
                 "footer_sha256": "9f86d0..."}, ...]}

Shard paths are relative to the manifest's directory; ``read_manifest`` checks every field
(counts and their total are int64) and ``check_shard_files`` that every shard is a regular
file. ``footer_sha256`` is the SHA-256 (hex) of the shard's last footer (bytes
``[commit.footer_offset, commit.end)``): it names the exact commit the manifest describes,
so a shard replaced or appended to since is caught without reading its records. (Not a
CRC: a footer ends with its own CRC, and the CRC of data followed by its CRC is the same
constant for every footer.)
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from ..bounded import open_regular
from ..container import Commit, Header, encode_footer
from ..dataset.reader import Dataset, open_dataset
from ..errors import MANIFEST, FormatError
from ..files import atomic_file

MANIFEST_FORMAT = "evalue_store.shards"
MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"
SHARD_SUFFIXES = (".evs", ".evs.zst")  # what a directory without a manifest holds
DIRECTORY_MANIFEST = "manifest.json"  # what open_shards(directory) prefers, and merge writes

PathLike = Union[str, os.PathLike]
Source = Union[PathLike, Sequence[PathLike]]


def directory_members(names: Sequence[str]) -> list[str]:
    """What a directory holding ``names`` (its entries' paths) stands for, in name order:
    its manifest.json; else the manifests ShardWriter names after its patterns
    (``*.manifest.json``), each a finished job's shards; else its shard files. While a
    manifest is there, shards it does not list (a job that did not finish) are not read,
    and one that is missing fails at open instead of being left out."""
    names = sorted(names)
    rules = (
        lambda name: name.rsplit("/", 1)[-1] == DIRECTORY_MANIFEST,
        lambda name: name.endswith(MANIFEST_SUFFIX),
        lambda name: name.endswith(SHARD_SUFFIXES),
    )
    for rule in rules:
        members = [name for name in names if rule(name)]
        if members:
            return members
    return []


@dataclass(frozen=True)
class ShardInfo:
    """One shard as a manifest lists it; ``path`` is absolute once loaded.

    ``by_path``: described by opening the file (``open_shards`` of a file, glob or folder
    without a manifest), not listed by a manifest. Such a file found later with more
    records holds the commit described followed by later ones (a writer still appending)
    and is read at that commit; a manifest's shard must be as listed."""

    path: str
    records: int
    nbytes: int
    footer_sha256: str
    by_path: bool = False


def footer_checksum(dataset: Dataset) -> str:
    """SHA-256 (hex) of the footer of the commit ``dataset`` sees: names that exact commit.

    The footer is re-encoded from the parsed commit (encoding is deterministic, and the
    parse checked its checksum, by the shard's own function), which also covers compressed
    files, whose footer bytes are logical rather than at a file offset.
    """
    return commit_checksum(dataset.commit, dataset.header)


def commit_checksum(commit: Commit, header: Header) -> str:
    """``footer_checksum`` of any commit of a file (its footer names the file's id too)."""
    footer = encode_footer(commit.footer_offset, header.file_id, commit, header.checksum)
    return hashlib.sha256(footer).hexdigest()


def describe_shard(path: PathLike) -> ShardInfo:
    """Open a shard briefly and describe its last commit (what a manifest records)."""
    with open_dataset(path, verify=False) as ds:
        return ShardInfo(os.path.abspath(ds.path), len(ds), ds.commit.end, footer_checksum(ds))


# ---------------------------------------------------------------------------- manifests


def _atomic_write_json(path: str, value: Any, durable: bool = True, replace: bool = True) -> None:
    """Write JSON so readers see the old file or the new one, never a torn one; without
    ``replace``, an existing ``path`` is never replaced (FileExistsError)."""
    with atomic_file(path, durable=durable, replace=replace, encoding="utf-8") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


def write_manifest(
    path: PathLike, shards: Sequence[ShardInfo], durable: bool = True, replace: bool = True
) -> str:
    """Write a manifest listing ``shards`` (paths stored relative to the manifest); without
    ``replace`` an existing manifest is never replaced (FileExistsError)."""
    path = os.path.abspath(os.fspath(path))
    base = os.path.dirname(path)
    doc = manifest_doc(shards, lambda p: os.path.relpath(p, base))
    _atomic_write_json(path, doc, durable, replace)
    return path


def manifest_doc(shards: Sequence[ShardInfo], name: Any) -> dict:
    """A manifest's JSON; ``name(path)`` is how a shard's path is written."""
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "records": sum(s.records for s in shards),
        "shards": [
            {
                "path": name(s.path),
                "records": s.records,
                "bytes": s.nbytes,
                "footer_sha256": s.footer_sha256,
            }
            for s in shards
        ],
    }


def read_manifest(path: PathLike) -> list[ShardInfo]:
    """Parse a manifest; shard paths come back absolute. Raises FormatError if malformed,
    naming the manifest and the field: every count must be an int64, as must their total."""
    path = os.path.abspath(os.fspath(path))
    fd = open_regular(path)  # a FIFO would block: FormatError instead
    try:
        with os.fdopen(fd, encoding="utf-8") as f:
            doc = json.load(f)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # RecursionError: nesting deeper than json can parse
        raise FormatError(f"manifest is not JSON: {exc}", None, path, code=MANIFEST) from None
    base = os.path.dirname(path)
    return parse_manifest(doc, path, lambda name: os.path.normpath(os.path.join(base, name)))


def parse_manifest(doc: Any, path: str, join: Any) -> list[ShardInfo]:
    """The shards of a manifest's parsed JSON; ``join(name)`` places a listed name."""
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"not an {MANIFEST_FORMAT} manifest", None, path, code=MANIFEST)
    if doc.get("version") != MANIFEST_VERSION:
        raise FormatError(
            f"unsupported manifest version {doc.get('version')!r}", None, path, code=MANIFEST
        )
    items = doc.get("shards")
    if not isinstance(items, list):
        raise FormatError("'shards' is not a list", None, path, code=MANIFEST)
    shards = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise FormatError(f"shards[{k}] is not an object", None, path, code=MANIFEST)
        name = item.get("path")
        if not isinstance(name, str) or not name or "\0" in name:
            raise FormatError(
                f"shards[{k}].path is not a file name: {name!r:.80}", None, path, code=MANIFEST
            )
        records, nbytes = (_count(item.get(key), f"shards[{k}].{key}", path) for key in _COUNTS)
        digest = item.get("footer_sha256")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise FormatError(
                f"shards[{k}].footer_sha256 is not a SHA-256 in hex", None, path, code=MANIFEST
            )
        shards.append(ShardInfo(join(name), records, nbytes, digest))
    total = _count(doc.get("records"), "records", path)
    if total != sum(s.records for s in shards):
        raise FormatError(
            "records: the record total disagrees with the shard list", None, path, code=MANIFEST
        )
    first_at: dict[str, int] = {}  # shard path -> its first entry
    for k, shard in enumerate(shards):
        first = first_at.setdefault(shard.path, k)
        if first != k:
            reason = f"shards[{k}].path names the shard shards[{first}] names: {shard.path!r:.200}"
            raise FormatError(reason, None, path, code=MANIFEST)
    return shards


_COUNTS = ("records", "bytes")
_SHA256 = re.compile("[0-9a-f]{64}")
MAX_COUNT = (1 << 63) - 1  # counts are int64 in a ShardedDataset's index


def _count(value: Any, field: str, path: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise FormatError(
            f"{field} is not an integer in [0, 2^63): {value!r:.40}", None, path, code=MANIFEST
        )
    return value


def check_shard_files(shards: Sequence[ShardInfo], manifest: str) -> None:
    """Each shard a manifest lists must be a regular file now (one stat each), so that a
    missing shard fails at open, not at its first read."""
    for k, info in enumerate(shards):
        try:
            mode = os.stat(info.path).st_mode
        except OSError as exc:
            reason = f"shards[{k}].path {info.path}: {exc.strerror}"
            raise FormatError(reason, None, manifest, code=MANIFEST) from None
        if not stat.S_ISREG(mode):
            raise FormatError(
                f"shards[{k}].path {info.path} is not a regular file", None, manifest, code=MANIFEST
            )


def merge_manifests(inputs: Source, out: PathLike) -> str:
    """Combine manifests (paths, a glob or a list) into one at ``out``, in the order given.

    This is how shards from parallel ShardWriters become one dataset: each writer uses its
    own pattern and manifest, and one process merges them when all are done. A shard listed
    twice is an error. The shards are not opened; ``open_shards(out, validate=True)`` checks
    them. Returns the absolute path written.
    """
    manifests = _expand(inputs)
    if not manifests:
        raise FileNotFoundError(f"no manifests match {inputs!r}")
    shards = [s for m in manifests for s in read_manifest(m)]
    _check_unique(shards)
    return write_manifest(out, shards)


def _check_unique(shards: Sequence[ShardInfo]) -> None:
    seen: set[str] = set()
    for s in shards:
        key = os.path.realpath(s.path)
        if key in seen:  # (one manifest's own repeats are named by parse_manifest)
            raise FormatError(f"shard {s.path} is listed more than once", code=MANIFEST)
        seen.add(key)


def _is_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def _expand(source: Source) -> list[str]:
    """Paths named by a path, a glob, or a list of either (globs sorted)."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    out: list[str] = []
    for item in items:
        text = os.fspath(item)
        if not os.path.exists(text) and _is_glob(text):
            matches = sorted(glob.glob(text))
            if not matches:
                raise FileNotFoundError(f"no files match {text!r}")
            out.extend(matches)
        else:
            out.append(text)
    return out
