"""Writer: creates or opens a container for appending, holds its lock, and commits and
closes it (docs/FORMAT.md §11); the writes themselves are ``append``."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
import warnings
import weakref
from typing import Any

from .. import __version__
from ..container import (
    DEFAULT_ALIGNMENT,
    DEFAULT_VERSION,
    ENTRY,
    ENTRY_SIZE,
    Commit,
    checksum_function,
    empty_commit,
    encode_header,
    new_file_id,
    version_flags,
)
from ..errors import LIMIT, NOT_A_CONTAINER, ClosedError, FormatError, UsageError
from ..files import (
    create_temp,
    fsync_dir,
    link_new,
    new_file_mode,
    open_locked,
    refuse_special,
    replace_held,
    replace_locked,
    same_file,
    unlock,
    writes_at_offsets,
)
from ..metadata import encode_metadata
from ..physical import Restart, new_sink, open_for_append, remote
from ..physical.salvage import Salvage, side_file
from ..physical.zframe import DEFAULT_LEVEL
from ..physical.zstd import AUTO, DEFAULT_FRAME_SIZE, MAX_FRAME_SIZE, check_dictionary
from .append import Appending, check_alignment, serialized
from .fields import WriterFields

MIN_FRAME_SIZE = 256  # below this, per-frame overhead outweighs the record; 1 record per frame


_LIVE_WRITERS: weakref.WeakSet = weakref.WeakSet()


def _disown_writers() -> None:
    """In a forked child, writers inherited from the parent share its descriptor and lock:
    using one would interleave the two processes' bytes. They refuse to, and closing or
    collecting them leaves the parent's file alone. The child's copy of the descriptor is
    closed at once: the lock goes only with the last descriptor of the open file, so a child
    that keeps it would hold the file locked after the parent closed its writer. Each gets a
    new mutex: the copy may be held by a parent's thread that the child does not have (one
    that was appending when another forked), and every call would wait for it forever."""
    for writer in list(_LIVE_WRITERS):
        writer._mutex = threading.RLock()
        writer._foreign = True
        writer._release()
        writer._failed = (
            f"this Writer belongs to process {writer._pid} (it was inherited by fork); "
            "open the file in this process instead"
        )


os.register_at_fork(after_in_child=_disown_writers)


KEPT_BY_APPEND = ("alignment", "format_version", "compression")  # a file's own, fixed


class Writer(WriterFields, Appending):
    """Appends records to a container file; ``commit()`` makes them durable and visible.

    ``mode``: "w" creates or truncates, "x" creates and fails if the file exists, "a" appends
    (creating the file if needed; a tail left by a crashed writer is salvaged first, see
    ``salvage``). ``close()``, or leaving the ``with`` block normally, commits; leaving it by an
    exception discards what was appended since the last commit (``abort()``). One writer per file:
    a second one raises WriterLockedError. Threads may share a Writer: its calls take turns.

    ``compression="zstd"`` stores the same container as seekable zstd frames of about
    ``frame_size`` bytes (docs/FRAMES.md), with a dictionary stored once at the start of the
    file: by default ("auto") one trained on the file's first frames, kept if it makes them
    smaller (the first MiB, or less at the first commit; the file is then rebuilt with it,
    as a new inode, before anything else is committed); bytes (from ``train_dictionary``
    or ``read_dictionary``) to use those; None for none (stock ``zstd -d`` then needs no
    ``-D``). In mode "a" the file's own compression settings apply.

    ``format_version``: "1.1" (default; CRC-32C checksums) or "1.0" (zlib's CRC-32, for
    readers that predate 1.1), for a new file; appending keeps the file's own version,
    which ``format_version`` then names.
    """

    def __new__(cls, path: str | os.PathLike = "", *args: Any, **kwargs: Any) -> Writer:
        # A URL or a filesystem: the remote writer (stages locally, uploads on close).
        if cls is Writer and (remote.is_url(path) or kwargs.get("filesystem") is not None):
            from ..shards.object_store import RemoteWriter

            return super().__new__(RemoteWriter)
        return super().__new__(cls)

    def __init__(
        self,
        path: str | os.PathLike,
        mode: str = "w",
        *,
        metadata: dict | None = None,
        alignment: int | None = None,
        durable: bool = True,
        compression: str | None = None,
        level: int = DEFAULT_LEVEL,
        frame_size: int = DEFAULT_FRAME_SIZE,
        dictionary: bytes | str | None = AUTO,
        format_version: str | None = None,
    ):
        if mode not in ("w", "x", "a"):
            raise UsageError(f"mode must be 'w', 'x' or 'a', not {mode!r}")
        asked = {
            "alignment": alignment,
            "format_version": format_version,
            "compression": compression,
        }
        alignment = DEFAULT_ALIGNMENT if alignment is None else alignment
        check_alignment(alignment)
        if compression not in (None, "zstd"):
            raise UsageError(f"compression must be None or 'zstd', not {compression!r}")
        if not MIN_FRAME_SIZE <= frame_size <= MAX_FRAME_SIZE:
            raise UsageError(
                f"frame_size must be in [{MIN_FRAME_SIZE}, {MAX_FRAME_SIZE}], not {frame_size}"
            )
        if isinstance(dictionary, str):
            if dictionary != AUTO:
                raise UsageError(f"dictionary must be bytes, None or {AUTO!r}, not {dictionary!r}")
            dictionary = None
            self._train = compression == "zstd"  # a new file's own, from its first frames
        else:
            self._train = False
            if dictionary is not None and compression != "zstd":
                raise UsageError("a dictionary needs compression='zstd'")
            if dictionary is not None:
                check_dictionary(dictionary)
        self._new_flags = version_flags(format_version or DEFAULT_VERSION)
        self.path = os.fspath(path)
        self.durable = durable
        self.salvage: Salvage | None = None
        self._metadata_bytes = encode_metadata(metadata)
        self._pending = bytearray()
        self._zstd = dict(level=level, frame_size=frame_size)
        self._fd = -1
        self._retired = -1  # the old file's descriptor while a rebuilt one takes its place
        self._failed = ""  # why the writer cannot go on, after a write it could not undo
        self._inflight: Commit | None = None  # a commit whose footer write has begun
        self._inflight_from = 0  # the logical end before its blocks (where an undo cuts)
        self._column_frames: tuple | None = None  # columns.append_columns' last layout, buffer
        self._mutex = threading.RLock()
        self._pid = os.getpid()
        self._foreign = False  # inherited by a forked child: never touch the file
        _LIVE_WRITERS.add(self)
        if mode == "w" and os.path.lexists(self.path):
            refuse_special(self.path)  # a rename would put the new file in its place
            self._replace(alignment, compression, dictionary)
            return
        if mode == "x" and os.path.lexists(self.path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), self.path)
        if not os.path.lexists(self.path):
            if self._create_new(alignment, compression, dictionary):
                return
            if mode == "x":  # another process created it meanwhile
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), self.path)
            if mode == "w":
                refuse_special(self.path)
                self._replace(alignment, compression, dictionary)
                return
        flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if mode != "a" else 0)
        self._fd = open_locked(self.path, flags)
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise FormatError(
                    "not a regular file: cannot hold a container",
                    None,
                    self.path,
                    code=NOT_A_CONTAINER,
                )
            if not writes_at_offsets(self._fd):
                raise FormatError(
                    "cannot be written at an offset (a /proc or /sys file): cannot hold a "
                    "container",
                    None,
                    self.path,
                    code=NOT_A_CONTAINER,
                )
            size = st.st_size
            if size:
                self._open_existing(size, metadata is not None, alignment)
                self._check_asked(asked)
            else:
                self._create(alignment, compression, dictionary)
                if self.durable:
                    fsync_dir(self.path)
        except BaseException:
            self._release()
            raise

    def _create_new(
        self, alignment: int, compression: str | None, dictionary: bytes | None
    ) -> bool:
        """A new file: built as a temporary file holding its header and first commit, then
        linked to its name, so that no reader ever finds it without them. False (and nothing
        changed) if a file took the name meanwhile."""
        try:
            self._fd, temp = create_temp(self.path, new_file_mode())
        except OSError as exc:  # name the file asked for, not the temporary one
            raise type(exc)(exc.errno, exc.strerror, self.path) from None
        try:
            self._create(alignment, compression, dictionary)
            linked = link_new(temp, self.path)
        except BaseException:
            self._release()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        if not linked:
            self._release()
            os.unlink(temp)
            return False
        if self.durable:
            fsync_dir(self.path)
        return True

    def _replace(self, alignment: int, compression: str | None, dictionary: bytes | None) -> None:
        """Mode "w" over an existing file: build the new, empty container as a new inode and
        rename it over the old one. Truncating in place would kill every reader that maps
        the old file (SIGBUS); this way they keep reading the old data."""
        target = os.path.realpath(self.path)  # through a symlink, as truncating went
        try:
            old_mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:  # a symlink to no file yet: the file it names is made
            old_mode = new_file_mode()
        self._fd, temp = create_temp(target, old_mode)
        try:
            self._create(alignment, compression, dictionary)
            replace_locked(temp, target, durable=self.durable)
        except BaseException:
            self._release()
            with contextlib.suppress(FileNotFoundError):  # gone if the rename happened
                os.unlink(temp)
            raise

    # ------------------------------------------------------------------ setup

    def _create(self, alignment: int, compression: str | None, dictionary: bytes | None) -> None:
        """Write the header and the first (empty) commit into the empty file at ``_fd``."""
        self.alignment = alignment
        self.file_id = new_file_id()
        self._use_flags(self._new_flags)
        info = f"evalue_store {__version__}"
        header = encode_header(alignment, self.file_id, time.time_ns(), info, self._new_flags)
        self._sink: Any = new_sink(self._fd, compression, dictionary, **self._zstd)
        self._start_writeback()
        self._commit = empty_commit(len(header))
        self._sink.write(header, len(header))
        self._metadata_dirty = True
        self._committed_size = 0
        self._commit_now()
        if self._train and dictionary is None:
            self._sink.hold(self._use_dictionary)

    def _offer_dictionary(self, dictionary: bytes | None) -> None:
        """If this new compressed file is still choosing its dictionary (nothing appended
        yet), it tries ``dictionary`` instead of training one, and keeps it only if it pays
        (``zstd_train.choose_dictionary``): how a ShardWriter's later shards reuse the
        first one's without a small last shard paying for it."""
        if dictionary is not None and getattr(self._sink, "held", None) == []:
            self._sink.offered = dictionary

    def _use_dictionary(self, dictionary: bytes) -> None:
        """The sink chose ``dictionary`` for this new file (``zstd_train``): rebuild the
        file with it as a new inode (its first commit, then the frames held back) and put
        that in its place, as mode "w" does, the lock held throughout. Readers that opened
        the old one keep reading it (its one commit has no record); ``refresh`` finds the
        new one, the same file by its id. Until the rename the old file stands as it was."""
        sink, commit = self._sink, self._commit
        committed = sink.read(0, commit.end)
        target = os.path.realpath(self.path)
        fd, temp = create_temp(target, stat.S_IMODE(os.fstat(self._fd).st_mode))
        try:
            sync = os.fsync if self.durable else lambda fd: None
            new = sink.rebuilt(
                fd, dictionary, committed, commit.end - commit.footer_offset, lambda: sync(fd)
            )
            replace_held(temp, target, self._fd, durable=self.durable)
            self._switch_to(new, fd)
        except BaseException:
            if not same_file(fd, target):  # the old file stands: forget the new one
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temp)
                raise
            # Renamed, then interrupted: the path names the new file, locked by fd. Going on
            # in the old one would let an undo cut the new file, and closing fd would unlock
            # it while this writer lives. So the switch is finished (each step of it can be
            # made twice) before the interrupt goes on.
            self._switch_to(new, fd)
            raise

    def _switch_to(self, new: Any, fd: int) -> None:
        """The writer goes on in the rebuilt file (``new``'s state, ``fd``, locked), whose
        first commit is its last; the old file's descriptor is closed."""
        self._sink.take(new)
        if self._fd != fd:
            self._retired = self._fd  # (kept first: an interrupt between loses nothing)
            self._fd = fd
        old, self._retired = self._retired, -1  # forgotten, then closed
        if old >= 0:
            unlock(old)
            os.close(old)
        offset, block = self._sink.marker
        self._committed_size = offset + len(block)

    @property
    def dictionary(self) -> bytes | None:
        """The zstd dictionary the file is written with (None: none, or not chosen yet)."""
        return getattr(self._sink, "dictionary", None)

    def _open_existing(self, size: int, new_metadata: bool, alignment: int) -> None:
        state = open_for_append(self._fd, size, self.path)
        if isinstance(state, Restart):  # nothing was ever committed: start it afresh
            side = side_file(self.path, self._fd, 0, size)
            os.ftruncate(self._fd, 0)  # no reader can have opened it: it has no commit
            self._create(alignment, "zstd", state.dictionary)
            self.salvage = Salvage(0, 0, size, size, side)
            return
        if state.commit.number >= (1 << 64) - 1:  # a footer's u64 counter cannot go on
            reason = "commit number is at its 64-bit maximum: cannot commit again"
            raise FormatError(reason, state.commit.footer_offset, code=LIMIT)
        self.alignment = state.header.alignment
        self.file_id = state.header.file_id
        self._use_flags(state.header.flags)  # an append keeps the file's version
        self._commit = state.commit
        self._metadata_dirty = new_metadata
        self.salvage = state.salvage
        self._committed_size = state.keep
        if state.keep < size:
            os.ftruncate(self._fd, state.keep)
        self._sink = state.sink(self._fd, **self._zstd)
        self._start_writeback()
        for offset, length, crc in state.found:
            self._pending += ENTRY.pack(offset, length, crc, 0)
        if state.found and not self._commit.record_count:  # their names died with the writer
            self._note_salvaged(state.found)
        if new_metadata:  # names it gives must fit the records, checked before the salvage
            self._field_state()  # commit below, which would store them (attacker's C01, C02)
        # Records salvaged into a file that had none wait for this writer's first commit
        # while their names are unknown: the first dict names them then, and an abort (a
        # refused dict leaving a with block) cuts the file back to ``state.keep``, leaving
        # them the tail they were, for the next writer to salvage and name. Committed now,
        # unnamed, no writer could name them (attacker's finding, session 13, C02).
        naming = bool(state.found) and not self._commit.record_count
        if naming and self._field_state().names is not None:
            naming = False  # named by the metadata given: committed with them now
        if self._commit.number == 0 or (state.found and not naming):
            self._commit_now()  # salvaged records become durable before anything new

    def _check_asked(self, asked: dict[str, Any]) -> None:
        """Mode "a" keeps the file's alignment, version and compression (KEPT_BY_APPEND):
        an explicit option in ``asked`` that contradicts them is a mistake to report, not
        to ignore."""
        compressed = "zstd" if self._sink.compressed else None
        have = {
            "alignment": self.alignment,
            "format_version": self.format_version,
            "compression": compressed,
        }
        for name in KEPT_BY_APPEND:
            if asked[name] is not None and asked[name] != have[name]:
                raise UsageError(
                    f"{self.path} has {name}={have[name]!r}, and appending keeps it: "
                    f"{name}={asked[name]!r} cannot apply (leave it out, or write a new file)"
                )

    def _start_writeback(self) -> None:
        """A durable writer's plain sink starts the writeback of what it wrote as it goes
        (PlainSink.writeback), so that a commit's fsync has less left to wait for."""
        if not self._sink.compressed:
            self._sink.writeback = self.durable

    def _use_flags(self, flags: int) -> None:
        self._checksum = checksum_function(flags)  # every checksum this writer computes
        self.format_version = "1.1" if flags else "1.0"

    @serialized
    def abort(self) -> None:
        """Discard the records appended since the last commit and release the file.

        The file is cut back to its last commit, so they do not come back as a salvageable
        tail (records this writer salvaged and still holds for their names stay one: see
        ``_open_existing``). Leaving a ``with`` block by an exception aborts; leaving it
        normally commits.
        A commit that was interrupted but took effect is kept (see ``commit``).
        """
        if self._fd < 0:
            return
        try:
            if self._foreign:
                return  # a forked child's copy: the file is its parent's to cut
            if self._inflight is not None and self._settle_inflight() is None:
                return  # cannot tell where the last commit ends: cut nothing
            os.ftruncate(self._fd, self._committed_size)
            self._sync()  # else a power cut could bring the discarded frames back, to salvage
            del self._pending[:]  # len() counts what the file holds
        finally:
            self._release()

    @serialized
    def close(self) -> None:
        """Commit and release the file (and its lock)."""
        if self._fd < 0:
            return
        if self._inflight is not None and not self._foreign:
            self._settle_inflight()
        if self._failed:
            reason = self._failed
            self.abort()
            raise ClosedError(f"{self.path}: {reason}")
        try:
            self.commit()
        finally:
            self._release()

    def _release(self) -> None:
        """Close the descriptor, forgetting it first: an interrupt after close(2) must not
        leave a number that a later close would take from whoever reuses it."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                if not self._foreign:  # a forked child that has not yet closed its copy of
                    unlock(fd)  # the descriptor would keep the lock; a child never unlocks
            finally:
                os.close(fd)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            f"a Writer cannot be pickled or copied: it owns the lock and descriptor of "
            f"{self.path}; pass the path and open a Writer where it is needed"
        )

    def __del__(self) -> None:
        # A forgotten writer releases its descriptor but does not commit from a finalizer:
        # what it appended since its last commit is lost, so say so, as files do.
        if getattr(self, "_fd", -1) < 0:
            return
        if not self._foreign:
            lost = len(self._pending) // ENTRY_SIZE
            warnings.warn(
                f"{self.path}: Writer was never closed; {lost} records appended since its last "
                "commit are not committed (use `with evs.Writer(...)` or call close())",
                ResourceWarning,
                source=self,
                stacklevel=2,
            )
        self._release()


def recover(path: str | os.PathLike) -> Salvage:
    """Salvage complete, checksum-valid records written after a file's last commit.

    The records found are committed; bytes that were not complete records are moved to a
    side file named in the report (never deleted). A file with no tail is left unchanged.
    """
    with Writer(path, mode="a") as writer:
        report = writer.salvage
        if report is None:
            count = writer._commit.record_count
            report = Salvage(count, 0, 0, 0, None)
    return report
