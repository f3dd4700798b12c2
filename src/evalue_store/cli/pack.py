"""``pack`` and ``export``: from .npz, .npy, JSON Lines and Java .bin files into a
container, and back out.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import zipfile
from collections import Counter
from collections.abc import Iterator
from typing import Any, BinaryIO, Callable

import numpy as np
from tqdm import tqdm

import evalue_store as evs

from .. import java
from ..dataset.fields import FIELDS_KEY
from ..files import fsync_dir
from .inputs import kind_of, not_regular, open_input, special_kind
from .output import new_file, output_writer, refuse_input, refuse_overwrite
from .registry import command, file_arg, format_version_arg, json_object
from .render import (
    EXIT_OK,
    PROG,
    CliError,
    as_numbers,
    error_line,
    field_names,
    kind_name,
    located,
    note,
    open_dataset,
    plural,
    progress,
)

# An input, read from its open file, yields (where, record); ``where`` names the file (and
# line) for error messages.
Source = Iterator[tuple[str, list]]
PACK_SUFFIXES = (".npz", ".npy", ".jsonl", ".ndjson", ".bin")
FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16")


def scalar_or_array(array: np.ndarray) -> Any:
    """0-d bool/int/float/str/bytes arrays become plain values; anything else stays a tensor."""
    if array.ndim or array.dtype.kind not in "biufUS":
        return array
    if array.dtype.kind == "S":
        return array.tobytes()  # .item() would drop trailing NUL bytes
    if array.dtype.kind == "U":  # UCS-4 code units: numpy makes a broken str of one past
        # U+10FFFF (or raises SystemError), which would be stored as bytes that are not UTF-8
        order = array.dtype.byteorder if array.dtype.byteorder in "<>" else "="
        units = np.frombuffer(array.tobytes(), f"{order}u4")
        if (units > 0x10FFFF).any():
            bad = int(units[units > 0x10FFFF][0])
            raise ValueError(f"a string with a code point beyond U+10FFFF (0x{bad:X})")
    return array.item()


def numpy_file(f: BinaryIO, path: str, magic: bytes, what: str) -> None:
    """Check a file's first bytes: np.load takes anything else for a pickle and says so."""
    head = f.read(len(magic))
    f.seek(0)
    if head != magic:
        raise CliError(path, f"cannot read: {'empty file' if not head else 'not ' + what}")


def npz_source(f: BinaryIO, path: str, args: argparse.Namespace, fields: Counter) -> Source:
    """One record per .npz file: its arrays in the order they are stored in the archive."""
    numpy_file(f, path, b"PK", "a .npz file (a zip archive of .npy arrays)")
    with np.load(f, allow_pickle=False) as npz:
        # By member name: numpy's key "a.npy" may mean the member of "a" or of "a.npy".
        members = npz.zip.namelist()
        for name in members:
            with npz.zip.open(name) as member:
                check_npy_size(member, npz.zip.getinfo(name).file_size, f"member {name}: ")
        names = tuple(name.removesuffix(".npy") for name in members)
        if len(set(names)) < len(names):
            # A zip may hold a name twice, and numpy then reads the last member for both.
            name = next(n for n in names if names.count(n) > 1)
            twins = [m for m in members if m.removesuffix(".npy") == name]
            raise ValueError(f"members {' and '.join(twins)} both name the array {name!r}")
        fields[names] += 1
        values = [scalar_or_array(npz[name]) for name in members]
        # Appended to a file of named fields: by name, so that the writer puts each array
        # under its field, and refuses an archive of other names
        yield path, dict(zip(names, values)) if args.npz_by_name else values


