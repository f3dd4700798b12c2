"""The zstd frame layer: the container's bytes stored as standard zstd frames.

The logical byte stream is exactly a plain container (docs/FORMAT.md), so ``zstd -d`` turns
a compressed file back into it. New files use layout 2, whose per-commit index blocks let a
lookup read one locator and the frames holding the record (``zstd_source``, ``zstd_sink``);
layout-1 files (a seek table per commit) stay readable and appendable (``zstd_legacy``).
The layout is told from the file's first frame. See docs/FRAMES.md.
"""

from __future__ import annotations

import os
from typing import Any

import zstandard

from ..bounded import open_regular
from ..byteio import FdReader, MapReader
from ..container import (
    DEFAULT_VERSION,
    Commit,
    Header,
    checksum_function,
    open_container,
    version_flags,
)
from ..errors import FormatError, UsageError
from . import zstd_legacy as legacy
from .zframe import DEFAULT_LEVEL, SKIPPABLE_HEADER
from .zstd_layout import LAYOUT_MAGIC, find_last_block, read_layout
from .zstd_sink import ZstdFile, ZstdSink
from .zstd_source import ZstdSource
from .zstd_train import best_dictionary

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_LAYOUT_MAGIC = SKIPPABLE_HEADER.pack(LAYOUT_MAGIC, 0)[:4]
DEFAULT_FRAME_SIZE = 2 << 10  # measured (FRAMES.md section 7): one W1 record a frame
AUTO = "auto"  # Writer(dictionary=AUTO): a new file's own, trained on its first frames
MAX_FRAME_SIZE = legacy.MAX_FRAME_SIZE  # the largest frame a writer makes; readers' cap
DEFAULT_CACHE_BYTES = 32 << 20
MAX_DICT_SIZE = legacy.MAX_DICT_SIZE


def is_compressed(prefix: bytes) -> bool:
    """True for a file that starts with a layout frame, a zstd frame or a dictionary frame."""
    return prefix[:4] in (_LAYOUT_MAGIC, ZSTD_MAGIC, legacy.DICT_MAGIC)


def open_reader(
    reader: Any, *, cache_bytes: int = DEFAULT_CACHE_BYTES, max_frame_size: int = MAX_FRAME_SIZE
) -> tuple[Any, Header, Commit]:
    """A source over a compressed file read through ``reader`` (``byteio``: local or remote),
    its header and last commit. The source owns the reader."""
    try:
        if bytes(reader.pread(0, 4)) == _LAYOUT_MAGIC:
            source: Any = ZstdSource(reader, cache_bytes=cache_bytes, max_frame_size=max_frame_size)
        else:
            source = legacy.ZstdSource(
                reader, cache_bytes=cache_bytes, max_frame_size=max_frame_size
            )
    except BaseException:
        reader.close()
        raise
    try:
        header, commit = open_container(source)
    except BaseException:
        source.close()
        raise
    return source, header, commit


def open_zstd(
    fd: int, size: int, *, cache_bytes: int, max_frame_size: int, backend: str = "mmap"
) -> tuple[Any, Header, Commit]:
    """Open the compressed file at ``fd`` (the source takes the descriptor). The last
    commit is found with ``pread`` (a writer may be cutting the tail after it); with
    ``backend="mmap"`` the committed bytes are then read from a mapping."""
    reader = FdReader(fd, size, owns_fd=True)
    source, header, commit = open_reader(
        reader, cache_bytes=cache_bytes, max_frame_size=max_frame_size
    )
    if backend == "mmap":
        try:
            mapped = MapReader(fd, source.physical_end, reader.name, owns_fd=True)
        except BaseException:
            source.close()
            raise
        reader.held.owned = False  # the mapping's reader closes the descriptor now
        source.reader = mapped
    return source, header, commit


