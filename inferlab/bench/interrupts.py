"""Ctrl-C during `inferlab bench`: once the load is on, the first press stops the stage in
hand and the run's results are still written; later presses only say so.

Why a flag and not KeyboardInterrupt: an exception can land anywhere, and a second press that
landed inside a pipe read (a worker's report half received) left the pipe out of step, so the
run hung on a read of garbage length, died with a traceback, or exited without writing anything.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupts:
    """SIGINT's handler for one run: before `armed` (setting up) a press ends the program as
    usual; once armed it sets `requested`, which the stage runner polls."""

    def __init__(self) -> None:
        self.armed = False
        self.requested = False
        self.presses = 0

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        """The handler in place for the block (the main thread's: signals go there), unless
        SIGINT was ignored when the program started (a background job's): it stays ignored."""
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._on_press)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def _on_press(self, _signum: int, _frame: object) -> None:
        if not self.armed:
            raise KeyboardInterrupt
        self.presses += 1
        self.requested = True
        if self.presses == 2:
            print("inferlab bench: stopping already; the results are written once the workers "
                  "hand theirs back", file=sys.stderr)
