"""File operations the durability promises rest on (docs/THREAT_MODEL.md).

- One writer per file: an exclusive ``flock`` on the open file, taken without waiting, and
  checked against the path afterwards so that a writer never ends up holding the lock of an
  inode that another process has just replaced.
- A file that readers may have mapped is never truncated or rewritten in place: it is
  replaced by a new inode (``os.replace``), while its lock is held, so that no writer can
  start on the old inode meanwhile.
- After a file is created or renamed, its directory is fsynced, or the new name may not
  survive a power cut although the file's own data did.
- A small file written whole (a manifest, a downloaded copy) is written to a temporary
  file, fsynced, then renamed into place (``atomic_file``): it is found complete or not
  at all.

POSIX only: reads and writes use ``os.pread``/``os.pwrite`` and the lock is ``flock``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import sys
from collections.abc import Iterator
from typing import IO, Any

from .errors import NOT_A_CONTAINER, FormatError, WriterLockedError

# Errors from fsync on a directory that mean "this filesystem does not do that", not "the
# data may be lost": the file's own fsync is all such a filesystem offers.
_DIR_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EBADF}
# Errors from link(2) that mean "this filesystem has no hard links".
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK}


def _sync_file_range() -> Any:
    """libc's sync_file_range (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages; no waiting


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes of the file from ``offset`` to the
    disk now, without waiting for them; a no-op where that cannot be asked (not Linux).

    This changes when pages reach the disk, never what an fsync guarantees: a later fsync
    still waits for every page and reports any write error (asking only to start, unlike
    waiting, does not consume the error). It lets a commit's fsync find most of the data
    already written."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # its result: see above


def lock(fd: int, path: str) -> None:
    """Take the file's exclusive writer lock without waiting, or raise WriterLockedError."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise WriterLockedError(f"{path}: another writer has this file open") from None


def unlock(fd: int) -> None:
    """Drop the writer lock of ``fd``'s open file, for every descriptor that shares it (a
    forked child's copy included), before the writer closes ``fd``."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` names the file open at ``fd`` now."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def open_path(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open``, where a path that names a socket (or a device without a driver), which
    the kernel refuses to open (ENXIO), is a FormatError like any file that is not regular."""
    try:
        return os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        reason = "not a regular file (a socket, or a device without a driver)"
        raise FormatError(reason, None, path, code=NOT_A_CONTAINER) from None


def writes_at_offsets(fd: int) -> bool:
    """False for a file that is regular by its type but refuses a write at an offset (a
    /proc or /sys file: ESPIPE), which a container is written with; probed by a write of
    no bytes, which changes nothing."""
    try:
        os.pwrite(fd, b"", 0)
    except OSError as exc:
        if exc.errno != errno.ESPIPE:
            raise
        return False
    return True


def open_locked(path: str, flags: int, mode: int = 0o644) -> int:
    """Open ``path`` with ``flags`` and hold its writer lock; returns the descriptor.

    Between the open and the lock another process may replace the file (a ``mode="w"``
    writer, a CLI ``--force``): the lock would then guard an inode nobody reads any more, and
    every commit would vanish with it. So the path is checked to still name the locked inode,
    and the open is retried if it does not.
    """
    for _ in range(100):
        fd = open_path(path, flags, mode)
        try:
            lock(fd, path)
            if same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if flags & os.O_EXCL:  # we created it and someone replaced it at once: theirs now
            raise WriterLockedError(f"{path}: replaced by another process while opening")
    raise WriterLockedError(f"{path}: replaced by other processes over and over while opening")


def fsync_dir(path: str) -> None:
    """fsync the directory holding ``path``, so that its entry (new or renamed) is durable."""
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def new_file_mode() -> int:
    """The permission bits a new container gets (0o644 less the umask, as open(2) with
    0o644 gives): a temporary file, created 0o600, is given them before it takes a name."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o644 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it the only other way there is
    os.umask(mask)
    return 0o644 & ~mask


def name_max(directory: str) -> int:
    """The longest file name, in bytes, that ``directory`` takes (255 where it cannot say)."""
    try:
        return os.pathconf(directory or ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def temp_name(path: str, prefix: str, suffix: str) -> str:
    """``prefix`` + ``path``'s name + ``suffix``, beside ``path``: a temporary name for it.

    When that is longer than the folder takes (NAME_MAX, 255 bytes on most filesystems), so
    that an OUT of a legal name near the limit could never be written, ``path``'s name is
    cut to fit and ``~`` with 8 hex digits of its SHA-256 follows the cut: the temporary
    name still starts with ``prefix`` and the start of ``path``'s name, ends in ``suffix``,
    and differs for two long names that start alike."""
    directory, base = os.path.split(path)
    name = prefix + base + suffix
    limit = name_max(directory)
    if len(os.fsencode(name)) <= limit:
        return os.path.join(directory, name)
    mark = "~" + hashlib.sha256(os.fsencode(base)).hexdigest()[:8]
    room = limit - len(os.fsencode(prefix + mark + suffix))
    if room < 1:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), path)
    kept, used = "", 0
    for char in base:  # whole characters only: a cut UTF-8 sequence is no text
        used += len(os.fsencode(char))
        if used > room:
            break
        kept += char
    return os.path.join(directory, prefix + kept + mark + suffix)


