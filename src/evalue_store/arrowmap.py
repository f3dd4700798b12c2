"""Arrow columns <-> EValue record values, for the Ray Data integration (``evalue_store.ray``).

A Ray Data block is an Arrow table (a pandas block is converted to one first); each of its
columns becomes one value of every record, in the schema's column order, and the column
names become the file's field names. Mapping, per Arrow column type:

==========================================  =================  ============================
Arrow column (Ray's name for it)            EValue kind        read back as (Ray column)
==========================================  =================  ============================
fixed-shape tensor (ArrowTensorType[V2],    Tensor per row     fixed-shape tensor [n, ...]
pyarrow fixed_shape_tensor)
variable-shaped tensor                      Tensor per row     variable-shaped tensor
int8..int64, uint8..uint64                  Int (int64)        int64
float16, float32, float64                   Double             float64
bool                                        Bool               bool
string, large_string                        String (UTF-8)     string
binary, large_binary                        String (bytes)     binary
list<int*>, list<float*>, list<bool>        ListInt/ListDouble/list<int64>/list<double>/
(also large and fixed-size lists)           ListBool           list<bool>
null (all values missing)                   None               null
a missing value (null) in a scalar,         None               null in that column
string or list column
==========================================  =================  ============================

Refused, with an EncodeError naming the column: any other type (struct, map, dictionary,
timestamp, decimal, Ray's pickled Python objects...), uint64 values above 2^63-1, lists
holding nulls (a missing item, not a missing list), lists of other item types, and nulls in
a tensor column.

Reading the other way, a field whose values are all tensors of one shape and dtype becomes
a fixed-shape tensor column (one ``np.stack``), tensors of different shapes a
variable-shaped one; bfloat16 tensors are widened to float32 (exact). ListTensor and
ListOptionalTensor fields have no Ray column type and are refused (leave them out with
``columns=``), and so is a block where a field's tensors have several dtypes, or its values
are Int in some records and Double in others (Ray would cast them to one type). Files
without field names get the columns "0", "1", ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .dtypes import BFLOAT16, bfloat16_to_float32
from .errors import EncodeError, Error, UsageError
from .values import INT64_MAX, ListBool, ListDouble, ListInt, is_sequence

# --------------------------------------------------------------------------- Arrow -> values


def block_columns(table: Any) -> tuple[tuple[str, ...], list[Sequence[Any]]]:
    """(field names, one sequence of record values per column) for an Arrow table.

    Columns as ``Writer.extend_columns`` takes them: a fixed-shape tensor column as one
    array [rows, ...], an int / float / bool column without missing values as a 1-D array,
    the others as Python lists. Raises EncodeError naming a column it cannot map.
    """
    names = tuple(str(name) for name in table.column_names)
    columns = [_column_values(name, table.column(k)) for k, name in enumerate(names)]
    return names, columns


def _column_values(name: str, column: Any) -> Sequence[Any]:
    import pyarrow as pa

    kind = column.type
    if _is_tensor_type(kind):
        if column.null_count:
            raise EncodeError(f"column {name!r}: a tensor column with missing values")
        return _tensor_rows(column)
    if pa.types.is_null(kind):
        return [None] * len(column)
    if pa.types.is_unsigned_integer(kind) and kind.bit_width == 64 and len(column):
        import pyarrow.compute as pc

        top = pc.max(column).as_py()
        if top is not None and top > INT64_MAX:
            raise EncodeError(f"column {name!r}: uint64 value {top} does not fit in Int (int64)")
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        # one array (Int / Double / Bool per row) unless values are missing (None)
        return column.to_pylist() if column.null_count else column.to_numpy()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return column.to_pylist()
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column.to_pylist()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _list_values(name, column)
    raise EncodeError(
        f"column {name!r}: Arrow type {kind} has no EValue kind "
        "(see evalue_store.arrowmap for the mapping)"
    )


def _is_tensor_type(kind: Any) -> bool:
    import pyarrow as pa

    if isinstance(kind, pa.FixedShapeTensorType):
        return True
    try:
        from ray.data.extensions import get_arrow_extension_tensor_types
    except ImportError:  # Ray's tensor types can only come from Ray
        return False
    return isinstance(kind, get_arrow_extension_tensor_types())


def _tensor_rows(column: Any) -> Any:
    """A fixed-shape tensor column as one [rows, ...] array, a variable-shaped one as a list
    of arrays: views of Arrow's buffers when the column is one chunk (combining chunks
    would copy every tensor once more)."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [_chunk_rows(chunk) for chunk in chunks if len(chunk)]
    if not parts:
        return []
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(part, np.ndarray) for part in parts):
        return np.concatenate(parts)
    return [row for part in parts for row in part]


def _chunk_rows(array: Any) -> Any:
    import pyarrow as pa

    if isinstance(array.type, pa.FixedShapeTensorType):
        return array.to_numpy_ndarray()
    values = array.to_numpy(zero_copy_only=False)  # Ray's tensor arrays: a view if they can
    return list(values) if values.dtype == object else values  # object: variable-shaped


