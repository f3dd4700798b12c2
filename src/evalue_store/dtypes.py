"""ExecuTorch ScalarType codes and their numpy equivalents.

numpy has no bfloat16, so bfloat16 tensors surface as arrays of the structured dtype
``BFLOAT16`` (one little-endian uint16 field named ``bfloat16`` holding the raw bits).
Writing such an array back stores bfloat16 again; ``bfloat16_to_float32`` widens it.
Arrays whose dtype is named ``bfloat16`` (ml_dtypes) are accepted on write as well.
"""

from __future__ import annotations

import numpy as np

from .errors import EncodeError

BFLOAT16 = np.dtype([("bfloat16", "<u2")])

# ScalarType code -> little-endian numpy dtype. Codes follow ExecuTorch's ScalarType enum.
CODE_TO_DTYPE: dict[int, np.dtype] = {
    0: np.dtype("<u1"),
    1: np.dtype("<i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<i8"),
    5: np.dtype("<f2"),
    6: np.dtype("<f4"),
    7: np.dtype("<f8"),
    9: np.dtype("<c8"),
    10: np.dtype("<c16"),
    11: np.dtype("?"),
    15: BFLOAT16,
    27: np.dtype("<u2"),
    28: np.dtype("<u4"),
    29: np.dtype("<u8"),
}

CODE_TO_NAME: dict[int, str] = {
    code: ("bfloat16" if dt is BFLOAT16 else dt.name) for code, dt in CODE_TO_DTYPE.items()
}

_KIND_SIZE_TO_CODE: dict[tuple[str, int], int] = {
    (dt.kind, dt.itemsize): code for code, dt in CODE_TO_DTYPE.items() if dt is not BFLOAT16
}


_CODE_CACHE: dict[np.dtype, int] = {}


def dtype_code(dtype: np.dtype) -> int:
    """The ScalarType code for a numpy dtype, or EncodeError if it has none."""
    code = _CODE_CACHE.get(dtype)
    if code is not None:
        return code
    if dtype == BFLOAT16 or dtype.name == "bfloat16":  # ours, or ml_dtypes.bfloat16
        code = 15
    else:
        code = _KIND_SIZE_TO_CODE.get((dtype.kind, dtype.itemsize))
        if code is None or dtype.fields is not None:
            raise EncodeError(f"numpy dtype {dtype} has no ExecuTorch ScalarType")
    _CODE_CACHE[dtype] = code
    return code


def bfloat16_to_float32(array: np.ndarray) -> np.ndarray:
    """Widen a BFLOAT16 (or raw uint16-bits) array to float32 exactly."""
    bits = array.view("<u2") if array.dtype == BFLOAT16 else np.asarray(array, "<u2")
    return (bits.astype("<u4") << 16).view("<f4")


def float32_to_bfloat16(array: np.ndarray) -> np.ndarray:
    """Round float32 values to nearest-even bfloat16, returned as a BFLOAT16 array."""
    bits = np.ascontiguousarray(array, "<f4").view("<u4")
    nan = np.isnan(bits.view("<f4"))
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = np.where(nan, (bits >> 16) | 0x40, rounded).astype("<u2")
    return out.view(BFLOAT16)
