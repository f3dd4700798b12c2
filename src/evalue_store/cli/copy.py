"""Commands that rewrite whole containers: ``merge``, ``copy``, ``compress``,
``decompress`` and ``dictionary``. Each builds its OUT under a temporary name.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable

import evalue_store as evs

from ..dataset.fields import FIELDS_KEY
from ..dataset.writer import MIN_FRAME_SIZE
from ..physical.zframe import DEFAULT_LEVEL
from ..physical.zstd import DEFAULT_FRAME_SIZE, MAX_FRAME_SIZE
from .output import new_file, output_writer, refuse_container, refuse_overwrite, replacing
from .registry import (
    alignment_arg,
    at_least_one,
    command,
    force_arg,
    format_version_arg,
    int_range,
    json_arg,
    json_object,
)
from .render import (
    EXIT_OK,
    EXIT_PROBLEMS,
    PROG,
    CliError,
    field_names,
    note,
    open_dataset,
    plural,
    progress,
)

ZSTD_LEVELS = (-(1 << 17), 22)  # zstd's negative "fast" levels, then 1 (fast) to 22 (small)


def uncommitted_tail(args: argparse.Namespace, ds: evs.Dataset, path: str) -> int:
    """Bytes after ``path``'s last commit (a writer died, or is writing), which OUT will not
    hold. When OUT is ``path`` itself, replacing it would lose them: refused (exit 2)."""
    tail = ds.uncommitted_bytes
    if tail and os.path.exists(args.output) and os.path.samefile(args.output, path):
        raise CliError(
            path,
            f"has an uncommitted tail ({tail:,} bytes after the last commit) that replacing "
            f'it would lose; "{PROG} recover {path}" first keeps what it holds',
        )
    return tail


def tail_note(args: argparse.Namespace, path: str, tail: int) -> None:
    if tail:
        note(
            args,
            f"{PROG}: {path}: its uncommitted tail ({tail:,} bytes after the last commit) "
            f'is not in {args.output}; "{PROG} recover {path}" first keeps what it holds',
        )


def _merge_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="FILE", help="containers, in order")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="container to write")
    p.add_argument("--metadata", type=json_object, metavar="JSON", help="instead of the first's")
    format_version_arg(p)
    force_arg(p)


@command(
    "merge", "concatenate containers", "evalue-store merge a.evs b.evs -o all.evs", _merge_args
)
def cmd_merge(args: argparse.Namespace) -> int:
    refuse_overwrite(args.output, args.force)
    datasets = [open_dataset(path) for path in args.inputs]
    try:
        tails = [uncommitted_tail(args, ds, path) for ds, path in zip(datasets, args.inputs)]
        metadata = dict(args.metadata if args.metadata is not None else datasets[0].metadata)
        names = {field_names(ds) for ds in datasets}
        if len(names) == 1 and FIELDS_KEY not in metadata and names != {()}:
            metadata[FIELDS_KEY] = list(names.pop())  # --metadata replaces the rest only
        elif len(names) > 1 and args.metadata is None:
            metadata.pop(FIELDS_KEY, None)  # records named differently, or not: positional
        total = sum(len(ds) for ds in datasets)
        with (
            output_writer(
                args.output,
                append=False,
                force=args.force,
                metadata=metadata,
                alignment=datasets[0].alignment,
                format_version=args.format_version,
            ) as writer,
            progress(args, total, "merge", "rec") as bar,
        ):
            for ds, path in zip(datasets, args.inputs):
                try:
                    copy_raw(ds, writer, bar)
                except evs.EncodeError as exc:  # a record that does not fit OUT's names
                    raise CliError(path, str(exc)) from None
    finally:
        for ds in datasets:
            ds.close()
    print(
        f"merged {plural(total, 'record')} from {plural(len(datasets), 'file')} into {args.output}"
    )
    if len(names) > 1:
        print(f"the inputs name their fields differently: {args.output} names none")
    for path, tail in zip(args.inputs, tails):
        tail_note(args, path, tail)
    return EXIT_OK


def _copy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="container to copy")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="container to write")
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave out records that fail their checks (each is listed) instead of stopping",
    )
    p.add_argument(
        "--alignment", type=alignment_arg, metavar="N", help="OUT's alignment (default FILE's)"
    )
    format_version_arg(p)
    force_arg(p)
    json_arg(p)


@command(
    "copy",
    "rewrite a container record by record, optionally leaving out damaged records",
    "evalue-store copy train.evs -o clean.evs --skip-bad",
    _copy_args,
    notes="""Records are copied as stored (exact), each checked on the way: its frame, checksum
