"""``verify`` and ``recover``: check every checksum and record; after a crash, keep what
was committed and salvage whole records from the tail.
"""

from __future__ import annotations

import argparse
import json

import evalue_store as evs

from .registry import command, file_arg, json_arg
from .render import EXIT_OK, EXIT_PROBLEMS, PROG, open_dataset, plural, progress


def _verify_args(p: argparse.ArgumentParser) -> None:
    file_arg(p)
    json_arg(p)


@command("verify", "check every checksum and record", "evalue-store verify train.evs", _verify_args)
def cmd_verify(args: argparse.Namespace) -> int:
    with open_dataset(args.file) as ds, progress(args, len(ds), "verify", "rec") as bar:
        report = ds.verify(progress=lambda done: bar.update(done - bar.n))
    bad = report.bad_records
    if args.json:
        out = {
            "file": args.file,
            "ok": report.ok,
            "records": report.records,
            "bytes_checked": report.bytes_checked,
            "bad_records": [{"index": i, "reason": r} for i, r in bad],
            "problems": report.problems,
            "uncommitted_bytes": report.uncommitted_bytes,
        }
        print(json.dumps(out, indent=2))
    elif report.ok:
        print(
            f"{args.file}: OK, {report.records:,} records, {report.bytes_checked:,} bytes checked"
        )
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
    return EXIT_OK if report.ok else EXIT_PROBLEMS


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
