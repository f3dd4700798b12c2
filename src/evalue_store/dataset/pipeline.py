"""Write-behind for columnar writes: batches of frames go to the sink on a second thread,
in order, while the caller encodes the next batch into another buffer.

numpy's copies and ``pwrite(2)`` release the GIL, so on two cores the encoding of batch
k+1 overlaps the kernel's copy of batch k into the page cache (and, for a durable writer,
the start of its writeback: ``physical.plain``). The buffers go round: a buffer is handed
out again only once its write has returned, so at most ``len(buffers)`` batches are in
flight and nothing is copied to keep one.

The sink belongs to the thread from the first ``write`` until ``finish`` or ``cancel``
returns; the caller touches it only after that. A failed write stops the thread (later
batches are not written) and its exception is raised in the caller by the next
``buffer`` or by ``finish``.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np


class WriteBehind:
    """Writes ``(frames, count, size, stride)`` batches with ``write_frames(sink, ...)``
    on a thread of its own, in the order given."""

    def __init__(self, sink: Any, buffers: list[np.ndarray], write_frames: Any):
        self._sink = sink
        self._write_frames = write_frames
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for frames in buffers:
            self._free.put(frames)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._stop = False
        self._ended = False  # set by the thread after its last write, before _done is released
        self._done = threading.Lock()
        self._done.acquire()  # released by the thread once it has ended
        self._thread = threading.Thread(target=self._run, name="evalue_store-write", daemon=True)
        self._thread.start()

    def buffer(self) -> np.ndarray:
        """A buffer to encode into, once its last write has returned (the exception of a
        failed write is raised here)."""
        frames = self._free.get()
        if self._error is not None:
            raise self._error
        return frames

    def write(self, frames: np.ndarray, count: int, size: int, stride: int) -> None:
        """Queue the first ``count`` frames of ``frames`` (a buffer from ``buffer``)."""
        self._jobs.put((frames, count, size, stride))

    def finish(self) -> None:
        """Wait for every queued write; raise the exception of one that failed."""
        self._join()
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        """Skip the writes not yet begun and wait for the one under way to return."""
        self._join(stop=True)

    def _join(self, stop: bool = False) -> None:
        """Wait for the thread to end. An interrupt does not cut the wait short (the caller
        may cut the file back next, which must come after the thread's last write): it is
        raised once the thread has ended. Thread.join is not used for this: in Python 3.11
        an interrupt of its wait marks a running thread as stopped, and the next join
        returns at once. A lock released by the thread can be waited for again, and
        ``_ended`` tells whether an acquire that an interrupt followed had returned (then
        the thread only returns: joining it waits for no write)."""
        interrupted: BaseException | None = None
        while not self._ended:
            try:
                self._stop = self._stop or stop
                self._jobs.put(None)  # the end of the jobs (the thread stops at the first)
                self._done.acquire()
            except BaseException as exc:
                interrupted = interrupted or exc
        try:
            self._thread.join()  # it only returns now: gone once the call returns or raises
        except BaseException as exc:
            interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

    def _run(self) -> None:
        try:
            while (job := self._jobs.get()) is not None:
                frames, count, size, stride = job
                if self._error is None and not self._stop:
                    try:
                        view = memoryview(frames[:count].reshape(-1))
                        self._write_frames(self._sink, view, count, size, stride)
                    except BaseException as exc:  # raised in the caller, which undoes the batch
                        self._error = exc
                self._free.put(frames)
        finally:
            self._ended = True  # no write after this
            self._done.release()