def _list_values(name: str, column: Any) -> list[Any]:
    import pyarrow as pa
    import pyarrow.compute as pc

    item = column.type.value_type
    if pa.types.is_boolean(item):
        wrap = ListBool
    elif pa.types.is_integer(item):
        wrap = ListInt
    elif pa.types.is_floating(item):
        wrap = ListDouble
    elif pa.types.is_null(item):  # a block whose lists are all empty: [] as append stores it
        wrap = ListInt  # (a null item inside one is a missing item, refused below)
    else:
        raise EncodeError(f"column {name!r}: a list of {item} has no EValue kind")
    if pc.list_flatten(column).null_count:  # a missing list is None (below), not its items
        raise EncodeError(
            f"column {name!r}: a list column with missing values inside a list "
            "(a list of numbers has no EValue holding a missing item)"
        )
    if wrap is ListInt and pa.types.is_uint64(item) and len(pc.list_flatten(column)):
        top = pc.max(pc.list_flatten(column)).as_py()
        if top > INT64_MAX:
            raise EncodeError(f"column {name!r}: uint64 value {top} does not fit in ListInt")
    return [None if items is None else wrap(items) for items in column.to_pylist()]


# --------------------------------------------------------------------------- values -> Arrow


def pick_columns(
    columns: Any, fields: Sequence[str], source: Any
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A read's ``columns=``: the names, in that order, and their positions in ``fields``
    (every field for None). Not a sequence of names (a ``str``, which was split into
    one-letter names, bytes, a mapping, a set, whose order is the hash seed's, an entry
    that is not a ``str``) is a TypeError; a name twice or not a field a UsageError."""
    if columns is None:
        return tuple(fields), tuple(range(len(fields)))
    if not is_sequence(columns):
        raise TypeError(
            f"columns must be a sequence of field names, not {type(columns).__name__} "
            f"{columns!r:.200}"
            + (" (a str is one name: columns=[name])" if isinstance(columns, str) else "")
        )
    names = tuple(columns)
    for k, name in enumerate(names):
        if not isinstance(name, str):
            raise TypeError(f"columns[{k}] is {type(name).__name__} {name!r}, not a field name")
    unknown = [c for c in names if c not in fields]
    if unknown:
        raise UsageError(f"columns {unknown} are not fields of {source!r:.200}: {tuple(fields)}")
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise UsageError(f"columns names {twice} more than once: a block has one column of a name")
    return names, tuple(fields.index(c) for c in names)


def ray_batch(
    batch: dict | list, names: Sequence[str], positions: Sequence[int]
) -> dict[str, np.ndarray]:
    """A batch as ``get_batch`` returns it (by field name or by position) as the columns
    ``names`` (at ``positions``): what ``BlockAccessor.batch_to_block`` makes a block of."""
    out = {}
    for name, p in zip(names, positions):
        values = batch[name] if isinstance(batch, dict) else batch[p]
        if isinstance(values, np.ndarray):  # stacked tensors, or Int / Double / Bool
            out[name] = bfloat16_to_float32(values) if values.dtype == BFLOAT16 else values
        else:
            out[name] = _batch_column(name, values)
    return out


def _batch_column(name: str, values: list[Any]) -> np.ndarray:
    if values and all(type(v) is np.ndarray for v in values):
        values = [bfloat16_to_float32(v) if v.dtype == BFLOAT16 else v for v in values]
        first = values[0]
        if any(v.dtype != first.dtype for v in values):
            _refuse_mixed(name, sorted({str(v.dtype) for v in values}), "tensors")
        if all(v.shape == first.shape for v in values):
            return np.stack(values)
    elif _mixes_int_and_double(values):
        _refuse_mixed(name, ["Int", "Double"], "values")
    elif any(type(v) is list and v and (v[0] is None or type(v[0]) is np.ndarray) for v in values):
        raise Error(
            f"field {name!r} holds lists of tensors, which have no Ray column type: "
            "leave it out with columns=, or read it with evalue_store.open_shards"
        )
    column = np.empty(len(values), dtype=object)  # filled one by one: lists stay lists
    for i, value in enumerate(values):
        column[i] = value
    return column


def _mixes_int_and_double(values: list[Any]) -> bool:
    kinds = {type(v) for v in values}
    return float in kinds and int in kinds


def _refuse_mixed(name: str, kinds: list[str], what: str) -> None:
    """A Ray column has one type: Ray would cast the others to it (int64 2^53+1 came back
    as the float64 9007199254740992.0), so a block mixing them is refused."""
    raise Error(
        f"field {name!r} holds {what} of {' and '.join(kinds)} in one block, which a Ray "
        "column cannot hold without casting them: write them as one type, leave the field "
        "out with columns=, or read it with evalue_store.open_shards"
    )
