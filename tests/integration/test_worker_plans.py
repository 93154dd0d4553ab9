"""A worker executing plans against real in-process PS shards: mismatches are errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.plan import CommPlan
from scheduler_service.batch import Batch
from scheduler_service.scheduler import Scheduler
from tests.conftest import ClusterFactory
from worker_client.job import TrainingJob
from worker_client.minibatch import global_batches
from worker_client.plan_step import PlanMismatch, PlanStep
from worker_client.step import MissingSamples

TRAIN, _ = bundled_data()


def one_worker(
    cluster: ClusterFactory, mode: str = "herald"
) -> tuple[PlanStep, list[CommPlan], TrainingJob]:
    """A plan step and the plans of 3 iterations, each carrying its samples."""
    job = TrainingJob(data=str(TRAIN), workers=1, batch_size_per_worker=16, iterations=3,
                      embedding_dim=4, hidden=(8,), cache_rows=2000)  # fmt: skip
    dataset = job.read()
    _, ps = cluster(2)
    step = PlanStep(job, 0, ps, job.cache_rows)
    job.create_tables(ps)
    scheduler = Scheduler(1, job.cache_rows, mode)
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
    # Pulling rows the worker holds dirty is refused (their updates would be lost).
    with pytest.raises(PlanMismatch, match=r"holds dirty"):
        step.run(replace(plans[1], pull=held))
    # Evicting a row the worker never held is refused.
    with pytest.raises(PlanMismatch, match="does not hold"):
        step.run(replace(plans[1], evict=np.array([12345], np.int64)))
    # Writing back a row that will not be dirty is refused before anything is sent.
    none = np.empty(0, np.int64)
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


def test_lists_out_of_order_or_rows_not_held_are_refused(cluster: ClusterFactory) -> None:
    """Gradient rows are matched to keys by the plan's order; a reordered list would apply
    one key's gradient to another, so it is refused before anything moves."""
    step, plans, _ = one_worker(cluster)
    first = plans[0]
    assert first.update_local.shape[0] >= 2
    with pytest.raises(PlanMismatch, match="in their order"):
        step.run(replace(first, update_local=first.update_local[::-1]))
    assert len(step.cache) == 0
    with pytest.raises(PlanMismatch, match="does not hold"):
        step.run(replace(first, pull=first.pull[1:]))
