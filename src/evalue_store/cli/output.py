"""Writing outputs: checked before any work, built under a temporary name, and renamed into
place only when complete, so an interrupted run never leaves half an output behind.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, BinaryIO

import evalue_store as evs

from ..container import MAGIC
from ..files import fsync_dir, open_locked, replace_held, replace_locked, temp_name
from ..physical.zstd import is_compressed
from .render import PROG, CliError

LOCKED = "a running writer has this file open; not replaced (wait until it exits)"

# Errors of a write that mean "no room for OUT": blamed on OUT, not on the command's input.
OUT_OF_SPACE = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}

# OUTs that --force replaces, by path: their writer lock, taken when refuse_overwrite checks
# them and held until the rename, so that no writer can open one and commit while the run
# works (its commit would be lost to the replacement, or missed when OUT is also the input).
_held: dict[str, int] = {}


def check_output(path: str) -> None:
    """An output's folder must exist (the errors would otherwise name the temporary file),
    and an existing output must be a regular file: outputs are replaced by a rename, which
    would put a file in place of a device (as root, /dev/full), a FIFO or a socket, and
    reading one to see whether it is a container could wait forever. An OUT that is a
    dangling link is written where the link leads, whose folder must exist too."""
    if not path:
        raise CliError('""', "no file name given")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(path, f"no such folder {folder}")
    if os.path.isdir(path):
        raise CliError(path, "is a directory; give a file name")
    if os.path.basename(path) in ("", ".", ".."):  # out.evs/: the temporary name would be in it
        end = os.path.basename(path) or "/"
        raise CliError(path, f"names a folder (it ends in '{end}'), not a file; give a file name")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        target = os.path.realpath(path)
        if os.path.islink(path) and not os.path.isdir(os.path.dirname(target)):
            raise CliError(
                path, f"no such folder {os.path.dirname(target)} (the link leads to {target})"
            ) from None
        return  # none yet (or a dangling link: the rename decides)
    if not stat.S_ISREG(mode):
        raise CliError(path, "is not a regular file (a device, FIFO or socket); give a file name")


def refuse_container(path: str, what: str) -> None:
    """A page or a dictionary never replaces a container (`stats F --html F`): it may hold
    the only copy of its data."""
    check_output(path)  # not a FIFO or device, whose read could wait forever
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError:
        return
    if head == MAGIC or is_compressed(head):
        raise CliError(path, f"is an evalue_store container; {what} never replaces one")


def refuse_input(path: str, inputs: list[str]) -> None:
    """An output that is one of the command's inputs (by another name too: a link, a
    relative path) is refused, --force or not: replacing it would destroy what is read."""
    if not os.path.exists(path):
        return
    for source in inputs:
        try:
            same = os.path.samefile(path, source)
        except OSError:
            continue
        if same:
            raise CliError(path, f"is an input of this command ({source}); it is never replaced")


def refuse_overwrite(path: str, force: bool, append: bool = False) -> None:
    """Replacing a container takes --force: it may hold the only copy of some data. Checked
    before any work: OUT's folder must exist, OUT must not be a folder nor a live writer's."""
    check_output(path)
    if not os.path.exists(path):
        return
    if not force:
        flags = "--append to add to it or --force" if append else "--force"
        raise CliError(path, f"already exists; use {flags} to replace it")
    release(path)
    try:
        _held[path] = open_locked(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO is no wait
    except evs.WriterLockedError:
        raise CliError(path, LOCKED) from None
    except OSError:
        return  # unreadable: the rename decides


def release(path: str | None = None) -> None:
    """Let go of the lock refuse_overwrite took on ``path`` (on all, without one)."""
    for name in [path] if path is not None else list(_held):
        fd = _held.pop(name, None)
        if fd is not None:
            os.close(fd)


@contextmanager
def replacing(path: str, *, clobber: bool = True, durable: bool = True) -> Iterator[str]:
    """A temporary name beside ``path`` to build the output under; when the block ends, it is
    renamed to ``path`` (to the file a symlink names) and the folder fsynced (``durable``).
    OUT is a new file then: another hard link to the old one keeps the old bytes. On any
    exception, Ctrl-C and SIGTERM included, the temporary file is removed, so ``path`` is as
    it was or complete.

    The rename is refused while a running Writer holds ``path`` (its later commits would go
    to an unlinked inode); without ``clobber`` an existing ``path`` is never replaced.
    """
    check_output(path)
    # A symlink to a file stays one: the file it names is replaced (as Writer(link, "a")
    # appends to it), else the link would become a copy and the file keep its old records.
    # Without clobber a link is never followed.
    target = os.path.realpath(path) if clobber and os.path.islink(path) else path
    temp = temp_name(target, "", f".{os.getpid()}-{secrets.token_hex(3)}.partial")
    try:
        yield temp
        if clobber:
            try:
                held = _held.pop(path, None)
                if held is None:
                    replace_locked(temp, target, durable=durable)
                else:
                    try:
                        replace_held(temp, target, held, durable=durable)
                    finally:
                        os.close(held)
            except evs.WriterLockedError:
                raise CliError(path, LOCKED) from None
        else:
            exists = CliError(path, "already exists; use --force to overwrite")
            try:
                os.link(temp, path)  # atomic, and fails if path exists
                os.unlink(temp)
            except FileExistsError:
                raise exists from None
            except OSError as exc:  # no hard links (FAT, some network filesystems)
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP):
                    raise
                if os.path.exists(path):
                    raise exists from None
                os.rename(temp, path)
            if durable:
                fsync_dir(path)
    except BaseException as exc:
        release(path)
        with suppress(FileNotFoundError):
            os.unlink(temp)
        if isinstance(exc, OSError) and exc.errno in OUT_OF_SPACE and exc.filename is None:
            raise CliError(path, exc.strerror or str(exc)) from None  # not the input's fault
        if isinstance(exc, OSError) and temp in (exc.filename, exc.filename2):
            # the temporary name is no name the user gave: OUT is (a read-only filesystem,
            # a folder removed meanwhile, no permission)
            raise CliError(path, exc.strerror or str(exc)) from None
        raise


@contextmanager
def new_file(path: str, *, clobber: bool = True, durable: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s bytes into; they appear under ``path`` only when
    complete and fsynced (see ``replacing``)."""
    with replacing(path, clobber=clobber, durable=durable) as temp, open(temp, "xb") as out:
        yield out
        out.flush()
        os.fsync(out.fileno())


