"""Where a Ray write (``evalue_store.ray``) puts its shards and manifest: a local directory,
or a directory of an fsspec filesystem, to which each finished file is uploaded whole."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable
from typing import Any

from .physical import remote

logger = logging.getLogger("evalue_store.ray")  # its messages are the Ray write's


class Target:
    """The directory a write goes to: a local path, or a directory of an fsspec filesystem."""

    def __init__(self, path: str, filesystem: Any, storage_options: dict | None):
        if filesystem is None and not remote.is_url(path):
            self.fs = None
            self.root = os.path.abspath(path.removeprefix("file://"))
            return
        self.fs, inner, _ = remote.resolve(path, filesystem, storage_options)
        self.root = inner.rstrip("/")

    def join(self, name: str) -> str:
        return os.path.join(self.root, name) if self.fs is None else f"{self.root}/{name}"

    def makedirs(self) -> None:
        if self.fs is None:
            if os.path.lexists(self.root) and not os.path.isdir(self.root):
                raise NotADirectoryError(
                    errno.ENOTDIR, "a file, where shards need a directory", self.root
                )
            os.makedirs(self.root, exist_ok=True)
        else:
            self.fs.makedirs(self.root, exist_ok=True)

    def exists(self, name: str) -> bool:
        path = self.join(name)
        if self.fs is None:
            return os.path.lexists(path)
        self.fs.invalidate_cache(self.root)  # other processes wrote since the last listing
        return self.fs.exists(path)

    def names(self) -> list[str]:
        """The names in the directory (none if it does not exist)."""
        if self.fs is None:
            return os.listdir(self.root) if os.path.isdir(self.root) else []
        self.fs.invalidate_cache(self.root)
        if not self.fs.isdir(self.root):
            return []
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]

    def touch(self, name: str) -> None:
        if self.fs is None:
            open(self.join(name), "w").close()
        else:
            self.fs.pipe_file(self.join(name), b"")

    def remove(self, names: Iterable[str]) -> list[str]:
        """Remove ``names``; returns those that could not be removed."""
        failed = []
        for name in names:
            try:
                if self.fs is None:
                    os.unlink(self.join(name))
                else:
                    self.fs.rm(self.join(name))
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("could not remove %s: %s", self.join(name), exc)
                failed.append(name)
        return failed


def publish_file(local: str, target: Target, name: str) -> None:
    """Put a finished local file (a shard, the manifest) into the target as ``name``: a
    local target holds it already; to an fsspec one it is uploaded whole (object stores do
    not append), and the local copy removed. The one place a write leaves this machine."""
    if target.fs is None:
        return
    path = target.join(name)
    remote._retrying(
        lambda: target.fs.put_file(local, path), target.fs.unstrip_protocol(path), "upload"
    )
    os.unlink(local)
