"""The worker's plan feed: plans in order, read ahead on a thread in the pipelined mode."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from heraldps.errors import FailedPrecondition
from heraldps.plan import CommPlan, plan_to_proto
from heraldps.v1 import scheduler_pb2
from worker_client.pipeline import PlanFeed


def message(iteration: int) -> scheduler_pb2.CommPlan:
    return plan_to_proto(CommPlan(iteration, 0), "emb")


def test_plans_that_arrive_while_the_worker_is_busy_are_passed_ahead() -> None:
    """Plan 1 arrives while the worker runs plan 0: handed to ``ahead`` before the worker
    asks for it. Plans 0 and 2 arrive while the worker waits for them: not handed ahead."""
    second, third, handed = threading.Event(), threading.Event(), threading.Event()
    ahead: list[int] = []

    def stream() -> Iterator[scheduler_pb2.CommPlan]:
        yield message(0)
        second.wait(10)
        yield message(1)
        third.wait(10)
        yield message(2)

    def take_ahead(plan: CommPlan) -> None:
        ahead.append(plan.iteration)
        handed.set()

    feed = iter(PlanFeed(stream(), take_ahead))
    assert next(feed).plan.iteration == 0
    second.set()  # the worker is busy with plan 0 while plan 1 arrives
    assert handed.wait(10)
    assert next(feed).plan.iteration == 1
    threading.Timer(0.3, third.set).start()  # plan 2 arrives while the worker waits for it
    assert next(feed).plan.iteration == 2
    assert list(feed) == []
    assert ahead == [1]


def test_errors_reach_the_worker_after_the_plans_before_them() -> None:
    """A broken stream, or a plan ``ahead`` refuses: raised in stream order, in the worker."""
    go_on = threading.Event()

    def stream(broken: bool) -> Iterator[scheduler_pb2.CommPlan]:
        yield message(0)
        go_on.wait(10)
        yield message(1)
        if broken:
            raise RuntimeError("stream broke")

    def refuse(plan: CommPlan) -> None:
        raise FailedPrecondition(f"plan {plan.iteration} is wrong")

    feed = iter(PlanFeed(stream(broken=True), lambda plan: None))
    go_on.set()
    assert [next(feed).plan.iteration for _ in range(2)] == [0, 1]
    with pytest.raises(RuntimeError, match="stream broke"):
        next(feed)
    go_on.clear()
    feed = iter(PlanFeed(stream(broken=False), refuse))
    assert next(feed).plan.iteration == 0  # the worker waited for it: not handed ahead
    go_on.set()
    time.sleep(0.5)  # the worker is busy with plan 0 when plan 1 arrives
    with pytest.raises(FailedPrecondition, match="plan 1 is wrong"):
        next(feed)


def test_without_ahead_plans_are_read_when_asked_for() -> None:
    read: list[int] = []

    def stream() -> Iterator[scheduler_pb2.CommPlan]:
        for t in range(3):
            read.append(t)
            yield message(t)

    feed = iter(PlanFeed(stream()))
    assert next(feed).plan.iteration == 0 and read == [0]
    received = next(feed)
    assert received.plan.iteration == 1 and read == [0, 1] and received.sample_bytes == 0
