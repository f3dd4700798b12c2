"""``info``, ``head`` and ``show``: what a file holds, and its records as text."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

import numpy as np

import evalue_store as evs

from ..container import CHECKSUM_TITLES, ENTRY_SIZE, FRAME_SIZE
from ..physical import remote
from .registry import at_least_one, command, file_arg, json_arg
from .render import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    as_numbers,
    dtype_name,
    field_label,
    field_names,
    kind_name,
    located,
    num,
    open_dataset,
    plural,
    sample_indices,
    shape_text,
)


def human_bytes(n: int) -> str:
    """``1,304,568 B (1.2 MiB)``: exact for scripts that grep, rounded for people."""
    if n < 1024:
        return f"{n:,} B"
    size, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n:,} B ({size:.1f} {unit})"


def type_text(value: Any) -> str:
    """``Tensor int64[128]``, ``ListInt[3]``, ``String``...: kind plus dtype and shape."""
    kind = kind_name(value)
    if kind == "Tensor":
        return f"Tensor {dtype_name(value)}{shape_text(value.shape)}"
    if kind in ("ListTensor", "ListOptionalTensor"):
        inner = ", ".join("None" if v is None else type_text(v)[7:] for v in value[:3])
        return f"{kind}[{inner}{', ...' if len(value) > 3 else ''}]"
    if kind.startswith("List") and value:
        return f"{kind}[{len(value)}]"
    return kind


def schema(ds: evs.Dataset, samples: int = 8) -> tuple[list[dict], int, list[str]]:
    """Kinds, dtypes and shapes per position, from up to ``samples`` records spread out."""
    indices = sample_indices(len(ds), samples)
    seen: list[dict[str, None]] = []  # dicts as ordered sets
    problems = []
    for i in indices:
        try:
            record = ds[int(i)]
        except evs.FormatError as exc:
            problems.append(f"record {i}: {exc.detail}")
            continue
        while len(seen) < len(record):
            seen.append({})
        for types, value in zip(seen, record):
            types[type_text(value)] = None
    names = field_names(ds)
    rows = [
        {"position": k, "field": names[k] if k < len(names) else None, "types": list(types)}
        for k, types in enumerate(seen)
    ]
    return rows, len(indices), problems


def _file_size(path: str) -> int:
    if remote.is_url(path):
        fs, inner, url = remote.resolve(path)
        return int(remote.stat(fs, inner, url)["size"])
    return os.path.getsize(path)


def info_report(ds: evs.Dataset) -> tuple[dict, list[str]]:
    commit, header = ds.commit, ds.header
    file_bytes = _file_size(ds.path)
    index = sum(seg.count for seg in commit.segments) * ENTRY_SIZE
    committed = ds.logical_size  # of the decompressed stream, for a compressed file
    problems = []
    try:  # a compressed file's records can be read by their locators when its index cannot
        lengths = sum(int(e["length"].sum(dtype=np.uint64)) for e in ds.iter_entries())
        data: int | None = lengths + FRAME_SIZE * len(ds)
    except evs.FormatError as exc:
        data = None
        problems.append(f"index: {located(exc)}")
    try:
        metadata: Any = ds.metadata
    except evs.FormatError as exc:
        metadata = None
        problems.append(f"metadata: {exc.reason}")
    rows, sampled, record_problems = schema(ds)
    created = datetime.datetime.fromtimestamp(header.created_ns / 1e9, datetime.timezone.utc)
    report = {
        "file": ds.path,
        "records": len(ds),
        "file_bytes": file_bytes,
        "compressed": ds.compressed,
        "logical_bytes": committed,
        "compression_ratio": (file_bytes - ds.uncommitted_bytes) / max(committed, 1),
        "data_bytes": data,
        "index_bytes": index,
        "metadata_bytes": commit.metadata_length,
        "overhead_bytes": (
            None if data is None else committed - data - index - commit.metadata_length
        ),
        "uncommitted_bytes": ds.uncommitted_bytes,
        "commits": commit.number - 1,  # number 1 is the empty commit that creates a file
        "last_commit": commit.number,
        "segments": len(commit.segments),
        "alignment": header.alignment,
        "format_version": header.version,
        "checksum": header.checksum_name,
        "writer": header.writer,
        "created": created.isoformat(timespec="seconds"),
        "file_id": header.file_id.hex(),
        "metadata": metadata,
        "schema_sampled_records": sampled,
        "schema": rows,
    }
    return report, problems + record_problems


def _bytes_or_unknown(count: int | None, what: str) -> str:
    return "unknown (the index is unreadable)" if count is None else human_bytes(count) + what


def print_info(report: dict, problems: list[str]) -> None:
    rows = [
        ("file", report["file"]),
        ("records", f"{report['records']:,}"),
        ("file bytes", human_bytes(report["file_bytes"])),
    ]
    if report["compressed"]:
        ratio = report["compression_ratio"]
        rows.append(("compressed", f"zstd frames, {ratio:.2f}x of the plain container"))
        rows.append(("plain bytes", human_bytes(report["logical_bytes"])))
    rows += [
        ("  data", _bytes_or_unknown(report["data_bytes"], "  record frames")),
        ("  index", human_bytes(report["index_bytes"])),
        ("  metadata", human_bytes(report["metadata_bytes"])),
        ("  overhead", _bytes_or_unknown(report["overhead_bytes"], "  header, footers, padding")),
        ("  uncommitted", human_bytes(report["uncommitted_bytes"])),
        ("commits", str(report["commits"])),
        ("segments", str(report["segments"])),
        ("alignment", str(report["alignment"])),
        ("format", f"{report['format_version']}, {CHECKSUM_TITLES[report['checksum']]} checksums"),
        ("writer", report["writer"]),
        ("created", report["created"]),
        ("file id", report["file_id"]),
        ("metadata", json.dumps(report["metadata"], ensure_ascii=False)),
    ]
    for name, value in rows:
        print(f"{name:<14} {value}")
    if report["uncommitted_bytes"]:
        print("               (a writer crashed or is still writing; see `evalue-store recover`)")
    print(f"schema (from {report['schema_sampled_records']} sampled records)")
    for row in report["schema"]:
        print(f"  {field_label(row)} {' | '.join(row['types'])}")
    for problem in problems:
        print(f"problem: {problem}")


def finite_range(array: np.ndarray) -> tuple[Any, Any, int]:
    """(min, max, NaN count) over the finite-or-integer values; (None, None, n) if none."""
    if array.dtype.kind == "f":
        nan = int(np.isnan(array).sum())
        finite = array[np.isfinite(array)]
        if not finite.size:
            return None, None, nan
        return finite.min().item(), finite.max().item(), nan
    return array.min().item(), array.max().item(), 0


def tensor_summary(array: np.ndarray) -> str:
    """``float32[16] [-0.41 1.2 0.03 ... 0.9] min -1.9 max 2.3``, like numpy's repr but short."""
    text = f"{dtype_name(array)}{shape_text(array.shape)}"
    numbers = as_numbers(array)
    shown = array if numbers is None else numbers
    if array.size:
        flat = np.array2string(
            shown.reshape(-1), threshold=8, edgeitems=3, precision=4, max_line_width=10**6
        )
        text += f" {flat}"
    if numbers is not None and array.size:
        low, high, nan = finite_range(numbers)
        text += f"  min {num(low)} max {num(high)}"
        if nan:
            text += f" nan {nan:,}"
    return text


