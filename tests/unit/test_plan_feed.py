"""The worker's plan feed: plans in order, read ahead on a thread in the pipelined mode."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from heraldps.plan import CommPlan, plan_to_proto
from heraldps.v1 import scheduler_pb2
from worker_client.pipeline import PlanFeed


def message(iteration: int) -> scheduler_pb2.CommPlan:
    return plan_to_proto(CommPlan(iteration, 0), "emb")


def wait_until(condition: object, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_read_ahead_shows_the_next_plan_once_it_arrived() -> None:
    second = threading.Event()

    def stream() -> Iterator[scheduler_pb2.CommPlan]:
        yield message(0)
        second.wait(10)
        yield message(1)

    feed = PlanFeed(stream(), read_ahead=True)
    plans = iter(feed)
    assert next(plans).plan.iteration == 0
    assert feed.upcoming() is None  # plan 1 has not arrived
    second.set()
    wait_until(lambda: feed.upcoming() is not None)
    upcoming = feed.upcoming()
    assert upcoming is not None and upcoming.iteration == 1
    assert next(plans).plan is upcoming  # the same decoded plan
    assert feed.upcoming() is None
    assert list(plans) == []


def test_a_broken_stream_fails_after_the_plans_before_it() -> None:
    def stream() -> Iterator[scheduler_pb2.CommPlan]:
        yield message(0)
        yield message(1)
        raise RuntimeError("stream broke")

    plans = iter(PlanFeed(stream(), read_ahead=True))
    assert [next(plans).plan.iteration for _ in range(2)] == [0, 1]
    with pytest.raises(RuntimeError, match="stream broke"):
        next(plans)


def test_without_read_ahead_plans_are_read_when_asked_for() -> None:
    read: list[int] = []

    def stream() -> Iterator[scheduler_pb2.CommPlan]:
        for t in range(3):
            read.append(t)
            yield message(t)

    feed = PlanFeed(stream())
    plans = iter(feed)
    assert next(plans).plan.iteration == 0 and read == [0]
    assert feed.upcoming() is None
    received = next(plans)
    assert received.plan.iteration == 1 and read == [0, 1] and received.sample_bytes == 0
