"""``verify`` and ``recover``: check every checksum and record; after a crash, keep what
was committed and salvage whole records from the tail.
"""

from __future__ import annotations

import argparse
import json

import evalue_store as evs

from .registry import command, file_arg, int_range, json_arg
from .render import (
    EXIT_OK,
    EXIT_PROBLEMS,
    PROG,
    CliError,
    open_dataset,
    plural,
    progress,
)


def _verify_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    json_arg(p)
    g = p.add_argument_group("against an ExecuTorch program (needs the [executorch] extra)")
    g.add_argument(
        "--pte",
        metavar="PROGRAM",
        help="also check that every record fits the inputs of a method of this .pte program",
    )
    g.add_argument("--method", default="forward", help="the program's method (default: forward)")
    g.add_argument(
        "--fields",
        metavar="A,B,...",
        help="the record values feeding the method's inputs, in input order: names or "
        "positions (default: every value of a record, in order)",
    )
    g.add_argument(
        "--batch-size",
        type=int_range(1),
        metavar="N",
        help="for a program with a dynamic batch: the batch size to check (default: its bound)",
    )


def _fields(text: str | None) -> list[str | int] | None:
    if text is None:
        return None
    return [int(f) if f.strip().isdigit() else f.strip() for f in text.split(",")]


def _program_check(args: argparse.Namespace) -> tuple[dict | None, str | None]:
    """Bind the file to ``--pte``'s method: (a summary of the fit, None) or (None, why not)."""
    try:
        from evalue_store.executorch import bind
    except ImportError as exc:
        raise CliError(None, str(exc)) from None
    try:
        binding = bind(
            args.file,
            args.pte,
            args.method,
            fields=_fields(args.fields),
            batch_size=args.batch_size,
        )
    except evs.InputMismatchError as exc:
        return None, str(exc)
    except evs.FormatError:
        raise
    except ValueError as exc:  # the program's method, or a batch size it cannot take
        raise CliError(args.pte, str(exc)) from None
    with binding.dataset:
        records = len(binding.dataset)
    inputs = [
        {"input": f.spec.index, "expects": f.spec.describe(), "field": f.name}
        for f in binding.fields
    ]
    left = records % binding.batch_size
    return {
        "program": args.pte,
        "method": args.method,
        "inputs": inputs,
        "batch_size": binding.batch_size,
        "batches": len(binding),
        "last": binding.last,
        "records_dropped": left if binding.last == "drop" else 0,
    }, None


@command("verify", "check every checksum and record", "evalue-store verify train.evs", _verify_args)
def cmd_verify(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds, progress(args, len(ds), "verify", "rec") as bar:
        report = ds.verify(progress=lambda done: bar.update(done - bar.n))
    bad = report.bad_records
    fit, misfit = None, None
    if args.pte and report.ok:  # a damaged record would stop the program check half-way
        fit, misfit = _program_check(args)
    ok = report.ok and misfit is None
    if args.json:
        out = {
            "file": args.file,
            "ok": ok,
            "records": report.records,
            "bytes_checked": report.bytes_checked,
            "bad_records": [{"index": i, "reason": r} for i, r in bad],
            "problems": report.problems,
            "uncommitted_bytes": report.uncommitted_bytes,
        }
        if args.pte:
            out["program_check"] = fit or {"program": args.pte, "method": args.method}
            out["program_check"]["fits"] = fit is not None
            out["program_check"]["mismatch"] = misfit
        print(json.dumps(out, indent=2))
    elif report.ok:
        print(
            f"{args.file}: OK, {report.records:,} records, {report.bytes_checked:,} bytes checked"
        )
        if fit:
            print(f"  every record fits {args.method!r} of {args.pte}:")
            for i in fit["inputs"]:
                print(f"    input {i['input']}, {i['expects']}: {i['field']}")
            dropped = fit["records_dropped"]
            print(
                f"    {fit['batches']:,} batches of {fit['batch_size']}"
                + (f" ({plural(dropped, 'last record')} dropped)" if dropped else "")
            )
        elif misfit:
            print(f"  does not fit {args.method!r} of {args.pte}:")
            print(f"    {misfit}")
    else:
        print(
            f"{args.file}: {plural(len(bad), 'bad record')}, "
            f"{plural(len(report.problems), 'other problem')} ({report.records:,} records checked)"
        )
        for i, reason in bad[:50]:
            print(f"  record {i}: {reason}")
        if len(bad) > 50:
            print(f"  ... and {len(bad) - 50:,} more bad records (--json lists all)")
        for problem in report.problems:
            print(f"  {problem}")
        if report.uncommitted_bytes:
            print(f"  next: `{PROG} recover {args.file}`")
        elif bad:
            print(f"  next: `{PROG} copy {args.file} -o CLEAN --skip-bad` leaves them out")
        if args.pte:
            print(f"  not checked against {args.pte}: the problems above come first")
    return EXIT_OK if ok else EXIT_PROBLEMS


@command(
    "recover",
    "after a crash: keep committed records, salvage whole ones from the tail, set the rest aside",
    "evalue-store recover train.evs",
    file_arg,
)
def cmd_recover(args: argparse.Namespace) -> int:
    open_dataset(args.file).close()  # a file that is no container is a one-line error
    s = evs.recover(args.file)
    if not s.tail_bytes:
        print(
            f"{args.file}: nothing to recover: {s.committed_records:,} committed records, no tail"
        )
        return EXIT_OK
    print(f"{args.file}: kept {s.committed_records:,} committed records")
    print(
        f"salvaged {s.salvaged_records:,} complete records from the {s.tail_bytes:,}-byte "
        "uncommitted tail; they are committed now"
    )
    if s.side_file:
        print(f"moved {s.damaged_bytes:,} damaged tail bytes to {s.side_file} (nothing deleted)")
    return EXIT_OK
