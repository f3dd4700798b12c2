"""The record codec, in layers: grammar (the struct codes) -> kinds (one codec per EValue
kind) -> record (whole records, generic and checked) -> layout (records of one structure,
decoded or encoded many at a time)."""

from .grammar import MAX_VALUES
from .layout import Layout, compile_layout
from .record import check_payload, decode_payload, encode_record, realign_payload, value_count

__all__ = [
    "MAX_VALUES",
    "Layout",
    "check_payload",
    "compile_layout",
    "decode_payload",
    "encode_record",
    "realign_payload",
    "value_count",
]
