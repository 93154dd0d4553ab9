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


def test_a_batch_uses_the_helper_only_when_a_core_is_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``helper_idle`` reads the running threads against the cores; tests and benchmarks
    may force it either way."""
    from heraldps import cores
    from scheduler_service import split

    assert 0 <= cores.idle_cores() <= cores.CORES
    monkeypatch.setattr(cores, "CORES", 1)  # this thread alone fills one core
    assert cores.idle_cores() == 0 and not split.helper_idle()
    monkeypatch.setattr(split, "FORCE_HELPER", True)
    assert split.helper_idle()
    monkeypatch.setattr(split, "FORCE_HELPER", False)
    monkeypatch.setattr(cores, "CORES", 64)
    assert not split.helper_idle()


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
