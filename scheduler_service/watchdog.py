"""The scheduler's liveness check: a silent worker (or a stuck commit) aborts the run.

A worker that is frozen (SIGSTOP, a debugger, a swapped-out VM), hung, or cut off
never reports its iteration, and without this check every other worker would
wait for it forever. The watchdog asks the barrier every fraction of the timeout
which workers are overdue (:meth:`Barrier.overdue`) and, if any are, aborts the
run: the watchers, reporters and status queries answer ABORTED with the message
naming them, so the workers and the launcher end with that reason.
"""

from __future__ import annotations

import logging
import threading

from scheduler_service.barrier import Barrier

log = logging.getLogger(__name__)


class Watchdog:
    """A thread checking ``barrier`` for workers silent longer than ``timeout`` seconds."""

    def __init__(self, barrier: Barrier, timeout: float) -> None:
        self.barrier = barrier
        self.timeout = timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        interval = min(1.0, self.timeout / 4)
        while not self._stop.wait(interval):
            failure = self.barrier.overdue(self.timeout)
            if failure is not None:
                log.error("%s", failure)
                self.barrier.fail(failure)
                return
