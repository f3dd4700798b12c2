"""The metadata block's JSON (docs/FORMAT.md section 7): what a reader accepts and a writer
writes, one rule for both. Strict JSON text, an object at the top, no integer beyond a
double, at most MAX_METADATA_DEPTH levels of arrays and objects, at most MAX_METADATA bytes.
"""

from __future__ import annotations

import json
from typing import Any

from .container import MAX_METADATA
from .errors import LIMIT, METADATA, EncodeError, FormatError

MAX_METADATA_DEPTH = 512  # arrays and objects nested in metadata, the top object counting 1


def double_int(text: str) -> int:
    """A JSON integer, refused (ValueError) when no double holds it (docs/FORMAT.md §7)."""
    value = int(text)
    try:
        float(value)
    except OverflowError:
        raise ValueError(
            f"the integer {text[:20]}... ({len(text)} digits) is too large for a double"
        ) from None
    return value


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (one of them alone is 1),
    counted level by level without recursion."""
    depth, level = 0, [value] if isinstance(value, (dict, list)) else []
    while level:
        depth += 1
        level = [
            item
            for v in level
            for item in (v.values() if isinstance(v, dict) else v)
            if isinstance(item, (dict, list))
        ]
    return depth


def parse_metadata(raw: bytes, offset: int) -> dict:
    """The metadata block's JSON object (docs/FORMAT.md section 7), or FormatError.

    It must be what a writer could have written: strict JSON (no NaN or Infinity, no number
    beyond a double) whose strings are Unicode text (no lone surrogate, even escaped), so
    that whatever reads it can also write it again (copy, compress, merge).
    """
    try:
        value = json.loads(raw.decode("utf-8"), parse_int=double_int)
    except (ValueError, RecursionError) as exc:
        # RecursionError: hostile nesting ([[[[...) deeper than json can parse
        raise FormatError(f"metadata is not JSON: {exc}", offset, code=METADATA) from None
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        reason = f"metadata is not strict JSON text (NaN, Infinity or a lone surrogate): {exc}"
        raise FormatError(reason, offset, code=METADATA) from None
    if not isinstance(value, dict):
        raise FormatError("metadata is not a JSON object", offset, code=METADATA)
    if json_depth(value) > MAX_METADATA_DEPTH:
        raise FormatError(f"metadata nests deeper than {MAX_METADATA_DEPTH}", offset, code=LIMIT)
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"the key {twice!r} appears twice once keys are made strings")
    return dict(pairs)


def encode_metadata(metadata: dict | None) -> bytes:
    """A writer's metadata as the block's bytes (empty for None), or EncodeError: only what
    ``parse_metadata`` accepts is written."""
    if metadata is None:
        return b""
    if not isinstance(metadata, dict):
        raise EncodeError("metadata must be a dict of JSON values")
    try:
        data = json.dumps(metadata, ensure_ascii=False, allow_nan=False).encode("utf-8")
        # As a reader will: no huge integer; and no key twice (json.dumps makes keys
        # strings, so {1: .., "1": ..} would be written with "1" repeated).
        parsed = json.loads(data, parse_int=double_int, object_pairs_hook=_unique_keys)
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"metadata is not JSON-serializable: {exc}") from None
    except RecursionError:
        raise EncodeError(f"metadata nests deeper than {MAX_METADATA_DEPTH}") from None
    if json_depth(parsed) > MAX_METADATA_DEPTH:
        raise EncodeError(f"metadata nests deeper than {MAX_METADATA_DEPTH}")
    if len(data) > MAX_METADATA:
        raise EncodeError(f"metadata is {len(data)} bytes; the limit is {MAX_METADATA}")
    return data
