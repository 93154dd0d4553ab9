"""A worker executing plans against real in-process PS shards: mismatches are errors."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from heraldps.bundled import bundled_data
from heraldps.client.core import Pulled
from heraldps.job import EMBEDDING_TABLE, TrainingJob
from heraldps.plan import CommPlan
from scheduler_service.batch import Batch
from scheduler_service.scheduler import Scheduler
from tests.conftest import ClusterFactory
from worker_client.minibatch import global_batches
from worker_client.pipeline import PipelinedPlanStep
from worker_client.plan_step import PlanMismatch, PlanStep
from worker_client.step import MissingSamples
from worker_client.worker import make_step

TRAIN, _ = bundled_data()


def one_worker(
    cluster: ClusterFactory, mode: str = "herald", look_ahead: int = 1, prefetch_plans: int = 1
) -> tuple[PlanStep, list[CommPlan], TrainingJob]:
    """A plan step and the plans of 3 iterations, each carrying its samples."""
    job = TrainingJob(data=str(TRAIN), workers=1, batch_size_per_worker=16, iterations=3,
                      embedding_dim=4, hidden=(8,), cache_rows=2000)  # fmt: skip
    dataset = job.read()
    _, ps = cluster(2)
    step = make_step(mode, job, 0, ps, job.cache_rows)
    assert isinstance(step, PlanStep)
    job.create_tables(ps)
    scheduler = Scheduler(1, job.cache_rows, mode, look_ahead=look_ahead,
                          prefetch_plans=prefetch_plans)  # fmt: skip
    batches = global_batches(dataset, job.global_batch, job.iterations)
    plans: list[CommPlan] = []
    for t, batch in enumerate(batches):
        plans += scheduler.submit(Batch.of_samples(t, batch, 1))
    plans += scheduler.finish()
    for plan in plans:
        plan.mini_batch = batches[plan.iteration].take(plan.samples)
    return step, plans, job


def test_plans_run_and_mismatches_are_refused(cluster: ClusterFactory) -> None:
    step, plans, _ = one_worker(cluster)
    traffic, loss = step.run(plans[0])
    assert traffic.pulls == plans[0].pull.shape[0] > 0 and np.isfinite(loss)
    held = plans[0].pull[:3]
    none = np.empty(0, np.int64)
    # Pulling rows the worker holds dirty is refused (their updates would be lost).
    with pytest.raises(PlanMismatch, match=r"holds dirty"):
        step.run(replace(plans[1], pull=held, write_back=none))  # (no early write-backs)
    # Evicting a row the worker never held is refused.
    with pytest.raises(PlanMismatch, match="does not hold"):
        step.run(replace(plans[1], evict=np.array([12345], np.int64)))
    # Writing back a row that will not be dirty is refused before anything is sent.
    assert plans[1].mini_batch is not None
    with pytest.raises(PlanMismatch, match="will not hold dirty"):
        step.run(
            replace(plans[1], pull=none, samples=none, update_local=none, push_grads=none,
                    write_back=np.array([777], np.int64),
                    mini_batch=plans[1].mini_batch.take(none)),
        )  # fmt: skip


def test_pulling_a_row_held_at_the_latest_version_is_refused(cluster: ClusterFactory) -> None:
    step, plans, _ = one_worker(cluster, "naive")  # naive: rows are clean after each step
    step.run(plans[0])
    with pytest.raises(PlanMismatch, match="latest version"):
        step.run(replace(plans[1], pull=plans[0].update_local[:2]))


def test_a_plan_without_samples_is_refused(cluster: ClusterFactory) -> None:
    """A feeder that submitted keys only: the worker says what to send instead."""
    step, plans, _ = one_worker(cluster)
    with pytest.raises(MissingSamples, match="submit whole samples"):
        step.run(replace(plans[0], mini_batch=None))
    assert len(step.cache) == 0  # refused before anything moved


def test_lists_that_miss_or_repeat_keys_or_rows_not_held_are_refused(
    cluster: ClusterFactory,
) -> None:
    """Gradient rows are matched to the lists' keys by key, so the lists must cover the
    mini-batch's keys, each once; otherwise the plan is refused before anything moves."""
    step, plans, _ = one_worker(cluster)
    first = plans[0]
    assert first.update_local.shape[0] >= 2
    for bad in (first.update_local[1:], np.concatenate([first.update_local,
                                                        first.update_local[:1]])):  # fmt: skip
        with pytest.raises(PlanMismatch, match="each once"):
            step.run(replace(first, update_local=bad))
    assert len(step.cache) == 0
    with pytest.raises(PlanMismatch, match="does not hold"):
        step.run(replace(first, pull=first.pull[1:]))