def new_zstd_sink(fd: int, dictionary: bytes | None, *, level: int, frame_size: int) -> ZstdSink:
    """A sink for a new, empty file: it starts with the layout frame."""
    return ZstdSink.create(fd, dictionary, level=level, frame_size=frame_size)


def append_state(fd: int, size: int, path: str) -> ZstdFile | legacy.ZstdFile:
    """The state of an existing compressed file opened for appending: an append goes on in
    the file's own layout."""
    if os.pread(fd, 4, 0) == _LAYOUT_MAGIC:
        return ZstdFile(fd, size, path)
    return legacy.ZstdFile(fd, size, path)


def died_before_first_commit(fd: int, size: int) -> bytes | None:
    """For a compressed file whose writer died while creating it (nothing committed): its
    dictionary (b"" if none). None for any other file."""
    reader = FdReader(fd, size)
    if os.pread(fd, 4, 0) != _LAYOUT_MAGIC:
        return legacy.died_before_first_commit(reader)
    try:
        layout_end, dictionary = read_layout(reader)
        if find_last_block(reader, size, layout_end) is not None:
            return None
    except FormatError:
        return None
    return legacy.restart_dictionary(reader, layout_end, dictionary)


def check_dictionary(dictionary: Any) -> None:
    """Refuse, before a file is touched, a dictionary a reader would refuse (larger than
    MAX_DICT_SIZE, docs/FRAMES.md) or that zstd cannot use: its records would be written
    into a file no reader opens, or not at all."""
    if not isinstance(dictionary, (bytes, bytearray, memoryview)):
        raise UsageError(f"dictionary must be bytes, not {type(dictionary).__name__}")
    size = memoryview(dictionary).nbytes
    if size > MAX_DICT_SIZE:
        raise UsageError(f"dictionary of {size} bytes, over the {MAX_DICT_SIZE} readers accept")
    if not size:
        return
    try:
        data = zstandard.ZstdCompressionDict(bytes(dictionary))
        sample = zstandard.ZstdCompressor(dict_data=data).compress(b"evalue_store")
        zstandard.ZstdDecompressor(dict_data=data).decompress(sample)
    except zstandard.ZstdError as exc:
        raise UsageError(f"zstd cannot use this dictionary: {exc}") from None


def train_dictionary(records: Any, size: int = 64 << 10, alignment: int = 64) -> bytes:
    """Train a zstd dictionary on sample records (lists of values), for ``Writer(dictionary=)``.

    Small records compress poorly one frame at a time; a dictionary trained on a few
    hundred typical records recovers most of what whole-file compression would gain. A
    new file's writer trains its own by default (on its first frames, the same way):
    this is for one dictionary shared by files written apart, or trained on chosen records.
    """
    from ..codec import encode_record
    from ..dataset.fields import Fields

    checksum = checksum_function(version_flags(DEFAULT_VERSION))  # as a new file's records

    samples = []
    for record in records:
        values, _ = Fields().values(record)  # a dict record: its values, as a writer stores
        chunks, _, _ = encode_record(values, alignment, checksum)
        samples.append(b"".join(bytes(memoryview(c).cast("B")) for c in chunks))
    if len(samples) < 8:
        raise UsageError(
            f"training a dictionary needs at least 8 sample records, got {len(samples)}"
        )
    dictionary, _ = best_dictionary(samples, size, DEFAULT_LEVEL)
    if dictionary is None:
        raise UsageError("zstd could not train a dictionary from these samples")
    return dictionary


def read_dictionary_file(path: str | os.PathLike) -> bytes | None:
    """The dictionary stored in a compressed container (for ``zstd -d -D``), or None."""
    fd = open_regular(os.fspath(path))  # a FIFO would block
    reader = FdReader(fd, os.fstat(fd).st_size, owns_fd=True)
    try:
        if bytes(reader.pread(0, 4)) == _LAYOUT_MAGIC:
            return read_layout(reader)[1]
        return legacy.read_dictionary(reader, reader.size)
    finally:
        reader.close()