and structure. A compressed FILE gives a compressed OUT (with its dictionary). Without
--skip-bad the first damaged record stops the copy and OUT is not written; with it, the
records left out are listed and the exit code is 1, since data was lost. Records after a
left-out one move up by one index.""",
)
def cmd_copy(args: argparse.Namespace) -> int:
    alignment = args.alignment
    refuse_overwrite(args.output, args.force)
    skipped: list[tuple[int, str]] = []

    def leave_out(i: int, error: evs.FormatError) -> None:
        reason = error.detail
        if not args.skip_bad:
            raise CliError(
                args.file,
                f"record {i}: {reason} (--skip-bad leaves such records out)",
                EXIT_PROBLEMS,
            )
        skipped.append((i, reason))

    with open_dataset(args.file) as ds:
        tail = uncommitted_tail(args, ds, args.file)
        options: dict[str, Any] = {}
        if ds.compressed:
            options = {"compression": "zstd", "dictionary": evs.read_dictionary(args.file)}
        copy_records(ds, args, "copy", on_bad=leave_out, alignment=alignment, **options)
        copied = len(ds) - len(skipped)
    if args.json:
        out = {
            "file": args.file,
            "output": args.output,
            "records_copied": copied,
            "skipped": [{"index": i, "reason": r} for i, r in skipped],
        }
        print(json.dumps(out, indent=2))
    else:
        print(f"copied {plural(copied, 'record')} from {args.file} into {args.output}")
        if skipped:
            print(f"left out {plural(len(skipped), 'damaged record')}:")
            for i, reason in skipped[:50]:
                print(f"  record {i}: {reason}")
            if len(skipped) > 50:
                print(f"  ... and {len(skipped) - 50:,} more (--json lists all)")
    tail_note(args, args.file, tail)
    return EXIT_PROBLEMS if skipped else EXIT_OK


def _compress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="container to compress")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="compressed container")
    p.add_argument(
        "--level",
        type=int_range(*ZSTD_LEVELS),
        default=DEFAULT_LEVEL,
        help=f"zstd level, up to 22 (default {DEFAULT_LEVEL})",
    )
    p.add_argument(
        "--frame-size",
        type=int_range(MIN_FRAME_SIZE, MAX_FRAME_SIZE),
        default=DEFAULT_FRAME_SIZE,
        metavar="BYTES",
        help=f"target frame size (default {DEFAULT_FRAME_SIZE})",
    )
    choice = p.add_mutually_exclusive_group()
    choice.add_argument(
        "--dictionary",
        action="store_true",
        help="train OUT's zstd dictionary on --dict-samples records (default: on its first frames)",
    )
    choice.add_argument(
        "--no-dictionary",
        action="store_true",
        help="store no dictionary (stock zstd -d then needs no -D)",
    )
    p.add_argument(
        "--dict-samples",
        type=at_least_one,
        default=1000,
        metavar="N",
        help="records --dictionary trains on",
    )
    format_version_arg(p)
    force_arg(p)


@command(
    "compress",
    "rewrite a container as seekable zstd frames; random access and appends still work",
    "evalue-store compress train.evs -o train.evs.zst --dictionary",
    _compress_args,
    notes="""OUT holds the same records and metadata as one new commit. Its zstd dictionary is
