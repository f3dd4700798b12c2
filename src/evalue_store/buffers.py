"""What reads hand out: read-only views, and private writable arrays for the torch adapter.

Every array a read returns is a read-only view (``flags.writeable`` is False and cannot be
set) of memory that later reads reuse: the file mapping, or a cached decompressed frame. A
write into it would change what later reads return and, with ``verify=True``, look like a
damaged file; read-only views make such a write raise ``ValueError`` instead. What
Python reaches from them (``a.base``, ``memoryview.obj``) exports read-only buffers too:
the mapping is a ``FileMap``, a frame the compiled path decompressed a ``ZstdFrame``,
any other buffer a source filled a ``ReadOnly`` (``read_only``; all in ``_native``).

The torch adapter needs writable tensors (``torch.from_numpy`` warns about read-only arrays,
and transforms modify tensors in place), so ``private`` gives each array a writable twin
whose memory no later read shares:

* below ``MAP_BYTES``: a copy (a few hundred ns);
* at least ``MAP_BYTES`` of a plain file read through mmap: a new private (copy-on-write)
  mapping of just the pages holding it. No byte is copied: the pages are the page cache's
  until the caller writes one, and a write copies that page for this mapping only;
* otherwise (``backend="pread"``, a compressed file, a mapping that cannot be made): a
  copy. Those reads copied the bytes already (a read, a decompression): one memcpy more.
  (A pread buffer is not shared by later reads, but the read-only array the caller holds
  views it, and must not change when the tensor does.)
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from ._native import FileMap
from ._native import read_only as read_only

# read_only(buffer) -> memoryview: a read-only view of ``buffer`` (contiguous bytes the
# library filled: a pread, a decompressed or assembled frame) whose exporter is a
# ``_native.ReadOnly``: unlike ``memoryview(buffer).toreadonly()``, nothing reachable from it
# (``.obj``) exports the bytes writable, so no write from Python reaches later reads.

MAP_BYTES = 1 << 20  # arrays at least this big get a private mapping instead of a copy

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy < 2
    byte_bounds = np.byte_bounds


def map_file(fd: int, size: int) -> FileMap:
    """Map ``size`` bytes of ``fd`` copy-on-write, exported read-only (``FileMap``, in
    _native_readonly.cc: a mmap.mmap would export a writable buffer to whoever reaches it
    from an array, ``a.base.obj``). It keeps a duplicate of the descriptor, closed when the
    mapping is (``close_map``) or collected."""
    return FileMap(fd, size)


def close_map(m: FileMap) -> None:
    """Unmap and close the descriptor now, or leave both to the last view if any live."""
    try:
        m.close()
    except BufferError:
        return  # arrays still view it: the mapping and its descriptor go with the last one


def _root(array: np.ndarray) -> Any:
    """The object whose memory ``array`` views (through numpy bases and memoryviews)."""
    base: Any = array
    while True:
        if isinstance(base, np.ndarray):
            if base.base is None:
                return base
            base = base.base
        elif isinstance(base, memoryview):
            base = base.obj
        else:
            return base


def private(array: np.ndarray) -> np.ndarray:
    """``array`` itself if writable (the caller's own), else a writable array of the same
    values, shape and strides whose memory no later read shares (see the module text)."""
    if array.flags.writeable:
        return array
    if array.nbytes >= MAP_BYTES:
        root = _root(array)
        if isinstance(root, FileMap) and not root.closed:
            try:
                return _remap(array, root)
            except (OSError, ValueError):  # out of mappings (vm.max_map_count), ...
                pass
    return array.copy(order="K")


def _remap(array: np.ndarray, m: FileMap) -> np.ndarray:
    low, high = byte_bounds(array)
    offset = low - m.address
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    pages = mmap.mmap(m.fd, high - m.address - start, access=mmap.ACCESS_COPY, offset=start)
    at = array.ctypes.data - m.address - start
    return np.ndarray(array.shape, array.dtype, pages, at, array.strides)
