"""Shards in object storage: finding them (a manifest, a glob, a directory) and writing them.

Reading: a manifest costs one GET (shards are checked against it when first opened, as
locally); a glob or a directory one listing, and without a manifest each shard is opened
once to count its records. Writing: object stores have no append, so each shard is written
to a local staging file by a normal Writer, committed and closed, then uploaded whole (an
object appears complete or not at all); the manifest is uploaded last, so a reader that
finds it finds every shard it lists complete.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
import warnings
from typing import Any

from ..dataset.reader import open_dataset
from ..dataset.writer import Writer
from ..errors import LIMIT, MANIFEST, FormatError, UsageError
from ..physical.remote import _retrying, resolve
from ..physical.remote_store import forget, info_now
from .manifest import directory_members

MAX_MANIFEST = 256 << 20  # a manifest is JSON for the whole dataset: refuse more than this


def _join(fs: Any, base: str, name: str) -> str:
    """The URL of ``name`` relative to directory ``base`` (a path within ``fs``, which for
    HTTP is itself a URL: its "//" must survive the normalization)."""
    if "://" in base:
        scheme, rest = base.split("://", 1)
        return f"{scheme}://{posixpath.normpath(posixpath.join(rest, name))}"
    return fs.unstrip_protocol(posixpath.normpath(posixpath.join(base, name)))


def read_remote_manifest(fs: Any, inner: str, url: str, parse: Any) -> list:
    """The shards a remote manifest lists (URLs), parsed by ``parse(doc, url, join)``."""
    size = int(_retrying(lambda: info_now(fs, inner), url, "info")["size"])
    if size > MAX_MANIFEST:
        raise FormatError(f"manifest of {size} bytes, over {MAX_MANIFEST}", None, url, code=LIMIT)
    raw = _retrying(lambda: fs.cat_file(inner, start=0, end=size), url, "read")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"manifest is not JSON: {exc}", None, url, code=MANIFEST) from None
    base = posixpath.dirname(inner)
    return parse(doc, url, lambda name: _join(fs, base, name))


def _listed_root(inner: str) -> str:
    """The directory a glob lists (under its first wildcard), or the path itself."""
    cut = min((inner.index(c) for c in "*?[" if c in inner), default=-1)
    return inner if cut < 0 else posixpath.dirname(inner[:cut])


def expand_remote(
    source: Any, filesystem: Any, storage_options: dict | None, suffixes: tuple[str, ...]
) -> list[tuple[Any, str, str]]:
    """(filesystem, path, URL) of each manifest or shard a remote source names: URLs, globs
    (sorted), directories (``directory_members``)."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    out = []
    for item in items:
        fs, inner, url = resolve(item, filesystem, storage_options)
        forget(fs, _listed_root(inner))  # the store as it is now, not a listing seen before
        if any(c in inner for c in "*?["):
            matches = sorted(_retrying(lambda: fs.glob(inner), url, "glob"))  # noqa: B023
            if not matches:
                raise FileNotFoundError(f"no objects match {url!r}")
            out.extend((fs, m, fs.unstrip_protocol(m)) for m in matches)
        elif inner.endswith(suffixes + (".json",)):
            out.append((fs, inner, url))
        else:
            names = _retrying(lambda: fs.ls(inner, detail=False), url, "list")  # noqa: B023
            members = directory_members(names)
            if not members:
                raise FileNotFoundError(
                    f"{url}: no manifest.json, no *.manifest.json and no shard files"
                )
            out.extend((fs, m, fs.unstrip_protocol(m)) for m in members)
    return out


def check_listed(fs: Any, shards: list, manifest: str) -> None:
    """Every shard a manifest lists must exist now: one listing per directory they are in
    (not one request per shard; a store that cannot list is asked per shard), so that a
    missing shard fails at open."""
    by_dir: dict[str, set[str] | None] = {}
    for k, info in enumerate(shards):
        inner = fs._strip_protocol(info.path)
        directory = posixpath.dirname(inner)
        if directory not in by_dir:
            forget(fs, directory)
            try:
                listed = fs.ls(directory, detail=False)
                by_dir[directory] = {fs._strip_protocol(n) for n in listed}
            except Exception:  # no listing (an HTTP server without an index page): ask each
                by_dir[directory] = None
        names = by_dir[directory]
        exists = inner in names if names is not None else _exists(fs, inner, manifest)
        if not exists:
            reason = f"shards[{k}].path {info.path}: no such object"
            raise FormatError(reason, None, manifest, code=MANIFEST)


def _exists(fs: Any, path: str, url: str) -> bool:
    """Whether an object exists, asked by its info (a HEAD): fsspec's HTTP ``exists`` is
    an unranged GET, which a server answers with the whole object."""
    try:
        _retrying(lambda: info_now(fs, path), url, "info")
    except FileNotFoundError:
        return False
    return True


