"""The ``evalue-store`` command line: pack, inspect, check, recover, export and merge containers.

Each subcommand is one function registered with ``@command`` plus a function that declares its
arguments, so adding a subcommand is a few lines. Exit codes: 0 ok, 1 verification or data
problems found, 2 usage error or unreadable input. Errors are one line on stderr,
``evalue-store: FILE: problem``; ``--debug`` shows the traceback instead.

The modules: ``registry`` (the commands and their parser), ``render`` (exit codes, errors and
text shared by the commands), ``output`` (writing outputs safely), then one module per group
of commands: ``demo``; ``info`` (info, head, show); ``stats`` (and ``stats_html``); ``verify``
(verify, recover); ``pack`` (pack, export); ``copy`` (merge, copy, compress, decompress,
dictionary).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import copy, demo, info, pack, stats, verify
from .output import release
from .registry import build_parser
from .render import EXIT_OK, PROG, CliError, error_line

__all__ = ["CliError", "Terminated", "main"]

# The command groups, in the order `evalue-store --help` lists them.
GROUPS = (demo, info, stats, verify, pack, copy)


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


def script() -> int:
    """The ``evalue-store`` program: ``main``, then the interpreter's exit with SIGINT and
    SIGTERM ignored. The run is over and reported by then; a signal landing in an exit
    handler (tqdm registers one) would print a traceback over a finished run."""
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


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
    finally:
        release()  # the locks a failed run took on the outputs it was to replace
