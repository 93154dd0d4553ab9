"""A big request's compiled loops, shared out over the machine's cores.

A pull or a commit of 65,536 keys spends most of its time waiting on memory:
random reads of index slots and row records, a few hundred MiB to GBs apart.
One core keeps only so many of those reads in flight, and while a shard
gathers a pull's answer, the client that asked for it is idle, waiting. So a
loop over many keys (lookup, gather, scatter) is cut into chunks that the
calling thread and helper threads take one at a time until none is left
(docs/figures.md, "The PS at 50M rows").

Helpers only help where a core is idle. On a machine whose cores are all busy,
a helper that gets a chunk may be descheduled halfway through it, and the
caller must wait for that chunk (the arrays may change once the request ends):
on our shared 2-core VM at a load of 6-8, a split lookup of 65,536 keys took
5.7 ms against 1.4 ms on the caller's thread alone. So a request counts the
threads the kernel has running right now (``/proc/loadavg``, about 10 us) and
asks for at most one helper per idle core. Chunks, not one part per thread, for
the same reason: a helper that starts late or stalls delays the request by at
most the one chunk it holds, and one that has not started by the time the
chunks run out is not waited for.

Only for compiled loops that release the GIL (``nogil=True``) and whose chunks
write disjoint outputs; the caller holds whatever lock guards the arrays for
the whole call, and nothing may move them (a grow) while chunks run.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from heraldps.cores import CORES, idle_cores

MIN_CHUNK = 4096  # keys: handing out a chunk costs a few microseconds of Python
CHUNKS_PER_THREAD = 4
MAX_THREADS = 4


def default_threads() -> int:
    """One thread per core, at most ``MAX_THREADS``."""
    return max(1, min(CORES, MAX_THREADS))


THREADS = default_threads()  # the caller and THREADS - 1 helpers

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def configure(threads: int) -> None:
    """Threads a request's loops use from now on (``--kernel-threads``; 0: one per core,
    at most ``MAX_THREADS``; 1: the handler's thread only)."""
    global THREADS, _pool
    if threads < 0:
        raise ValueError(f"--kernel-threads must be >= 0, got {threads}")
    with _pool_lock:
        wanted = threads or default_threads()
        if wanted != THREADS and _pool is not None:  # sized for the old count
            _pool.shutdown(wait=False)  # chunks already handed to it still run
            _pool = None
        THREADS = wanted


def _helpers() -> ThreadPoolExecutor:
    """The helper threads, started on first use (a forked child starts its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS - 1, thread_name_prefix="ps-kernel")
            os.register_at_fork(after_in_child=_forget_pool)
        return _pool


def _forget_pool() -> None:
    global _pool
    _pool = None


class _Chunks:
    """``work`` over ``0..n`` in ``count`` chunks, taken one at a time by whoever asks."""

    def __init__(self, n: int, count: int, work: Callable[[int, int], object]) -> None:
        self.bounds = [n * i // count for i in range(count + 1)]
        self.work = work
        self._next = itertools.count()  # next() is atomic under the GIL
        self.error: BaseException | None = None

    def take_all(self) -> None:
        """Run chunks until none is left (or one has failed)."""
        while self.error is None:
            i = next(self._next)
            if i >= len(self.bounds) - 1:
                return
            try:
                self.work(self.bounds[i], self.bounds[i + 1])
            except BaseException as exc:
                self.error = self.error or exc


def in_parts(n: int, work: Callable[[int, int], object], threads: int | None = None) -> None:
    """``work(lo, hi)`` over every range of a cut of ``0..n``, run by the caller and up
    to ``threads - 1`` helpers at once (default: one thread per core, at most
    ``MAX_THREADS``, and one helper per idle core at most); returns when every range is
    done, raising the first error."""
    if threads is None:
        threads = min(THREADS, 1 + idle_cores()) if THREADS > 1 and n >= 2 * MIN_CHUNK else 1
    threads = min(threads, n // MIN_CHUNK)
    if threads <= 1:
        work(0, n)
        return
    chunks = _Chunks(n, min(threads * CHUNKS_PER_THREAD, n // MIN_CHUNK), work)
    helping: list[Future[None]] = []
    try:
        pool = _helpers()
        helping += [pool.submit(chunks.take_all) for _ in range(threads - 1)]
    except RuntimeError:  # the pool was just replaced (configure): the caller does the rest
        pass
    chunks.take_all()
    for helper in helping:
        if not helper.cancel():  # not started yet: there is nothing left for it
            helper.result()  # running: it finishes the chunk it holds
    if chunks.error is not None:
        raise chunks.error
