"""The barrier's liveness rule (``Barrier.overdue``), on the pure core with explicit clocks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from heraldps.errors import Unavailable
from scheduler_service.barrier import Barrier, RunAborted
from scheduler_service.batch import Batch
from scheduler_service.scheduler import make_scheduler

WORKERS = 3


def batch(t: int) -> Batch:
    offsets = np.arange(0, 2 * WORKERS * 2 + 1, 2)
    return Batch.from_arrays(t, offsets, np.arange(offsets[-1]) % 7, WORKERS)


def started(commit: Callable[[int], None] | None = None) -> Barrier:
    """Every worker registered; iteration 0's plans released (its clock runs)."""
    barrier = Barrier(make_scheduler(WORKERS, 20, "herald"), commit or (lambda t: None))
    for w in range(WORKERS):
        barrier.register(w)
    barrier.submit(batch(0))
    barrier.submit(batch(1))
    return barrier


def test_no_clock_before_plans_and_none_for_unregistered_workers() -> None:
    barrier = Barrier(make_scheduler(WORKERS, 20, "herald"), lambda t: None)
    barrier.register(0)
    barrier.submit(batch(0))  # planned, not released: waiting for batches is nobody's fault
    assert barrier.overdue(1.0, time.monotonic() + 100) is None
    barrier.submit(batch(1))
    failure = barrier.overdue(1.0, time.monotonic() + 100)
    assert failure is not None  # worker 0 registered and is silent; 1 and 2 never started
    assert "worker 0 has not reported iteration 0 within 1 s" in failure.message


def test_a_worker_that_spoke_later_gets_the_timeout_from_then() -> None:
    barrier = started()
    t0 = time.monotonic()
    assert barrier.overdue(5.0, t0 + 4) is None
    time.sleep(0.5)
    barrier.next_plan(1, None, timeout=1)  # worker 1 picks up its plan: it spoke now
    spoke = time.monotonic()
    barrier.report_done(0, 0)
    failure = barrier.overdue(5.0, spoke + 4.8)
    assert failure is not None and "worker 2 has not reported" in failure.message
    failure = barrier.overdue(5.0, spoke + 5.1)
    assert failure is not None and "workers 1, 2 have not reported" in failure.message


def test_plans_ahead_of_the_iteration_in_progress_are_not_a_sign_of_life() -> None:
    """herald_pipelined with --prefetch-plans 2: a worker's stream receives plans 1 and 2
    while iteration 0 runs, whatever its training does; only the plan of the iteration in
    progress counts as the worker speaking."""
    scheduler = make_scheduler(WORKERS, 20, "herald_pipelined", prefetch_plans=2)
    barrier = Barrier(scheduler, lambda t: None)
    for w in range(WORKERS):
        barrier.register(w)
    for t in range(4):
        barrier.submit(batch(t))  # releases plans 0, 1 and 2
    t0 = time.monotonic()
    assert barrier.next_plan(0, 0, timeout=1) is not None  # the plan of iteration 0
    time.sleep(0.3)
    for ahead in (1, 2):
        plan = barrier.next_plan(0, ahead, timeout=1)
        assert plan is not None and plan.iteration == ahead  # flows before 0's commit
    failure = barrier.overdue(1.0, t0 + 1.2)
    assert failure is not None and "workers 0, 1, 2 have not reported" in failure.message


def test_a_stuck_commit_is_overdue_and_a_failed_one_aborts_every_later_call() -> None:
    release, entered = threading.Event(), threading.Event()

    def commit(t: int) -> None:
        entered.set()
        release.wait(10)
        raise Unavailable("shard gone", address="127.0.0.1:1")

    barrier = started(commit)
    barrier.report_done(0, 0)
    barrier.report_done(1, 0)
    raised: list[BaseException] = []

    def last() -> None:
        try:
            barrier.report_done(2, 0)
        except RunAborted as exc:
            raised.append(exc)

    reporter = threading.Thread(target=last)
    reporter.start()
    assert entered.wait(10)
    failure = barrier.overdue(2.0, time.monotonic() + 3)
    assert failure is not None and "its commit on the PS has not finished" in failure.message
    release.set()
    reporter.join(10)
    reason = "committing iteration 0 on the PS failed (127.0.0.1:1): UNAVAILABLE shard gone"
    assert raised and reason in str(raised[0])
    for call in (lambda: barrier.report_done(2, 0), lambda: barrier.next_plan(0, None, 1),
                 lambda: barrier.submit(batch(2)), barrier.check_running):  # fmt: skip
        with pytest.raises(RunAborted, match="committing iteration 0 on the PS failed"):
            call()
    assert barrier.overdue(2.0, time.monotonic() + 100) is None  # aborted once, not again


def test_a_slow_checkpoint_after_the_commit_is_not_a_frozen_shard() -> None:
    """The commit callback commits on the PS, then (at a checkpoint) snapshots; only the
    commit is judged by the timeout: a snapshot slower than it aborts nothing."""
    holder: list[Barrier] = []
    release, snapshotting = threading.Event(), threading.Event()

    def commit_then_snapshot(t: int) -> None:
        holder[0].committed_on_ps()  # as SchedulerServer._commit does after ps.commit
        snapshotting.set()
        release.wait(10)

    barrier = started(commit_then_snapshot)
    holder.append(barrier)
    for w in range(WORKERS - 1):
        barrier.report_done(w, 0)
    last = threading.Thread(target=barrier.report_done, args=(WORKERS - 1, 0))
    last.start()
    assert snapshotting.wait(10)
    assert barrier.overdue(2.0, time.monotonic() + 100) is None
    release.set()
    last.join(10)
    assert barrier.committed == 0 and barrier.failure is None


def test_with_look_ahead_only_the_last_iteration_ends_the_run() -> None:
    """A scheduler looking 3 batches ahead still holds two batches at Finish: their plans
    are released with the last ones, and only the last iteration's carry final_flush (a
    worker flushes and stops after it)."""
    barrier = Barrier(make_scheduler(WORKERS, 20, "herald", look_ahead=3), lambda t: None)
    released = [barrier.submit(batch(t)) for t in range(4)]
    assert [[p.iteration for p in r] for r in released] == [[], [], [], [0] * WORKERS]
    last = barrier.finish()
    assert sorted({p.iteration for p in last}) == [1, 2, 3]
    assert {(p.iteration, p.final_flush) for p in last} == {(1, False), (2, False), (3, True)}