def check_npy_size(f: BinaryIO, size: int, where: str = "") -> None:
    """Refuse an array whose header claims more data than the ``size`` bytes there are:
    numpy allocates what the header says before reading (ValueError). The header's own
    length is checked first: numpy reads that many bytes before it applies its cap (10,000
    characters), so a 13-byte file claiming a 4 GiB header would be a 4 GiB read."""
    version = np.lib.format.read_magic(f)
    start = f.tell()
    field = f.read(2 if version == (1, 0) else 4)  # 1.0: u2; 2.0 and 3.0: u4, little-endian
    f.seek(start)
    header = int.from_bytes(field, "little")
    if header > size - start - len(field):
        raise ValueError(
            f"{where}its header length field says {header:,} bytes; "
            f"there are {max(size - start - len(field), 0):,} after it"
        )
    read_header = np.lib.format.read_array_header_1_0
    if version != (1, 0):
        read_header = np.lib.format.read_array_header_2_0
    shape, _, dtype = read_header(f)
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > size - f.tell():
        raise ValueError(
            f"{where}its header claims {claimed:,} bytes of data ({shape}, {dtype}); "
            f"there are {max(size - f.tell(), 0):,}"
        )


def npy_source(f: BinaryIO, path: str, args: argparse.Namespace, fields: Counter) -> Source:
    numpy_file(f, path, b"\x93NUMPY", "a .npy file")
    check_npy_size(f, os.fstat(f.fileno()).st_size)
    f.seek(0)
    yield path, [scalar_or_array(np.load(f, allow_pickle=False))]


def json_tensor(items: list, dtype: str) -> np.ndarray:
    """A (nested, rectangular) JSON list of numbers as a tensor, by the documented rule."""
    leaves: set[type] = set()
    stack = [items]
    while stack:
        for item in stack.pop():
            if isinstance(item, list):
                stack.append(item)
            elif isinstance(item, (bool, int, float)):
                leaves.add(type(item))
            else:
                found = "null" if item is None else type(item).__name__
                hint = " (give each string its own value, or join them)" if found == "str" else ""
                raise ValueError(f"a list must hold only numbers or only bools, not {found}{hint}")
    if bool in leaves and len(leaves) > 1:
        raise ValueError("a list mixes bools and numbers")
    try:
        if float in leaves:
            if dtype == "bfloat16":
                return evs.float32_to_bfloat16(np.array(items, np.float32))
            return np.array(items, dtype)
        return np.array(items, bool if bool in leaves else np.int64)
    except ValueError:
        raise ValueError("nested lists must be rectangular (equal lengths at each level)") from None


def json_value(value: Any, dtype: str) -> Any:
    if isinstance(value, list):
        return json_tensor(value, dtype)
    if isinstance(value, dict):
        raise ValueError("JSON objects have no EValue kind")
    return value


def jsonl_source(f: BinaryIO, path: str, args: argparse.Namespace, fields: Counter) -> Source:
    """One record per non-blank line; each line a JSON list of values."""
    for number, raw in enumerate(f, 1):  # bytes, so that bad UTF-8 is named by its line
        if not raw.strip():
            continue
        where = f"{path}: line {number}"
        try:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"not UTF-8 (byte {exc.start + 1} of the line)") from None
            try:
                values = json.loads(line)
            except ValueError as exc:
                if "integer string conversion" in str(exc):  # Python's cap, 4300 digits
                    raise ValueError("an integer of over 4300 digits (an Int is int64)") from None
                raise
            if not isinstance(values, list):
                raise ValueError("each line must be a JSON list (one record)")
            record = []
            for k, value in enumerate(values):
                try:
                    record.append(json_value(value, args.dtype))
                except (ValueError, OverflowError) as exc:
                    raise ValueError(f"value {k}: {exc}") from None
        except ValueError as exc:
            raise CliError(where, str(exc)) from None
        except RecursionError:
            raise CliError(where, "lists nested too deeply") from None
        yield where, record


def java_source(f: BinaryIO, path: str, args: argparse.Namespace, fields: Counter) -> Source:
    """One Java ``EValue[]`` record (EVJ1 framing) per .bin file."""
    try:
        record = java.loads_record(f.read())
    except evs.FormatError as exc:
        raise CliError(path, f"not an EVJ1 record: {located(exc)}") from None
    yield path, record