@contextmanager
def output_writer(
    path: str,
    *,
    append: bool,
    force: bool,
    metadata: dict | None,
    alignment: int = 64,
    **options: Any,
) -> Iterator[evs.Writer]:
    """A Writer for OUT. A new file is built under a temporary name and renamed when complete,
    so a failed run never leaves a half-written OUT behind (nor replaces an old one).
    ``options`` go to evs.Writer for a new file (compression settings, format version); an
    appended OUT keeps its own."""
    if append and os.path.exists(path):
        # Into a copy of OUT, renamed over it when complete: a killed run must leave no
        # records of its own in OUT, which the next writer would salvage and commit (and a
        # retry would then add again). OUT's lock is held throughout.
        check_output(path)
        release(path)
        try:
            _held[path] = held = open_locked(path, os.O_RDONLY | os.O_NONBLOCK)
        except evs.WriterLockedError:
            raise CliError(path, LOCKED) from None
        salvage = None
        try:
            with replacing(path) as temp:
                _copy_file(held, temp)
                with evs.Writer(temp, "a", metadata=metadata) as writer:
                    salvage = writer.salvage
                    yield writer
        except BaseException:
            if salvage is not None and salvage.side_file:  # OUT still holds those bytes
                with suppress(FileNotFoundError):
                    os.unlink(salvage.side_file)
            raise
        if salvage is not None:
            side = _side_name(salvage.side_file, path) if salvage.side_file else None
            print(
                f"{PROG}: {path}: salvaged {salvage.salvaged_records} records of a crashed "
                "writer first" + (f"; damaged tail kept in {side}" if side else ""),
                file=sys.stderr,
            )
        return
    if append:  # nothing to add to: a new file, which a file appearing meanwhile beats
        check_output(path)
        with replacing(path, clobber=False) as temp:
            with evs.Writer(temp, "x", metadata=metadata, alignment=alignment, **options) as writer:
                yield writer
        return
    refuse_overwrite(path, force)
    with replacing(path) as temp:
        with evs.Writer(temp, "x", metadata=metadata, alignment=alignment, **options) as writer:
            yield writer


def _side_name(side: str, path: str) -> str:
    """The side file a salvage in the temporary copy made (``TEMP.tail-N``), renamed as a
    salvage of OUT itself names it (``OUT.tail-N``, made unique), so that it says where its
    bytes came from and does not look like a leftover temporary file."""
    start = re.search(r"\.tail-(\d+)(\.\d+)?$", side).group(1)
    name, counter = temp_name(path, "", f".tail-{start}"), 0
    while True:
        try:
            os.link(side, name)  # fails if the name is taken
            break
        except FileExistsError:
            counter += 1
            name = temp_name(path, "", f".tail-{start}.{counter}")
        except OSError:  # no hard links here: keep the name it has
            return side
    os.unlink(side)
    fsync_dir(name)
    return name


def _copy_file(fd: int, temp: str) -> None:
    """Copy the file open at ``fd`` into a new file ``temp`` with its permission bits (in
    the kernel, and by reflink where the filesystem shares blocks)."""
    with open(temp, "xb") as out:
        os.fchmod(out.fileno(), os.fstat(fd).st_mode & 0o7777)
        offset, size = 0, os.fstat(fd).st_size
        while offset < size:
            try:
                n = os.copy_file_range(fd, out.fileno(), size - offset, offset, offset)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                chunk = os.pread(fd, min(size - offset, 1 << 24), offset)
                n = os.pwrite(out.fileno(), chunk, offset)
            if n == 0:
                break
            offset += n
