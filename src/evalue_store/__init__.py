"""evalue_store: memory-mapped, append-only storage for ExecuTorch EValue[] training records."""

from .dtypes import BFLOAT16, bfloat16_to_float32, float32_to_bfloat16
from .errors import EncodeError, FormatError, WriterLockedError
from .values import (
    Bool,
    Double,
    Int,
    Kind,
    ListBool,
    ListDouble,
    ListInt,
    ListOptionalTensor,
    ListTensor,
    String,
    Tensor,
    Typed,
)

__version__ = "0.1.0"

__all__ = [
    "BFLOAT16",
    "Bool",
    "Double",
    "EncodeError",
    "FormatError",
    "Int",
    "Kind",
    "ListBool",
    "ListDouble",
    "ListInt",
    "ListOptionalTensor",
    "ListTensor",
    "String",
    "Tensor",
    "Typed",
    "WriterLockedError",
    "bfloat16_to_float32",
    "float32_to_bfloat16",
]