def short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def value_summary(value: Any) -> str:
    kind = kind_name(value)
    if kind == "Tensor":
        return f"Tensor {tensor_summary(value)}"
    if kind in ("ListTensor", "ListOptionalTensor"):
        items = "; ".join("None" if v is None else tensor_summary(v) for v in value[:2])
        return short(f"{kind}[{len(value)}] {items}{'; ...' if len(value) > 2 else ''}", 150)
    if kind == "List(empty)":
        return "List(empty) []"
    if kind.startswith("List"):
        return f"{kind}[{len(value)}] {short(str(value))}"
    if kind == "Bytes":
        return f"Bytes[{len(value)}] {short(repr(value))}"
    if kind == "None":
        return "None"
    return f"{kind} {short(repr(value))}"


def value_full(value: Any) -> str:
    """Everything in a value; tensors printed whole."""
    kind = kind_name(value)
    if kind == "Tensor":
        numbers = as_numbers(value)
        shown = value if numbers is None else numbers
        body = np.array2string(shown, threshold=sys.maxsize, max_line_width=100)
        return f"Tensor {dtype_name(value)}{shape_text(value.shape)}\n{body}"
    if kind in ("ListTensor", "ListOptionalTensor"):
        parts = [f"{kind}[{len(value)}]"]
        for k, item in enumerate(value):
            head, *body = ["None"] if item is None else value_full(item).splitlines()
            parts += [f"item {k}: {head}"] + [f"  {line}" for line in body]
        return "\n".join(parts)
    if kind == "List(empty)":
        return "List(empty) []"
    if kind.startswith("List"):
        return f"{kind}[{len(value)}] {value}"
    if kind == "None":
        return "None"
    return f"{kind} {value!r}"


def print_head(ds: evs.Dataset, n: int) -> int:
    """The first ``n`` records, summarized; an unreadable one is named and skipped."""
    code = EXIT_OK
    for i in range(min(n, len(ds))):
        if i:
            print()
        try:
            print_record(i, ds[i])
        except evs.FormatError as exc:
            print(f"record {i}: unreadable: {exc.detail}")
            code = EXIT_PROBLEMS
    return code


def print_record(index: int, record: list, full: bool = False) -> None:
    print(f"record {index}: {plural(len(record), 'value')}")
    for position, value in enumerate(record):
        text = value_full(value) if full else value_summary(value)
        lines = text.splitlines() or [""]
        print(f"  [{position}] {lines[0]}")
        for line in lines[1:]:
            print(f"      {line}")


def _info_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    json_arg(p)


@command(
    "info",
    "sizes, commits, metadata and the schema of a file",
    "evalue-store info train.evs --json",
    _info_args,
)
def cmd_info(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds:
        report, problems = info_report(ds)
    if args.json:
        print(json.dumps({**report, "problems": problems}, indent=2))
    else:
        print_info(report, problems)
    return EXIT_PROBLEMS if problems else EXIT_OK


def _head_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    p.add_argument(
        "-n", type=at_least_one, default=5, metavar="N", help="records to show (default 5)"
    )


@command(
    "head", "the first records, tensors summarized", "evalue-store head train.evs -n 3", _head_args
)
def cmd_head(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds:
        if not len(ds):
            print(f"{args.file}: no records")
        return print_head(ds, args.n)


def _show_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    p.add_argument("index", type=int, metavar="INDEX", help="record number; -1 is the last")


@command("show", "one record in full", "evalue-store show train.evs -1", _show_args)
def cmd_show(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds:
        n = len(ds)
        if not -n <= args.index < n:
            raise CliError(args.file, f"record {args.index} out of range ({n} records)")
        print_record(args.index % n, ds[args.index], full=True)
    return EXIT_OK
