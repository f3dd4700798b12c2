"""The ``evalue-store`` command line: pack, inspect, check, recover, export and merge containers.

Each subcommand is one function registered with ``@command`` plus a function that declares its
arguments, so adding a subcommand is a few lines. Exit codes: 0 ok, 1 verification or data
problems found, 2 usage error or unreadable input. Errors are one line on stderr,
``evalue-store: FILE: problem``; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from . import copy, info, pack, stats, verify
from .info import info_report, print_head, print_info
from .pack import expand_inputs, pack_files
from .registry import build_parser, command
from .render import EXIT_OK, EXIT_PROBLEMS, PROG, CliError, error_line, open_dataset

__all__ = ["CliError", "Terminated", "main"]

# The command groups, in the order `evalue-store --help` lists them.
GROUPS = (sys.modules[__name__], info, stats, verify, pack, copy)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same cleanup runs: a
    killed run leaves no temporary file behind and never a partial output under OUT."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into Terminated while a command runs (when its default action is set and
    this is the main thread: a host program's own handler is left alone)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``evalue-store`` script and of ``python -m evalue_store``."""
    try:
        with sigterm_raises():
            return run_command(argv)
    except KeyboardInterrupt as exc:  # the cleanup ran on the way out
        terminated = isinstance(exc, Terminated)
        print(f"{PROG}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


def run_command(argv: list[str] | None) -> int:
    parser = build_parser(GROUPS)
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the command's parser, which names its own --help
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "run"):
        parser.error("no command given; try `evalue-store demo`")
    try:
        return args.run(args)
    except BrokenPipeError:  # `evalue-store head f | head -3`: the reader left, that is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        if args.debug:
            raise
        code, line = error_line(exc, getattr(args, "file", None))
        print(f"{PROG}: {line}", file=sys.stderr)
        return code


DEMO_RECORDS = 300


def demo_record(i: int) -> dict[str, Any]:
    """Record ``i`` of the built-in W1-like sample (tokens, features, label, id)."""
    rng = np.random.default_rng(i)
    return {
        "tokens": rng.integers(0, 32_000, 128, dtype=np.int64),
        "features": rng.standard_normal(16).astype(np.float32),
        "label": int(rng.integers(0, 10)),
        "id": f"w1-{i:05d}",
    }


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", metavar="DIR", help="where to put the demo (default: a new temp dir)")


@command(
    "demo",
    f"pack a built-in sample of {DEMO_RECORDS} W1-like records, read, verify and show it",
    "evalue-store demo --dir /tmp/evs-demo",
    _demo_args,
)
def cmd_demo(args: argparse.Namespace) -> int:
    folder = args.dir or tempfile.mkdtemp(prefix="evalue-store-demo-")
    samples = os.path.join(folder, "samples")
    os.makedirs(samples, exist_ok=True)
    for i in range(DEMO_RECORDS):
        np.savez(os.path.join(samples, f"{i:05d}.npz"), **demo_record(i))
    print(f"1. wrote {DEMO_RECORDS} sample .npz files to {samples}")
    out = os.path.join(folder, "demo.evs")
    pack = argparse.Namespace(
        **vars(args), sources=[samples], output=out, dtype="float32", append=False, force=True
    )
    pack.metadata = {"dataset": "evalue-store demo (W1-like)"}
    written, size = pack_files(expand_inputs(pack), pack)
    print(f"2. packed them: {PROG} pack {samples} -o {out}  ({written} records, {size:,} bytes)")
    with open_dataset(out) as ds:
        for i, record in enumerate(ds):
            want = demo_record(i)
            same = [np.array_equal(record[0], want["tokens"])]
            same.append(np.array_equal(record[1], want["features"]))
            if not all(same) or record[2:] != [want["label"], want["id"]]:
                raise CliError(out, f"record {i} does not match sample {i}", EXIT_PROBLEMS)
        print(f"3. read back all {len(ds)} records: identical to the samples")
        report = ds.verify()
        if not report.ok:
            raise CliError(out, "; ".join(report.problems) or "bad records", EXIT_PROBLEMS)
        print(f"4. {PROG} verify {out}: OK, {report.bytes_checked:,} bytes checked")
        print(f"\n5. {PROG} info {out}")
        print_info(*info_report(ds))
        print(f"\n6. {PROG} head {out} -n 2")
        print_head(ds, 2)
    print(f"\nthe demo file is {os.path.abspath(out)}")
    print(f"next: {PROG} stats {out} --html {os.path.join(folder, 'report.html')}")
    return EXIT_OK
