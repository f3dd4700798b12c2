"""Checksums of many byte ranges of one buffer in one call, for the paths that check or
write records by the batch (get_batch, get_many, scans, verify, columnar writes).

The work is done by the compiled ``evalue_store._native`` (src/evalue_store/_native.cc,
with the C++ reader's CRC code): a Python call per record cost more than the checksum of
a small record itself. It bounds-checks every range against the buffer and releases the
GIL for big batches. The extension is required: ``pip install -e .`` builds it (a C++
compiler and the Python headers, nothing else).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _native
from .container import Checksum, crc32, crc32c

NAMES = {crc32: "crc32", crc32c: "crc32c"}  # a file's checksum function -> _native's name


def checksum_ranges(checksum: Checksum, buf: Any, starts: np.ndarray, lengths: Any) -> np.ndarray:
    """``checksum`` (a file's: container.crc32 or crc32c) of every ``buf[s : s + length]``
    for s in ``starts`` (int64), as uint32; ``lengths`` is one int or an int64 array. A
    range outside ``buf`` raises ValueError naming it."""
    return _native.checksums(buf, starts, lengths, NAMES[checksum])
