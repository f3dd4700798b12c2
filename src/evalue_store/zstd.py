"""Compressed files (docs/FRAMES.md): the public API of the zstd physical variant.

``open_reader`` opens a compressed container through any byte reader (``byteio``), such as
a remote one; ``train_dictionary`` and ``read_dictionary_file`` make and extract the
dictionary a writer stores once; ``is_compressed`` tells a compressed file from its first
bytes. The implementation is ``evalue_store.physical.zstd`` and the modules beside it,
which may change; these names are the ones to use.
"""

from .physical.zstd import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_FRAME_SIZE,
    MAX_DICT_SIZE,
    MAX_FRAME_SIZE,
    is_compressed,
    open_reader,
    read_dictionary_file,
    train_dictionary,
)

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_FRAME_SIZE",
    "MAX_DICT_SIZE",
    "MAX_FRAME_SIZE",
    "is_compressed",
    "open_reader",
    "read_dictionary_file",
    "train_dictionary",
]
