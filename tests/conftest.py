"""Test-session setup.

A shell starts a background job (``cmd &``, nohup) with SIGINT ignored, and a Python
started so keeps it ignored: no KeyboardInterrupt, ``_thread.interrupt_main()`` does
nothing, and the children the tests start inherit the disposition. The signal tests would
then fail for the way the suite was started, not for the library (seen in a CI run started
in the background). The suite restores Python's own SIGINT handler first.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def scratch(tmp_path):
    """A folder in memory when there is one, for sweeps that rewrite files thousands of
    times: fsync there is still a real call (the interrupt sweeps count it) but costs
    nothing, where on a disk each one waits for it (no power is cut in these tests)."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="evs-test-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)
