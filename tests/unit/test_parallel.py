"""Big requests' loops split over the cores (``ps_server.parallel``), and the Staged
table's pull, lookup and commit on batches big enough to be split."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from heraldps.optim import AdaGrad
from heraldps.spec import TableSpec
from ps_server import parallel
from ps_server.parallel import CHUNKS_PER_THREAD, MIN_CHUNK, in_parts
from ps_server.pull_response import PullResponseBuffer
from ps_server.row_index import RowIndex
from ps_server.store import StagedStore


def test_parts_cover_every_position_once() -> None:
    for n, threads in ((0, 4), (5, 4), (MIN_CHUNK * 2 - 1, 4), (MIN_CHUNK * 2, 2), (100_003, 4)):
        seen = np.zeros(n, dtype=np.int64)
        calls: list[tuple[int, int]] = []  # list.append is atomic

        def work(lo: int, hi: int, seen: np.ndarray = seen, calls: list = calls) -> None:
            seen[lo:hi] += 1
            calls.append((lo, hi))

        in_parts(n, work, threads)
        assert (seen == 1).all()
        used = min(threads, n // MIN_CHUNK)
        expected = min(used * CHUNKS_PER_THREAD, n // MIN_CHUNK) if used > 1 else 1
        assert len(calls) == expected
        assert all(hi - lo >= MIN_CHUNK for lo, hi in calls) or expected == 1


def test_parts_run_on_other_threads_at_once() -> None:
    if parallel.THREADS < 2:
        pytest.skip("one core: nothing runs beside the caller")
    both = threading.Barrier(2, timeout=10)
    threads: set[int] = set()

    def work(lo: int, hi: int) -> None:
        threads.add(threading.get_ident())
        both.wait()  # each part waits for the other: only parts running at once pass

    in_parts(2 * MIN_CHUNK, work, 2)
    assert len(threads) == 2 and threading.get_ident() in threads


def test_the_caller_does_every_chunk_while_the_helpers_are_busy() -> None:
    if parallel.THREADS < 2:
        pytest.skip("one core: there are no helpers")
    release = threading.Event()
    helpers = parallel._helpers()
    busy = [helpers.submit(release.wait, 10) for _ in range(parallel.THREADS - 1)]
    ran: list[int] = []
    try:
        in_parts(8 * MIN_CHUNK, lambda lo, hi: ran.append(threading.get_ident()), 2)
    finally:
        release.set()
    assert ran == [threading.get_ident()] * (2 * CHUNKS_PER_THREAD)
    assert all(future.result() for future in busy)


def test_an_error_is_raised_after_every_part_is_done() -> None:
    if parallel.THREADS < 2:
        pytest.skip("one core: nothing runs beside the caller")
    started, finished = threading.Event(), threading.Event()

    def work(lo: int, hi: int) -> None:
        if lo == 0:
            assert started.wait(10)  # the other part is running, so it cannot be taken back
            raise ValueError("first part failed")
        started.set()
        threading.Event().wait(0.2)
        finished.set()

    with pytest.raises(ValueError, match="first part failed"):
        in_parts(2 * MIN_CHUNK, work, 2)
    assert finished.is_set()


def test_helpers_are_asked_for_only_while_cores_are_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    assert 0 <= parallel.idle_cores() < parallel.CORES  # this thread is running
    if parallel.THREADS < 2:
        pytest.skip("one core: there are no helpers")
    caller = threading.get_ident()
    seen: set[int] = set()
    monkeypatch.setattr(parallel, "idle_cores", lambda: 0)  # every core busy: no helper
    in_parts(16 * MIN_CHUNK, lambda lo, hi: seen.add(threading.get_ident()))
    assert seen == {caller}
    monkeypatch.setattr(parallel, "idle_cores", lambda: 1)
    both = threading.Barrier(2, timeout=10)

    def work(lo: int, hi: int) -> None:
        if threading.get_ident() not in seen:  # each thread's first chunk waits for the other
            seen.add(threading.get_ident())
            both.wait()

    seen.clear()
    in_parts(16 * MIN_CHUNK, work)
    assert len(seen) == 2 and caller in seen


def test_big_lookup_pull_and_commit_equal_their_one_thread_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of 4 x MIN_CHUNK keys, split and not: the same rows, answers and state."""
    monkeypatch.setattr(parallel, "idle_cores", lambda: parallel.CORES)  # split, whatever the load
    rng = np.random.default_rng(5)
    present = rng.integers(-(2**62), 2**62, 6 * MIN_CHUNK)
    keys = np.concatenate([rng.choice(present, 3 * MIN_CHUNK), rng.integers(0, 2**40, MIN_CHUNK)])
    grads = rng.standard_normal((keys.shape[0], 8)).astype(np.float32)

    def run() -> tuple[np.ndarray, ...]:
        index = RowIndex()
        index.insert(present)
        store = StagedStore()
        table, _ = store.create_table(TableSpec("emb", 8, optimizer=AdaGrad(lr=0.1)))
        table.pull(present, with_state=False)
        buffer = PullResponseBuffer(keys.shape[0], 8, table.state_width)
        table.pull_into(keys, buffer.values, buffer.versions, buffer.state)
        store.push("emb", 0, keys, grads)
        store.commit(0)
        after = table.pull(keys, with_state=True)
        return (index.lookup(keys), buffer.message, after.values, after.state, after.versions)

    split = run()
    monkeypatch.setattr(parallel, "THREADS", 1)
    whole = run()
    for a, b in zip(split, whole, strict=True):
        assert (a == b) if isinstance(a, bytes) else np.array_equal(a, b)
    assert (split[4] > 0).sum() >= 3 * MIN_CHUNK  # the commit reached the pulled rows


def test_kernel_threads_flag_sets_the_threads_and_refuses_negative() -> None:
    from ps_server.server import PSConfig

    with pytest.raises(ValueError, match="--kernel-threads must be >= 0"):
        PSConfig(kernel_threads=-1)
    try:
        parallel.configure(1)
        assert parallel.THREADS == 1
        seen: set[int] = set()
        in_parts(8 * MIN_CHUNK, lambda lo, hi: seen.add(threading.get_ident()))
        assert seen == {threading.get_ident()}
        parallel.configure(0)
        assert parallel.default_threads() == parallel.THREADS
    finally:
        parallel.configure(0)
