"""Reads that race ``close()``.

Another thread may close a dataset while one of its reads is under way (a loader shutting
down, a cleanup handler). The read then fails somewhere in its layers, on a source that is
gone: an attribute of None, a released buffer, a short read of a closed file, which a
layer reports as a damaged file. Whatever it was, the caller is told the one true thing,
that the dataset was closed; the original error is chained for debugging.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import ClosedError

F = TypeVar("F", bound=Callable[..., Any])


def closed_meanwhile(ds: Any, exc: BaseException) -> ClosedError | None:
    """The ClosedError to raise instead of ``exc`` if ``ds`` was closed (by ``close()``,
    not by pickling) while the read that raised it ran; else None."""
    if ds._source is None and not ds._closed_by_pickle and not isinstance(exc, ClosedError):
        return ClosedError(f"{ds.path}: dataset was closed during the read")
    return None


def reports_close(method: F) -> F:
    """A read method (or generator method) whose errors, once the dataset was closed
    meanwhile, are that ClosedError."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                yield from method(self, *args, **kwargs)
            except Exception as exc:
                closed = closed_meanwhile(self, exc)
                if closed is None:
                    raise
                raise closed from exc

        return generator  # type: ignore[return-value]

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            closed = closed_meanwhile(self, exc)
            if closed is None:
                raise
            raise closed from exc

    return wrapper  # type: ignore[return-value]
