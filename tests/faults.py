"""Interrupts at syscall boundaries, for the signal tests.

A Python signal handler (SIGINT's KeyboardInterrupt, a SIGTERM handler that raises
SystemExit) runs between two bytecodes, so its exception can surface right before or right
after any system call the library makes. ``interrupt_at(n)`` raises it exactly there: at the
n-th call, counted over the file-system calls below, before the call or after it returned.
``count_calls`` says how many boundaries an operation has, so a test can try every one.

A handler's exception can also surface between two statements that make no system call
(a buffered write changes only the writer's own state): ``interrupt_at_line(n)`` raises it
before the n-th line the library executes in this thread, ``count_lines`` counts them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import evalue_store

LIBRARY = os.path.dirname(evalue_store.__file__) + os.sep

# (module, name) of every call the library's durability depends on.
CALLS = [
    (os, n)
    for n in (
        "open",
        "close",
        "pwrite",
        "write",
        "pread",
        "fsync",
        "ftruncate",
        "replace",
        "rename",
        "unlink",
        "fstat",
        "stat",
    )
] + [(fcntl, "flock")]


class _Counter:
    def __init__(self, target: int | None, when: str, exc: type[BaseException]):
        self.calls = 0
        self.target = target
        self.when = when
        self.exc = exc
        self.fired = ""  # the name of the call it fired at, once it has
        self.seen: list[str] | None = None  # the names of the calls made, when kept

    def wrap(self, name: str, real: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.seen is not None:
                self.seen.append(name)
            hit = not self.fired and self.calls == self.target
            if hit and self.when == "before":
                self.fired = name
                raise self.exc()
            result = real(*args, **kwargs)
            if hit:
                self.fired = name
                raise self.exc()
            return result

        return call


@contextlib.contextmanager
def _patched(counter: _Counter) -> Iterator[_Counter]:
    saved = [(mod, name, getattr(mod, name)) for mod, name in CALLS]
    try:
        for mod, name, real in saved:
            setattr(mod, name, counter.wrap(name, real))
        yield counter
    finally:
        for mod, name, real in saved:
            setattr(mod, name, real)


def interrupt_at(
    n: int, when: str = "after", exc: type[BaseException] = KeyboardInterrupt
) -> contextlib.AbstractContextManager[_Counter]:
    """Raise ``exc`` at the ``n``-th call (1-based), ``before`` it or ``after`` it returned.
    ``counter.fired`` names the call it fired at ("" if it was not reached)."""
    assert when in ("before", "after")
    return _patched(_Counter(n, when, exc))


@contextlib.contextmanager
def recorded_calls(names: list[str]) -> Iterator[list[str]]:
    """Appends to ``names`` the calls above made inside the block, in order
    (``interrupt_at(n)`` around the same block fires at the n-th)."""
    with _patched(_Counter(None, "after", KeyboardInterrupt)) as counter:
        counter.seen = names
        yield names


def count_calls(operation: Callable[[], Any]) -> int:
    """How many of the calls above ``operation`` makes (run it on a scratch copy)."""
    with _patched(_Counter(None, "after", KeyboardInterrupt)) as counter:
        operation()
    return counter.calls


class _LineCounter:
    """A trace function counting the lines run in the library's frames, and a context
    manager that sets it for this thread; raises ``exc`` before the ``target``-th line
    (None: never)."""

    def __init__(self, target: int | None, exc: type[BaseException]):
        self.lines = 0
        self.target = target
        self.exc = exc
        self.fired = ""  # function:line it fired at, once it has
        self.seen: list[str] | None = None  # each line's function name, when kept

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if not frame.f_code.co_filename.startswith(LIBRARY):
            return None  # no line events there; calls into the library are still seen
        if event == "line":
            self.lines += 1
            if self.seen is not None:
                self.seen.append(frame.f_code.co_name)
            if self.lines == self.target:
                self.fired = f"{frame.f_code.co_name}:{frame.f_lineno}"
                raise self.exc()
        return self

    def __enter__(self) -> _LineCounter:
        sys.settrace(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(None)


def interrupt_at_line(n: int | None, exc: type[BaseException] = KeyboardInterrupt) -> _LineCounter:
    """A context manager raising ``exc`` before the ``n``-th library line run in this thread
    (1-based; None: never, to count them in ``lines``). ``fired`` names where ("" if it was
    not reached)."""
    return _LineCounter(n, exc)


@contextlib.contextmanager
def recorded_lines(names: list[str]) -> Iterator[list[str]]:
    """Appends to ``names`` the function name of each library line run in this thread
    inside the block (``interrupt_at_line(n)`` around the same block fires before the
    n-th)."""
    counter = _LineCounter(None, KeyboardInterrupt)
    counter.seen = names
    with counter:
        yield names


def cut_short(operation: Callable[[], Any], interrupt: Any) -> None:
    """Run ``operation`` inside ``interrupt`` (one of the context managers above) and
    catch the KeyboardInterrupt it raises, as a training loop that survives Ctrl-C does."""
    with interrupt:
        try:
            operation()
        except KeyboardInterrupt:
            pass