def upload_kept(fs: Any, local: str, target: str, url: str) -> None:
    """Upload the staging file ``local`` to ``target``. If that fails, the file stays where
    it is, holding every committed record, and the error says so (where Python can add a
    note to it): the caller's only copy of them is never deleted for a failed upload."""
    try:
        _retrying(lambda: fs.put_file(local, target), url, "upload")
    except BaseException as exc:
        if hasattr(exc, "add_note"):
            exc.add_note(f"the committed records are kept in {local}: upload it to {url}")
        raise


class Staging:
    """Where a ShardWriter aimed at a URL writes each shard before uploading it."""

    def __init__(
        self,
        pattern: str,
        manifest: str | None,
        default_manifest: str,
        filesystem: Any,
        storage_options: dict | None,
        overwrite: bool,
    ):
        self.fs, self.pattern, _ = resolve(pattern, filesystem, storage_options)
        self.manifest = self.fs._strip_protocol(manifest or default_manifest)
        self.overwrite = overwrite
        # As for a local pattern, when the ShardWriter is built: a rerun that writes nothing
        # would otherwise replace the finished job's manifest with an empty one at close.
        if not overwrite and _exists(self.fs, self.manifest, self.manifest_url):
            raise FileExistsError(
                f"{self.manifest_url}: a finished job's manifest is there; rerunning into the "
                "same place needs overwrite=True (or another pattern or manifest)"
            )
        self.dir = tempfile.mkdtemp(prefix="evalue_store-upload-")
        self.local_pattern = os.path.join(self.dir, "shard-{:08d}.evs")

    @property
    def manifest_url(self) -> str:
        return self.fs.unstrip_protocol(self.manifest)

    def upload_shard(self, n: int, local: str) -> str:
        """Upload staged shard ``n`` to its place and drop the local copy; returns its URL."""
        target = self.pattern.format(n)
        url = self.fs.unstrip_protocol(target)
        if not self.overwrite and _exists(self.fs, target, url):
            raise FileExistsError(f"{url} exists (pass overwrite=True to replace it)")
        upload_kept(self.fs, local, target, url)
        os.unlink(local)
        return url

    def upload_manifest(self, doc: dict) -> str:
        base = posixpath.dirname(self.manifest)
        for shard in doc["shards"]:
            shard["path"] = posixpath.relpath(self.fs._strip_protocol(shard["path"]), base)
        data = (json.dumps(doc, indent=1) + "\n").encode()
        url = self.manifest_url
        _retrying(lambda: self.fs.pipe_file(self.manifest, data), url, "upload")
        return url

    def cleanup(self) -> None:
        """Remove the staging directory, unless it still holds a shard with committed
        records that was not uploaded (a failed upload, or the shard a failing job was
        writing): that one stays, and a warning names it."""
        kept = []
        for name in sorted(os.listdir(self.dir)) if os.path.isdir(self.dir) else []:
            local = os.path.join(self.dir, name)
            try:
                with open_dataset(local, verify=False) as ds:
                    records = len(ds)
            except (OSError, ValueError):
                records = 0  # nothing committed that can be read back
            if records:
                kept.append(f"{local} ({records} records)")
        if kept:
            warnings.warn(
                "shards not uploaded, their committed records kept: " + ", ".join(kept),
                stacklevel=3,
            )
            return
        shutil.rmtree(self.dir, ignore_errors=True)


class RemoteWriter(Writer):
    """A Writer aimed at a URL: it writes a local staging file and uploads it whole when it
    closes (an object store has no append). Mode "a" is refused.

    ``commit()`` makes records durable in the staging file (``path``: a directory
    ``evalue_store-upload-*`` under the temporary directory, the file named as the object);
    the object appears, complete, only at ``close()``, or at ``abort()`` if records were
    committed (as a local file keeps them; with none, abort uploads nothing). A writer
    killed before then leaves the staging file, which holds every record committed, for
    the caller to upload."""

    def __init__(
        self,
        path: str | os.PathLike,
        mode: str = "w",
        *,
        filesystem: Any = None,
        storage_options: dict | None = None,
        **options: Any,
    ):
        if mode not in ("w", "x"):
            raise UsageError(f"a Writer to a URL takes mode 'w' or 'x', not {mode!r}")
        self.fs, self.target, self.url = resolve(path, filesystem, storage_options)
        if mode == "x" and _exists(self.fs, self.target, self.url):
            raise FileExistsError(f"{self.url} exists")
        self.staging = tempfile.mkdtemp(prefix="evalue_store-upload-")
        name = posixpath.basename(self.target.rstrip("/")) or "upload.evs"
        super().__init__(os.path.join(self.staging, name), "x", **options)

    # The staging file goes only once it is uploaded: if closing or the upload fails, it
    # stays (``path``), holding every record committed.
    def close(self) -> None:
        if self._fd < 0:
            return
        super().close()
        upload_kept(self.fs, self.path, self.target, self.url)
        shutil.rmtree(self.staging, ignore_errors=True)

    def abort(self) -> None:
        if self._fd < 0:
            return
        super().abort()
        if self._commit.record_count and not self._foreign:  # committed: never dropped
            upload_kept(self.fs, self.path, self.target, self.url)
        shutil.rmtree(self.staging, ignore_errors=True)
