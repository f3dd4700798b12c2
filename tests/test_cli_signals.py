"""Ctrl-C and SIGTERM during the CLI's replacing commands (copy, merge, compress, decompress,
pack --force): at every file-system call, before it and after it, and as real signals.

The promise (docs/CLI.md, "Interrupted runs"): OUT is either as it was or complete and
valid, the inputs are never changed, and no temporary file survives, except one that the
interrupt hit while it was being removed, which then still carries its ``.partial`` name.
"""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

import evalue_store as evs
from evalue_store import cli
from tests import faults
from tests.faults import count_calls, interrupt_at
from tests.test_cli import ENV, replacing_commands

COMMANDS = ["copy", "merge", "compress", "decompress", "pack"]


def main(argv: list[str]) -> int | None:
    """cli.main, quiet; None when the interrupt escaped it (it never should)."""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        try:
            return cli.main(argv)
        except KeyboardInterrupt:
            return None


def call_names(argv: list[str]) -> list[str]:
    """The name of every call faults.interrupt_at counts, in order, for one run."""
    names: list[str] = []
    saved = [(mod, name, getattr(mod, name)) for mod, name in faults.CALLS]

    def recorder(name: str, real):
        def call(*args, **kwargs):
            names.append(name)
            return real(*args, **kwargs)

        return call

    try:
        for mod, name, real in saved:
            setattr(mod, name, recorder(name, real))
        assert main(argv) == 0
    finally:
        for mod, name, real in saved:
            setattr(mod, name, real)
    return names


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def contents(path: Path) -> tuple[dict, list[bytes]]:
    with evs.open(path) as ds:
        assert ds.verify().ok
        return ds.metadata, [bytes(ds.raw(i)) for i in range(len(ds))]


class Case:
    """One command over a template folder: its inputs and an old OUT, restored per trial."""

    def __init__(self, name: str, root: Path):
        self.template = root / "template"
        self.template.mkdir()
        args = replacing_commands(self.template)[name]
        with evs.Writer(self.template / "out.evs") as w:
            w.append(["old"])
        self.old = snapshot(self.template)
        self.trial = root / "trial"
        rel = [str(a).replace(str(self.template), str(self.trial)) for a in args]
        self.argv = [*rel, "-o", str(self.trial / "out.evs"), "--force", "-q"]
        self.reset()
        self.names = call_names(self.argv)
        self.want = contents(self.trial / "out.evs")
        self.reset()
        assert count_calls(lambda: main(self.argv)) == len(self.names)  # same boundaries
        self.reset()

    def reset(self) -> None:
        shutil.rmtree(self.trial, ignore_errors=True)
        shutil.copytree(self.template, self.trial)

    def check(self, what: str, partial_allowed: bool) -> bool:
        """The promise after an interrupted run; True when OUT was replaced."""
        now = snapshot(self.trial)
        for name, data in self.old.items():
            if name != "out.evs":
                assert now.get(name) == data, f"{what}: input {name} changed"
        left = set(now) - set(self.old)
        assert all(n.startswith("out.evs.") and n.endswith(".partial") for n in left), (what, left)
        assert partial_allowed or not left, f"{what}: temporary file left: {left}"
        if now["out.evs"] == self.old["out.evs"]:
            return False
        assert contents(self.trial / "out.evs") == self.want, f"{what}: OUT neither old nor new"
        return True


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMANDS)
def test_interrupt_at_every_call_leaves_out_old_or_complete(name, scratch, monkeypatch):
    # argparse looks each help string up in a message catalog: with LANG set to a locale
    # other than C (C.UTF-8 here), that is an os.stat of a missing .mo file per string,
    # ~200 of the ~240 boundaries, all while the parser is built, before any file is
    # touched (and none where LANG is unset). The sweep covers the command's own calls.
    monkeypatch.setenv("LANGUAGE", "C")
    case = Case(name, scratch)
    replaced = {False: 0, True: 0}
    for exc, code in ((KeyboardInterrupt, 130), (cli.Terminated, 143)):
        for n in range(1, len(case.names) + 1):
            for when in ("before", "after"):
                what = f"{exc.__name__} {when} call {n} ({case.names[n - 1]})"
                with interrupt_at(n, when, exc) as counter:
                    got = main(case.argv)
                # A call that raised (a stat of a missing file) has no "after": no interrupt.
                assert counter.fired or when == "after", what
                assert got == (code if counter.fired else 0), f"{what}: exit {got}"
                # Only an interrupt landing on the removal of the temporary file can keep it.
                in_cleanup = when == "before" and case.names[n - 1] == "unlink"
                replaced[case.check(what, partial_allowed=in_cleanup)] += 1
                case.reset()
    assert replaced[False] and replaced[True]  # both outcomes were reached


def big_input(folder: Path) -> Path:
    path = folder / "big.evs"
    with evs.Writer(path) as w:
        for i in range(400):
            w.append([i, np.full(16384, i, np.float32)])  # 64 KiB each, 26 MB in all
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_real_signals_during_a_copy(sig, tmp_path):
    """A real signal at a few moments of a copy of a 26 MB file, in a subprocess."""
    source = big_input(tmp_path)
    want = contents(source)
    old = tmp_path / "old.evs"
    with evs.Writer(old) as w:
        w.append(["old"])
    out = tmp_path / "out.evs"
    rng = random.Random(int(sig))
    outcomes = set()
    for trial in range(6):
        shutil.copyfile(old, out)
        proc = subprocess.Popen(
            [sys.executable, "-m", "evalue_store", "copy", source, "-o", out, "--force", "-q"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=ENV,
        )
        if trial % 2:  # at a random moment from the start: some land during start-up
            time.sleep(rng.uniform(0.2, 1.5))
        else:  # a random moment after the temporary file appeared: during the copy
            while proc.poll() is None and not list(tmp_path.glob("*.partial")):
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        # Handled: 128 + signal, and the cleanup ran. Too late: the copy had finished (0).
        # During Python's start-up, before main() runs, the signal gets its default action
        # (docs/CLI.md): -signal, or for SIGINT Python's KeyboardInterrupt traceback and
        # exit status 1, from a frame outside the CLI's main() (site.py has a main() too:
        # a signal during its imports is start-up). Nothing was written yet.
        text = err.decode()
        in_startup = (
            sig == signal.SIGINT
            and proc.returncode == 1
            and text.rstrip().endswith("KeyboardInterrupt")
            and re.search(r"cli[/\\]__init__\.py\", line \d+, in main\n", text) is None
        )
        assert in_startup or proc.returncode in (0, 128 + sig, -sig), (proc.returncode, text)
        outcomes.add(proc.returncode)
        assert in_startup or proc.returncode == -sig or "Traceback" not in text, text
        left = sorted(n for n in os.listdir(tmp_path) if n.endswith(".partial"))
        assert left == [], left
        if out.read_bytes() != old.read_bytes():
            assert contents(out) == want
        assert contents(source) == want
    assert 128 + sig in outcomes, f"no signal landed during a copy: {outcomes}"