def test_lists_in_another_order_train_the_same_rows(cluster: ClusterFactory) -> None:
    """The scheduler may list a worker's keys in any order: reversed lists apply each
    key's own gradient, so the cache ends exactly as with the lists as planned."""
    results = []
    for reverse in (False, True):
        step, plans, _ = one_worker(cluster)
        first = plans[0]
        if reverse:
            first = replace(first, update_local=first.update_local[::-1],
                            push_grads=first.push_grads[::-1])  # fmt: skip
        step.run(first)
        values, state = step.cache.host_rows(np.sort(first.update_local))
        results.append((values, state))
    assert np.array_equal(results[0][0], results[1][0])
    assert np.array_equal(results[0][1], results[1][1])


def test_the_pipelined_step_joins_prefetched_and_late_rows(cluster: ClusterFactory) -> None:
    """Early rows pulled ahead (``prefetch``) and the rest pulled when the plan runs are
    admitted in the plan's pull order: the cache ends as a herald step's, on its own shards.
    Each row counts as one pull, the prefetched ones also as early. Early keys that are not a
    sub-sequence of the pulls are refused unsent."""
    step, plans, _ = one_worker(cluster, "herald_pipelined")
    plain, _, _ = one_worker(cluster, "herald")
    assert isinstance(step, PipelinedPlanStep) and not isinstance(plain, PipelinedPlanStep)
    assert plans[0].pull_early.size == 0 and plans[1].pull_early.size > 0
    with pytest.raises(PlanMismatch, match="not a sub-sequence"):
        step.prefetch(replace(plans[1], pull_early=plans[1].pull_early[::-1]))
    # Plan 1: half its early keys prefetched while plan 0 runs, the rest pulled late;
    # plan 2: not prefetched (nothing held while plan 1 runs).
    early = plans[1].pull_early[: plans[1].pull_early.shape[0] // 2]
    plans[1] = replace(plans[1], pull_early=early)
    held = [plans[1]]
    step.follow(lambda: held)
    for plan in plans:
        traffic, loss = step.run(plan)
        want, want_loss = plain.run(replace(plan, pull_early=np.empty(0, np.int64)))
        assert loss == want_loss
        assert traffic.early_pulls == (early.shape[0] if plan.iteration == 1 else 0)
        held.clear()
        assert replace(traffic, early_pulls=0) == want
    keys = plain.cache.cached_keys()
    assert np.array_equal(np.sort(step.cache.cached_keys()), np.sort(keys))
    for got, expected in zip(step.cache.host_rows(keys), plain.cache.host_rows(keys), strict=True):
        assert np.array_equal(got, expected)
    assert np.array_equal(step.cache.clocks(step.cache.slots(keys)),
                          plain.cache.clocks(plain.cache.slots(keys)))  # fmt: skip


def test_rows_of_plans_two_ahead_are_pulled_as_soon_as_their_lead_allows(
    cluster: ClusterFactory,
) -> None:
    """--prefetch-plans 2: while plan t runs the worker holds plans t+1 and t+2; an early key
    of plan t+2 with lead 2 is pulled then, one with lead 1 only while t+1 runs. The rows,
    the loss and the counts are a herald step's; leads that do not match the early keys are
    refused unsent."""
    step, plans, _ = one_worker(cluster, "herald_pipelined", prefetch_plans=2)
    plain, _, _ = one_worker(cluster, "herald")
    assert isinstance(step, PipelinedPlanStep)
    leads = {p.iteration: p.early_leads() for p in plans}
    assert (leads[2] == 2).any(), leads  # first touches nothing before changes
    with pytest.raises(PlanMismatch, match="leads"):
        step.prefetch(replace(plans[2], pull_early_from=plans[2].pull_early_from[1:]))
    with pytest.raises(PlanMismatch, match="leads"):
        step.prefetch(replace(plans[2], pull_early_from=np.zeros_like(plans[2].pull_early_from)))
    pulled: list[tuple[int, int, npt.NDArray[np.int64]]] = []  # (running, plan, keys)
    running = [-1]
    pull_rows = step.pull_rows

    def recorded(plan: CommPlan, keys: npt.NDArray[np.int64]) -> Future[Pulled]:
        pulled.append((running[0], plan.iteration, keys.copy()))
        return pull_rows(plan, keys)

    step.pull_rows = recorded  # type: ignore[method-assign]
    step.follow(lambda: [p for p in plans if running[0] < p.iteration <= running[0] + 2])
    for plan in plans:
        running[0] = plan.iteration
        traffic, loss = step.run(plan)
        want, want_loss = plain.run(replace(plan, pull_early=np.empty(0, np.int64),
                                            pull_early_from=np.empty(0, np.uint8)))  # fmt: skip
        assert loss == want_loss
        assert traffic.early_pulls == plan.pull_early.shape[0]
        assert replace(traffic, early_pulls=0) == want
    for plan in plans[1:]:
        u, early, lead = plan.iteration, plan.pull_early, leads[plan.iteration]
        for ran in (u - 2, u - 1):
            if ran >= 0:
                got = [keys for r, it, keys in pulled if (r, it) == (ran, u)]
                want_keys = early[u - lead == ran]
                assert np.array_equal(np.concatenate(got) if got else early[:0], want_keys)
    keys = plain.cache.cached_keys()
    for got_rows, expected in zip(step.cache.host_rows(keys), plain.cache.host_rows(keys),
                                  strict=True):  # fmt: skip
        assert np.array_equal(got_rows, expected)


def test_gradients_left_for_the_next_plan_update_the_rows_its_commit_applies(
    cluster: ClusterFactory,
) -> None:
    """Pass-through gradients a plan leaves for the next one (``push_later``) go into the
    next iteration's buffer: that iteration's commit leaves the PS as pushing them at once
    did. A later list that is not a sub-sequence of the pushes, or one at a checkpoint, and
    a plan that is not the iteration they wait for, are refused before anything is sent."""
    none = np.empty(0, np.int64)
    rows = []
    for defer in (True, False):
        step, plans, _ = one_worker(cluster, look_ahead=3)
        later = plans[0].push_later
        assert later.shape[0] > 1 and plans[1].push_later.shape[0] and not plans[2].push_later.size
        before = step.ps.pull(EMBEDDING_TABLE, later)
        for plan in plans:
            step.run(plan if defer else replace(plan, push_later=none))
            step.ps.commit(plan.iteration)
            if plan.iteration == 0:  # deferred: commit 0 left them alone
                after = step.ps.pull(EMBEDDING_TABLE, later)
                assert np.array_equal(after[0], before[0]) == defer
        keys = np.unique(np.concatenate([p.push_grads for p in plans]))
        rows.append(step.ps.pull(EMBEDDING_TABLE, keys))
    assert np.array_equal(rows[0][0], rows[1][0]) and np.array_equal(rows[0][1], rows[1][1])

    step, plans, _ = one_worker(cluster, look_ahead=3)
    first = plans[0]
    with pytest.raises(PlanMismatch, match="not a sub-sequence"):
        step.run(replace(first, push_later=first.push_later[::-1]))
    with pytest.raises(PlanMismatch, match="not a sub-sequence"):
        step.run(replace(first, checkpoint=True))
    step.run(first)
    with pytest.raises(PlanMismatch, match="keeps for iteration 1"):
        step.run(plans[2])
