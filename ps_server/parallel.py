"""A big request's compiled loops, split over the machine's cores.

A pull or a commit of 65,536 keys spends most of its time waiting on memory:
random reads of index slots and row records, a few hundred MiB to GBs apart.
One core keeps only so many of those reads in flight, and while a shard
gathers a pull's answer, the client that asked for it is idle, waiting. So a
loop over many keys (lookup, gather, scatter) is cut into one part per core,
run at once: the calling thread runs one part, helper threads the others
(docs/figures.md, "The PS at 50M rows").

Only for compiled loops that release the GIL (``nogil=True``) and whose parts
write disjoint outputs; the caller holds whatever lock guards the arrays for
the whole call, and nothing may move them (a grow) while parts run. A part
still waiting for a helper when the caller is done with its own is taken back
and run by the caller, so busy helpers never make a request wait for others.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

MIN_PART = 8192  # keys: a smaller part costs more to hand over (~50 us) than it saves
MAX_PARTS = 4


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


PARTS = max(1, min(_cores(), MAX_PARTS))

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    """The helper threads, started on first use (a forked child starts its own)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(PARTS - 1, thread_name_prefix="ps-kernel")
            os.register_at_fork(after_in_child=_forget_pool)
        return _pool


def _forget_pool() -> None:
    global _pool
    _pool = None


def in_parts(n: int, work: Callable[[int, int], object], parts: int | None = None) -> None:
    """``work(lo, hi)`` over ``0..n`` cut into up to ``parts`` (default: one per core,
    at most ``MAX_PARTS``) parts of at least ``MIN_PART``, run at once; returns when
    every part is done, raising the first error."""
    count = min(PARTS if parts is None else parts, n // MIN_PART)
    if count <= 1:
        work(0, n)
        return
    bounds = [n * i // count for i in range(count + 1)]
    pool = _helpers()
    started: list[Future[object]] = [
        pool.submit(work, bounds[i], bounds[i + 1]) for i in range(1, count)
    ]
    error: BaseException | None = None
    try:
        work(bounds[0], bounds[1])
    except BaseException as exc:  # wait for the others first: they use the same arrays
        error = exc
    for i, future in enumerate(started, start=1):
        if future.cancel():  # still queued behind other requests' parts
            if error is None:
                try:
                    work(bounds[i], bounds[i + 1])  # run it here instead of waiting
                except BaseException as exc:
                    error = exc
            continue
        failed = future.exception()  # waits for the part, even after an error
        error = error or failed
    if error is not None:
        raise error
