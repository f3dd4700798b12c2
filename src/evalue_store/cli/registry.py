"""The subcommand registry, the parser built from it, and the argument types and
arguments that several commands declare.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import evalue_store as evs

from ..container import valid_alignment
from ..metadata import encode_metadata
from .render import EXIT_USAGE, PROG


@dataclass(frozen=True)
class Command:
    """One subcommand: how it parses its arguments and what it runs."""

    name: str
    summary: str
    example: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    notes: str = ""


COMMANDS: list[Command] = []


def command(
    name: str,
    summary: str,
    example: str,
    arguments: Callable[[argparse.ArgumentParser], None],
    notes: str = "",
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register ``run(args) -> exit code`` as subcommand ``name``.

    ``example`` and ``notes`` go in the command's --help epilog.
    """

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS.append(Command(name, summary, example, arguments, run, notes))
        return run

    return register


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """One line instead of argparse's usage dump, as for every other error."""
        where = self.prog[len(PROG) :].strip()
        where = f"{where}: " if where else ""
        self.exit(EXIT_USAGE, f"{PROG}: {where}{message} (see {self.prog} --help)\n")


def build_parser(groups: Sequence[ModuleType]) -> argparse.ArgumentParser:
    """The parser of every registered command: group by group (the modules that register
    them), in the order of ``groups``, then in the order each module registers its own."""
    parser = _Parser(
        prog=PROG,
        description="Pack, inspect, check, recover and export evalue_store containers.",
        epilog="exit codes: 0 ok, 1 verification or data problems found, "
        "2 usage error or unreadable input\n\nexample:\n  evalue-store demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {evs.__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes")
    common.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    order = [group.__name__ for group in groups]
    for cmd in sorted(COMMANDS, key=lambda cmd: order.index(cmd.run.__module__)):
        sub = subparsers.add_parser(
            cmd.name,
            help=cmd.summary,
            description=cmd.summary,
            epilog=(cmd.notes + "\n\n" if cmd.notes else "") + f"example:\n  {cmd.example}",
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.arguments(sub)
        sub.set_defaults(run=cmd.run, parser=sub)
    return parser


def file_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="an evalue_store container")


def force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")


def format_version_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format-version",
        choices=("1.1", "1.0"),
        default="1.1",
        help="format of a new OUT: 1.1 (CRC-32C checksums, the default) or 1.0 (CRC-32, "
        "for readers older than 1.1); appending keeps OUT's own",
    )


def json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output (stable keys)")


def json_object(text: str) -> dict:
    """argparse type for --metadata: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError("nested too deeply to store") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('must be a JSON object, like \'{"name": "w1"}\'')
    try:
        encode_metadata(value)  # what a file can store: no NaN, no huge integer, no key twice
    except evs.EncodeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in [low, high], checked before any work (out of range, it
    would surface later as an error blamed on the input file, or as a silent no-op)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if high is None and value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    return parse


at_least_one = int_range(1)


def alignment_arg(text: str) -> int:
    """argparse type for --alignment: a power of two from 8 to 65536."""
    value = int_range(8, 65536)(text)
    if not valid_alignment(value):
        raise argparse.ArgumentTypeError(f"must be a power of two from 8 to 65536, not {value}")
    return value
