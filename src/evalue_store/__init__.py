"""evalue_store: memory-mapped, append-only storage for ExecuTorch EValue[] training records."""

from .dataset.reader import Dataset, VerifyReport
from .dataset.reader import open_dataset as open
from .dtypes import BFLOAT16, bfloat16_to_float32, float32_to_bfloat16
from .errors import (
    BatchError,
    ClosedError,
    EncodeError,
    Error,
    FormatError,
    InputMismatchError,
    RemoteError,
    UsageError,
    WriterLockedError,
)
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
from .zstd import read_dictionary_file as read_dictionary
from .zstd import train_dictionary

__version__ = "0.1.0"

from . import java  # noqa: E402
from .dataset.writer import Salvage, Writer, recover  # noqa: E402  (writer records __version__)
from .shards import ShardedDataset, ShardWriter, merge_manifests, open_shards  # noqa: E402

__all__ = [
    "BFLOAT16",
    "Dataset",
    "Salvage",
    "ShardWriter",
    "ShardedDataset",
    "VerifyReport",
    "Writer",
    "open",
    "read_dictionary",
    "recover",
    "train_dictionary",
    "Bool",
    "BatchError",
    "ClosedError",
    "Double",
    "EncodeError",
    "Error",
    "FormatError",
    "InputMismatchError",
    "Int",
    "Kind",
    "ListBool",
    "ListDouble",
    "ListInt",
    "ListOptionalTensor",
    "ListTensor",
    "RemoteError",
    "String",
    "Tensor",
    "Typed",
    "UsageError",
    "WriterLockedError",
    "bfloat16_to_float32",
    "float32_to_bfloat16",
    "java",
    "merge_manifests",
    "open_shards",
]
