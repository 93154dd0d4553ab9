"""Stage pieces shared by the caller and the helper thread (scheduler_service/split.py)."""

from __future__ import annotations

import threading

import pytest

from scheduler_service.split import HELPER, run_pieces


def test_results_come_back_in_piece_order() -> None:
    assert run_pieces([lambda i=i: i * i for i in range(7)]) == [i * i for i in range(7)]
    assert run_pieces([lambda: "one"]) == ["one"]


def test_the_caller_runs_every_piece_when_the_helper_is_busy() -> None:
    """A helper that gets no chance to start (here: busy with another task) never makes
    the caller wait: it runs all the pieces itself."""
    release = threading.Event()
    blocker = HELPER.submit(release.wait, 10)
    try:
        me = threading.get_ident()
        threads = run_pieces([threading.get_ident for _ in range(4)])
        assert threads == [me] * 4
    finally:
        release.set()
        blocker.result()


def test_both_threads_take_pieces_when_both_can_run() -> None:
    """The helper takes pieces from the back while the caller works through the front."""
    started = threading.Event()

    def slow_first() -> int:
        assert started.wait(10), "the helper never took a piece"
        return threading.get_ident()

    def last() -> int:
        started.set()
        return threading.get_ident()

    first_thread, last_thread = run_pieces([slow_first, last])
    assert first_thread == threading.get_ident() != last_thread


def test_an_error_in_a_piece_reaches_the_caller() -> None:
    def fail() -> int:
        raise ValueError("piece 2 failed")

    with pytest.raises(ValueError, match="piece 2 failed"):
        run_pieces([lambda: 1, lambda: 2, fail, lambda: 4])
    # The helper is still usable afterwards.
    assert run_pieces([lambda: 5, lambda: 6]) == [5, 6]


def test_big_batches_take_the_helper_or_not_by_what_each_way_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a first batch that does not count, each way is tried twice (the helper
    first), then the way with the lower median cost per key occurrence wins, and every
    ``probe_every``-th batch tries the other way; tests may force it."""
    from scheduler_service import split

    monkeypatch.setattr(split, "FORCE_HELPER", None)
    choice = split.HelperChoice(probe_every=4)
    choice.record(choice.choose(), 9.0, 1000)  # the first batch: not counted
    ways = []
    for cost in (0.030, 0.020, 0.031, 0.021):
        ways.append(choice.choose())
        choice.record(ways[-1], cost, 1000)
    assert ways == [True, False, True, False]
    ways = [choice.choose() for _ in range(8)]  # alone is cheaper: the helper only probed
    assert ways.count(False) == 6 and ways.count(True) == 2
    for _ in range(5):  # the machine gets busy: alone costs more now
        choice.record(False, 0.060, 1000)
    assert [choice.choose() for _ in range(4)].count(True) == 3
    monkeypatch.setattr(split, "FORCE_HELPER", False)
    assert choice.choose() is False


def test_a_relay_runs_its_tasks_in_order_on_either_thread() -> None:
    """Offered tasks go to the helper; the caller runs what the helper has not started;
    task c never starts before task c - 1 has finished; an error reaches the caller."""
    from scheduler_service.split import Relay

    order: list[int] = []
    threads: set[int] = set()

    def task(c: int) -> None:
        order.append(c)
        threads.add(threading.get_ident())

    relay = Relay(6, task)
    for c in range(0, 6, 2):
        relay.offer(c)  # tasks 1, 3, 5 are never offered: the caller runs them
    relay.run_upto(5)
    assert order == list(range(6))
    assert threading.get_ident() in threads

    def failing(c: int) -> None:
        if c == 1:
            raise ValueError("task 1 failed")

    broken = Relay(3, failing)
    with pytest.raises(ValueError, match="task 1 failed"):
        broken.run_upto(2)
