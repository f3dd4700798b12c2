"""The fast paths of random reads from compressed files (frames.ZstdSource)."""

from __future__ import annotations

import numpy as np
import pytest

from evalue_store import seekable as sk


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
@pytest.mark.parametrize("start", [0, 1, 63, 64, 1000, 2**40 + 5])
def test_aligned_bytes(alignment, start):
    view = sk.aligned_bytes(100, start, alignment)
    arr = np.frombuffer(view, np.uint8)
    assert view.nbytes == 100 and not view.readonly and arr.flags.writeable
    assert (arr.ctypes.data - start) % alignment == 0
    assert view.tobytes() == bytes(100)
