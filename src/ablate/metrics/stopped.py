"""A rank that was stopped (SIGSTOP, SIGTSTP: a debugger, job control, the OS) learns it only when it is continued:
SIGCONT's handler records when (wall clock), so a stall names the rank that was stopped (steady.held_up_by), not
only the one that came late to a collective, which a rank stopped inside a collective it had entered is not.
Installed in the rank's main thread for the run (a handler of SIGCONT changes nothing else: the process
continues as it would)."""
from __future__ import annotations

import signal
import threading
import time
from typing import List


class Continued:
    def __init__(self):
        self.at: List[float] = []
        self._previous = None

    def install(self) -> "Continued":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGCONT, self._record)
        return self

    def _record(self, signum, frame) -> None:
        self.at.append(time.time())
        if callable(self._previous):
            self._previous(signum, frame)

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGCONT, self._previous)
            self._previous = None