SOURCES: dict[str, Callable[[BinaryIO, str, argparse.Namespace, Counter], Source]] = {
    ".npz": npz_source,
    ".npy": npy_source,
    ".jsonl": jsonl_source,
    ".ndjson": jsonl_source,
    ".bin": java_source,
}


def natural_key(text: str) -> list[tuple[int, Any]]:
    """Sort key that puts file2 before file10."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p]


def expand_inputs(args: argparse.Namespace) -> list[str]:
    """Files to pack, in order: arguments as given; directories and globs naturally sorted."""
    files: list[str] = []
    special: list[str] = []
    skipped = 0
    for arg in args.sources:
        if os.path.isdir(arg):
            found = []
            for root, _, names in os.walk(arg):
                found += [os.path.join(root, n) for n in names]
        elif os.path.exists(arg):
            if not arg.lower().endswith(PACK_SUFFIXES):
                raise CliError(arg, f"unknown input type; pack reads {', '.join(PACK_SUFFIXES)}")
            kind = special_kind(os.stat(arg).st_mode)
            if kind is not None:  # before any work (open_input checks again)
                raise not_regular(arg, kind)
            files.append(arg)
            continue
        else:
            found = glob.glob(arg, recursive=True)
            if not found:
                raise CliError(arg, "no such file, directory or matching glob")
        found.sort(
            key=lambda p: natural_key(os.path.relpath(p, arg if os.path.isdir(arg) else "."))
        )
        named = [p for p in found if p.lower().endswith(PACK_SUFFIXES)]
        usable = [p for p in named if os.path.isfile(p)]
        skipped += len(found) - len(named)
        special += [p for p in named if not os.path.isfile(p)]
        files += usable
    if skipped:
        note(args, f"{PROG}: skipped {plural(skipped, 'file')} not {'/'.join(PACK_SUFFIXES)}")
    if special:  # FIFOs, devices, sockets, dangling links: named by type, not by suffix
        first = f"{special[0]}: {kind_of(special[0])}"
        note(args, f"{PROG}: skipped {plural(len(special), 'file')} not regular ({first})")
    if not files:
        raise CliError(None, f"no input files to pack (it reads {', '.join(PACK_SUFFIXES)})")
    return files


def pack_files(files: list[str], args: argparse.Namespace) -> tuple[int, int]:
    """Pack ``files`` into args.output; returns (records written, bytes of the output)."""
    fields: Counter = Counter()
    written = 0
    with output_writer(
        args.output,
        append=args.append,
        force=args.force,
        metadata=args.metadata,
        format_version=args.format_version,
    ) as writer:
        args.npz_by_name = args.append and writer.fields is not None
        try:
            with progress(args, len(files), "pack", "file") as bar:
                for path in files:
                    source = SOURCES[os.path.splitext(path)[1].lower()]
                    try:
                        with open_input(path) as f:
                            for where, record in source(f, path, args, fields):
                                try:
                                    writer.append(record)
                                except evs.EncodeError as exc:
                                    raise CliError(where, str(exc)) from None
                                written += 1
                    except (ValueError, EOFError, zipfile.BadZipFile) as exc:
                        if "allow_pickle" in str(exc):  # numpy's advice is for its own API
                            exc = ValueError("holds Python objects, which pack never unpickles")
                        raise CliError(path, f"cannot read: {exc}") from None
                    bar.update()
        except Exception as exc:
            if args.append and written:  # the writer aborts: its file stays at its last commit
                code, line = error_line(exc, None)
                raise CliError(
                    None, f"{line}; nothing was appended, {args.output} is as it was", code
                ) from exc
            raise
        names = next(iter(fields), ())
        if len(set(names)) != len(names):  # members "a" and "a.npy": no names to give
            names = ()
        if not args.append and len(fields) == 1 and sum(fields.values()) == len(files) and names:
            # Every input was an .npz with the same arrays: their names name the fields
            # (records of no arrays have none to name).
            metadata = dict(args.metadata or {})
            metadata.setdefault(FIELDS_KEY, list(names))
            writer.set_metadata(metadata)
    return written, os.path.getsize(args.output)


def _pack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SRC", help="files, directories or globs")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="container to write")
    p.add_argument(
        "--dtype",
        choices=FLOAT_DTYPES,
        default="float32",
        help="tensor dtype for JSON lists holding a float (default float32)",
    )
    p.add_argument("--metadata", type=json_object, metavar="JSON", help="a JSON object to store")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--append", action="store_true", help="add records to an existing OUT")
    mode.add_argument("--force", action="store_true", help="replace OUT if it exists")
    format_version_arg(p)


@command(
    "pack",
    "build a container from .npz, .npy, JSON Lines or Java .bin files",
    'evalue-store pack samples/ -o train.evs --metadata \'{"split": "train"}\'',
    _pack_args,
    notes="""One record per .npz file (its arrays in the order stored in the archive, which is
the order given to np.savez), per .npy file (one tensor), per .jsonl/.ndjson line (a
JSON list) and per .bin file (a Java EValue[] in EVJ1 framing). Directories are read
recursively and, like globs, in natural order (2.npz before 10.npz); other files are
skipped. 0-d arrays of bool/int/float/str/bytes become Bool/Int/Double/String values.
JSON: numbers -> Int/Double, strings, bools, null; a list of integers -> int64 tensor,
a list holding any float -> --dtype tensor, a list of bools -> bool tensor; nested
lists must be rectangular. A new OUT appears only when complete.""",
)
def cmd_pack(args: argparse.Namespace) -> int:
    if not args.append:
        refuse_overwrite(args.output, args.force, append=True)
    files = expand_inputs(args)
    refuse_input(args.output, files)
    written, size = pack_files(files, args)
    print(
        f"packed {plural(written, 'record')} from {plural(len(files), 'file')} into {args.output} "
        f"({size:,} bytes)"
    )
    return EXIT_OK


def npz_value(value: Any) -> np.ndarray:
    """The inverse of pack's .npz rule: tensors as they are, scalars as 0-d arrays. A value
    that rule would read back as another is refused: a 0-d numeric tensor (read as a
    number), a string ending in NUL (numpy drops trailing NULs), an empty byte string (a
    0-d byte array holds at least one byte)."""
    kind = kind_name(value)
    if kind == "Tensor":
        if value.ndim == 0 and value.dtype.kind in "biuf":
            raise evs.EncodeError("a 0-d tensor has no .npz form (it packs back as a number)")
        return value
    if kind == "String" and value.endswith("\0"):
        raise evs.EncodeError("a string ending in NUL has no .npz form; try --format java")
    if kind == "Bytes" and not value:
        raise evs.EncodeError("an empty byte string has no .npz form")
    if kind in ("Int", "Double", "Bool", "String", "Bytes"):
        return np.array(value)
    if kind in ("ListInt", "ListDouble", "ListBool", "List(empty)"):
        return np.array(value, np.int64 if kind == "List(empty)" else None)
    raise evs.EncodeError(f"a {kind} value has no .npz form; try --format jsonl")


def json_ready(value: Any) -> Any:
    kind = kind_name(value)
    if kind == "Tensor":
        numbers = as_numbers(value)
        if numbers is None:
            raise evs.EncodeError("complex tensors have no JSON form")
        return numbers.tolist()
    if kind == "Bytes":
        raise evs.EncodeError("byte strings have no JSON form; try --format npz")
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    return value


def export_name(args: argparse.Namespace, index: int, count: int, suffix: str) -> str:
    return os.path.join(args.to, f"{index:0{max(6, len(str(count - 1)))}d}{suffix}")


def export_records(ds: evs.Dataset, args: argparse.Namespace, bar: tqdm) -> int:
    """Each file appears complete (written, fsynced, renamed); the folder is fsynced at the end."""
    if not args.to:
        raise CliError('""', "no folder name given")
    if os.path.exists(args.to) and not os.path.isdir(args.to):
        raise CliError(args.to, "is a file; --to takes a folder")
    if not os.path.isdir(args.to):
        os.makedirs(args.to)
        fsync_dir(args.to)  # its entry in its parent
    n = len(ds)
    if args.format == "jsonl":
        stem = os.path.splitext(os.path.basename(ds.path))[0]
        out_path = os.path.join(args.to, stem + ".jsonl")
        refuse_input(out_path, [ds.path])
        with new_file(out_path, clobber=args.force) as out:
            for i, record in enumerate(ds):
                try:
                    line = json.dumps(json_ready(record), ensure_ascii=False, allow_nan=False)
                except evs.EncodeError as exc:
                    raise CliError(ds.path, f"record {i}: {exc}") from None
                except ValueError:  # json's own refusal: JSON has no NaN or infinity
                    reason = "NaN and infinities have no JSON form; try --format npz"
                    raise CliError(ds.path, f"record {i}: {reason}") from None
                out.write(line.encode("utf-8") + b"\n")
                bar.update()
        return n
    names = None
    if args.format == "npz":  # "fields": what pack stored before FIELDS_KEY existed
        names = list(field_names(ds)) or ds.metadata.get("fields")
    for i, record in enumerate(ds):
        try:
            if args.format == "java":
                if any(kind_name(v) == "Bytes" for v in record):  # Java Strings are text
                    raise evs.EncodeError("byte strings have no Java form; try --format npz")
                data = java.dumps_record(record)
            else:
                keys = names if isinstance(names, list) and len(names) == len(record) else None
                keys = keys or [f"arr_{k}" for k in range(len(record))]
                arrays = {str(key): npz_value(v) for key, v in zip(keys, record)}
                if any("\0" in key for key in arrays):  # a zip member name ends at a NUL
                    raise evs.EncodeError("a field name holding NUL has no .npz form")
        except evs.EncodeError as exc:
            raise CliError(ds.path, f"record {i}: {exc}") from None
        suffix = ".bin" if args.format == "java" else ".npz"
        path = export_name(args, i, n, suffix)
        refuse_input(path, [ds.path])
        with new_file(path, clobber=args.force, durable=False) as out:
            if args.format == "java":
                out.write(data)
            else:
                write_npz(out, arrays)
        bar.update()
        if i == n - 1:
            fsync_dir(path)  # every name at once
    return n


def write_npz(out: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """What np.savez writes, for any key: savez takes its own keywords (file, allow_pickle)
    from among the names and leaves a name ending in .npy as it is, so that "a.npy" and "a"
    would both become the member a.npy. Here every member is the key plus ".npy", which
    np.load strips again."""
    with zipfile.ZipFile(out, "w", allowZip64=True) as archive:
        for key, array in arrays.items():
            with archive.open(key + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def _export_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    p.add_argument("--to", required=True, metavar="DIR", help="folder to write into")
    p.add_argument("--format", required=True, choices=("npz", "jsonl", "java"))
    p.add_argument("--force", action="store_true", help="overwrite files that exist")


@command(
    "export",
    "write records out as .npz files, one JSON Lines file or Java EVJ1 .bin files",
    "evalue-store export train.evs --to out/ --format java",
    _export_args,
    notes="""npz and java write one file per record, named by record number (000000.npz,
000001.bin, ...); npz keys come from the "fields" metadata pack stores, else arr_0,
arr_1, ...; java output is byte-identical to .bin files that were packed. jsonl writes
DIR/<name>.jsonl, one JSON list per record (tensors as nested lists).""",
)
def cmd_export(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds, progress(args, len(ds), "export", "rec") as bar:
        n = export_records(ds, args, bar)
    print(f"exported {plural(n, 'record')} to {args.to} as {args.format}")
    return EXIT_OK