def create_temp(path: str, mode: int) -> tuple[int, str]:
    """A new, empty file beside ``path`` (same filesystem, so a rename can replace ``path``
    with it), with permission bits ``mode``, opened read-write and locked: (fd, its name).

    The name is chosen before the file is made, so an interrupt that arrives as open(2)
    returns (when the descriptor is not ours yet) still removes the file: O_EXCL means a
    file of that name that exists then is the one this call made."""
    beside = os.path.abspath(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temp = temp_name(beside, ".", f".{secrets.token_hex(6)}.new")
        try:
            fd = os.open(temp, flags, 0o600)
        except FileExistsError:
            continue
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        break
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", path)
    try:
        os.fchmod(fd, mode)
        lock(fd, temp)
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    return fd, temp


def replace_locked(source: str, path: str, *, durable: bool = True) -> None:
    """Put ``source`` at ``path`` unless a live writer holds ``path``.

    Raises WriterLockedError (and leaves both files alone) when a Writer has ``path`` open:
    replacing it would send that writer's later commits to an unlinked inode. ``path``'s
    lock is held across the rename, after checking that ``path`` still names the locked
    file (a writer may have replaced it meanwhile); where nothing is at ``path``, ``source``
    is linked there only if nothing appeared meanwhile. Then the directory is fsynced.
    """
    for _ in range(100):
        try:
            fd = open_locked(path, os.O_RDONLY | os.O_NONBLOCK)  # NONBLOCK: a FIFO is no wait
        except FileNotFoundError:
            if link_new(source, path):
                break
            continue  # a file appeared at path: lock it first
        try:
            os.replace(source, path)
        finally:
            os.close(fd)
        break
    else:
        raise WriterLockedError(f"{path}: replaced by other processes over and over")
    if durable:
        fsync_dir(path)


def replace_held(source: str, path: str, fd: int, *, durable: bool = True) -> None:
    """Put ``source`` at ``path`` while ``fd``, open on ``path`` with its writer lock, is held
    (taken before the work began, so no writer committed to ``path`` since). If ``path`` no
    longer names that file, a process that ignores the locks replaced it: fall back to
    replace_locked, which refuses a live writer's file."""
    if same_file(fd, path):
        os.replace(source, path)
        if durable:
            fsync_dir(path)
    else:
        replace_locked(source, path, durable=durable)


def link_new(source: str, path: str) -> bool:
    """Give ``source`` the name ``path`` if nothing has it: False if something does."""
    try:
        os.link(source, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        os.replace(source, path)  # no hard links here (FAT): a rename is the best there is
        return True
    os.unlink(source)
    return True


@contextlib.contextmanager
def atomic_file(
    path: str,
    *,
    durable: bool = True,
    replace: bool = True,
    mode: int | None = None,
    encoding: str | None = None,
) -> Iterator[IO]:
    """A whole new file at ``path``, written through the file object this yields (binary,
    or text in ``encoding``).

    The bytes go to a temporary file beside ``path`` (mode ``mode``, default that of a new
    container), fsynced, then renamed over ``path`` and the directory fsynced: readers find
    the old file or the new one, never a torn one. Without ``replace`` an existing ``path``
    is never replaced (FileExistsError). An exception removes the temporary file and leaves
    ``path`` as it was. ``durable=False`` skips both fsyncs.
    """
    fd, temp = create_temp(path, new_file_mode() if mode is None else mode)
    try:
        with os.fdopen(fd, "w" if encoding else "wb", encoding=encoding) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if replace:
            os.replace(temp, path)
        else:
            os.link(temp, path)  # FileExistsError if path exists
            os.unlink(temp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    if durable:
        fsync_dir(path)


def refuse_special(path: str) -> None:
    """A device, FIFO or socket is never replaced by a container (as root, /dev/full)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # a dangling link: the new file goes where it points
    if not stat.S_ISREG(mode):
        raise FormatError(
            "not a regular file (a device, FIFO or socket): a Writer never replaces one",
            None,
            path,
            code=NOT_A_CONTAINER,
        )
