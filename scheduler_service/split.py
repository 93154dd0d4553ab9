"""Pieces of a stage shared by the calling thread and one helper thread (the second core).

Each piece is one compiled kernel call that releases the GIL. The caller takes pieces
from the front, the helper from the back; a piece the helper has not started by the time
the caller runs out is the caller's. A piece the helper has started is waited for, so on
a busy machine, where the helper may be descheduled for milliseconds halfway through a
piece, the helper costs more than it gives: a scheduler plans each big batch with the
helper or alone as :class:`HelperChoice` measures best.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

HELPER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scheduler-helper")
"""Shared by every scheduler of a process. Its tasks never wait on other tasks, so
sharing it cannot deadlock; a scheduler whose helper task is queued behind another's
just does the work itself."""

FORCE_HELPER: bool | None = None
"""Tests and benchmarks: True uses the helper always, False never; None: ``HelperChoice``."""


class HelperChoice:
    """Whether a scheduler's big batches use the helper thread, decided by what recent
    batches cost each way (time per key occurrence, the median of the last few): two
    threads win on an idle machine and lose on a busy one, where a helper descheduled
    halfway through its piece makes the caller wait. A snapshot of the machine's running
    threads (``/proc/loadavg``) was too noisy to decide on our 2-core VM: it caught a
    momentary second thread in about half the checks of an otherwise idle machine. Every
    ``probe_every``-th batch tries the other way, so the choice follows the load as it
    changes. A scheduler's first big batch (new keys, fresh pages) is not counted."""

    def __init__(self, probe_every: int = 8, window: int = 5) -> None:
        self.probe_every = probe_every
        self._costs: dict[bool, deque[float]] = {True: deque(maxlen=window),
                                                 False: deque(maxlen=window)}  # fmt: skip
        self._batches = 0

    def choose(self) -> bool:
        """The way the next big batch should go (True: with the helper)."""
        if FORCE_HELPER is not None:
            return FORCE_HELPER
        self._batches += 1
        with_helper, alone = self._costs[True], self._costs[False]
        if len(with_helper) < 2 or len(alone) < 2:  # try each way twice, the helper first
            return len(with_helper) <= len(alone)
        best = statistics.median(with_helper) <= statistics.median(alone)
        return best != (self._batches % self.probe_every == 0)

    def record(self, parallel: bool, seconds: float, keys: int) -> None:
        """A big batch of ``keys`` key occurrences took ``seconds`` (planned ``parallel``)."""
        if self._batches > 1 or FORCE_HELPER is not None:
            self._costs[parallel].append(seconds / max(keys, 1))


def run_pieces(pieces: Sequence[Callable[[], T]]) -> list[T]:
    """Results of ``pieces`` (in order), run by this thread and the helper."""
    count = len(pieces)
    if count == 1:
        return [pieces[0]()]
    results: list[T | None] = [None] * count
    errors: list[BaseException] = []
    done = [threading.Event() for _ in range(count)]
    lock = threading.Lock()
    bounds = [0, count - 1]  # next piece from the front, from the back

    def take(front: bool) -> int | None:
        with lock:
            if bounds[0] > bounds[1]:
                return None
            if front:
                bounds[0] += 1
                return bounds[0] - 1
            bounds[1] -= 1
            return bounds[1] + 1

    def helper() -> None:
        while (i := take(front=False)) is not None:
            try:
                results[i] = pieces[i]()
            except BaseException as err:  # re-raised on the calling thread
                errors.append(err)
            finally:
                done[i].set()

    HELPER.submit(helper)
    mine: list[int] = []
    try:
        while (i := take(front=True)) is not None:
            mine.append(i)
            results[i] = pieces[i]()
    except BaseException:
        with lock:  # the helper starts nothing more; wait for what it has started
            unclaimed = set(range(bounds[0], bounds[1] + 1))
            bounds[0] = bounds[1] + 1
        for i in set(range(count)) - set(mine) - unclaimed:
            done[i].wait()
        raise
    for i in set(range(count)) - set(mine):
        done[i].wait()
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]


class Relay:
    """Tasks ``0..count-1`` of one kind, run strictly in order (task c after task c - 1),
    each by the first thread that claims it. :meth:`offer` hands task c to the helper once
    the caller has made it ready; :meth:`run_upto` makes the caller run every task up to
    c the helper has not started, and wait for those it has. A descheduled or busy helper
    thus delays the caller by at most the task it holds."""

    def __init__(self, count: int, run: Callable[[int], None]) -> None:
        self._run = run
        self._lock = threading.Lock()
        self._claimed = [False] * count
        self._done = [threading.Event() for _ in range(count)]
        self._errors: list[BaseException] = []

    def _claim(self, c: int) -> bool:
        with self._lock:
            mine, self._claimed[c] = not self._claimed[c], True
        return mine

    def _task(self, c: int) -> None:
        try:
            if c and not self._done[c - 1].wait(timeout=600):
                raise TimeoutError(f"task {c - 1} never finished")
            if not self._errors:
                self._run(c)
        except BaseException as err:  # re-raised on the calling thread
            self._errors.append(err)
        finally:
            self._done[c].set()

    def offer(self, c: int) -> None:
        """Task c may run now: the helper takes it unless the caller already has."""
        HELPER.submit(lambda: self._task(c) if self._claim(c) else None)

    def run_upto(self, c: int) -> None:
        """Tasks 0..c done, run here where the helper has not started them."""
        for i in range(c + 1):
            if self._claim(i):
                self._task(i)
            else:
                self._done[i].wait()
        if self._errors:
            raise self._errors[0]
