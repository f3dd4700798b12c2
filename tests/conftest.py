"""Test-session setup.

A shell starts a background job (``cmd &``, nohup) with SIGINT ignored, and a Python
started so keeps it ignored: no KeyboardInterrupt, ``_thread.interrupt_main()`` does
nothing, and the children the tests start inherit the disposition. The signal tests would
then fail for the way the suite was started, not for the library (seen in a CI run started
in the background). The suite restores Python's own SIGINT handler first.
"""

from __future__ import annotations

import signal

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