trained on its first frames and kept if it makes them smaller. Stock zstd decompresses OUT
with it: "evalue-store dictionary OUT -o DICT", then "zstd -d -D DICT OUT" (the dictionary
is also bytes 20 to 20+D of OUT, D the little-endian u32 at byte 16; 0: none). With
--no-dictionary, "zstd -d OUT" needs none.""",
)
def cmd_compress(args: argparse.Namespace) -> int:
    refuse_overwrite(args.output, args.force)
    before = os.path.getsize(args.file)  # OUT may be FILE itself (with --force)
    with open_dataset(args.file) as ds:
        tail = uncommitted_tail(args, ds, args.file)
        options: dict[str, Any] = {
            "compression": "zstd",
            "level": args.level,
            "frame_size": args.frame_size,
        }
        if args.dictionary:
            samples = ds[: max(8, min(len(ds), args.dict_samples))]
            options["dictionary"] = evs.train_dictionary(samples)
        elif args.no_dictionary:
            options["dictionary"] = None
        copy_records(ds, args, "compress", **options)
    after = os.path.getsize(args.output)
    print(
        f"compressed {args.file} ({before:,} bytes) into {args.output} ({after:,} bytes, "
        f"{after / max(before, 1):.2f}x)"
    )
    tail_note(args, args.file, tail)
    return EXIT_OK


def copy_records(
    ds: evs.Dataset,
    args: argparse.Namespace,
    what: str,
    on_bad: Callable[[int, evs.FormatError], None] | None = None,
    alignment: int | None = None,
    **options: Any,
) -> None:
    """Write every record of ``ds`` to args.output (a new file) with Writer ``options``,
    and ``ds``'s alignment unless ``alignment`` is given."""
    with (
        output_writer(
            args.output,
            append=False,
            force=args.force,
            metadata=ds.metadata,
            alignment=ds.alignment if alignment is None else alignment,
            format_version=args.format_version,
            **options,
        ) as writer,
        progress(args, len(ds), what, "rec") as bar,
    ):
        copy_raw(ds, writer, bar, on_bad)


def copy_raw(
    ds: evs.Dataset,
    writer: evs.Writer,
    bar: Any,
    on_bad: Callable[[int, evs.FormatError], None] | None = None,
) -> None:
    """Copy every record's payload bytes as they are (exact, and no decoding); only the
    padding before tensor data changes when the alignments differ. A record that fails its
    checks stops the copy, unless ``on_bad(index, error)`` is given to decide."""
    for i in range(len(ds)):
        bar.update()
        try:
            writer.append_raw(ds.raw(i), ds.alignment)
        except evs.FormatError as exc:
            if on_bad is None:
                raise
            on_bad(i, exc)


def _decompress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="compressed container")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="plain container")
    force_arg(p)


@command(
    "decompress",
    "turn a compressed container back into the plain one (what zstd -d gives)",
    "evalue-store decompress train.evs.zst -o train.evs",
    _decompress_args,
    notes="""OUT is byte for byte the logical stream up to the last commit, commit history
included: what the stock "zstd -d" writes (no dictionary flag needed here) for a file
without an uncommitted tail. A tail (a writer died) is not copied, and a note says so: run
"evalue-store recover FILE" first to keep the records it holds.""",
)
def cmd_decompress(args: argparse.Namespace) -> int:
    refuse_overwrite(args.output, args.force)
    with open_dataset(args.file) as ds:
        if not ds.compressed:
            raise CliError(args.file, "is not compressed")
        tail = uncommitted_tail(args, ds, args.file)
        with replacing(args.output) as temp:
            with open(temp, "xb") as out, progress(args, ds.logical_size, "decompress", "B") as bar:
                for chunk in ds.logical_chunks():
                    out.write(chunk)
                    bar.update(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            with evs.open(temp) as check:  # what we wrote must be a valid container
                if len(check) != len(ds):
                    raise CliError(args.output, "decompressed output lost records")
    print(f"decompressed {args.file} into {args.output} ({os.path.getsize(args.output):,} bytes)")
    tail_note(args, args.file, tail)
    return EXIT_OK


def _dictionary_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="compressed container")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="dictionary file")
    force_arg(p)


@command(
    "dictionary",
    "write out the zstd dictionary a compressed container was made with",
    "evalue-store dictionary train.evs.zst -o train.dict && zstd -d -D train.dict train.evs.zst",
    _dictionary_args,
)
def cmd_dictionary(args: argparse.Namespace) -> int:
    refuse_container(args.output, "a dictionary")
    refuse_overwrite(args.output, args.force)
    open_dataset(args.file).close()  # a file that is no container is a one-line error
    data = evs.read_dictionary(args.file)
    if data is None:
        raise CliError(args.file, "holds no dictionary (zstd -d needs none)", EXIT_PROBLEMS)
    with new_file(args.output) as out:
        out.write(data)
    print(f"wrote the {len(data):,}-byte dictionary of {args.file} to {args.output}")
    return EXIT_OK
