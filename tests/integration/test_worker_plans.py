"""A worker executing plans against real in-process PS shards: mismatches are errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from scheduler_service.batch import Batch
from scheduler_service.plan import CommPlan
from scheduler_service.scheduler import Scheduler
from tests.conftest import ClusterFactory
from worker_client.job import TrainingJob
from worker_client.minibatch import global_batches
from worker_client.trainer import PlanMismatch, WorkerTrainer, create_tables

TRAIN, _ = bundled_data()


def one_worker(
    cluster: ClusterFactory, mode: str = "herald"
) -> tuple[WorkerTrainer, list[CommPlan], TrainingJob]:
    job = TrainingJob(data=str(TRAIN), workers=1, batch_size_per_worker=16, iterations=3,
                      embedding_dim=4, hidden=(8,), cache_rows=2000)  # fmt: skip
    dataset = job.read()
    _, ps = cluster(2)
    trainer = WorkerTrainer(job, dataset, 0, ps, job.cache_rows)
    create_tables(ps, job, trainer.model)
    scheduler = Scheduler(1, job.cache_rows, mode)
    batches = global_batches(dataset, job.global_batch, job.iterations)
    plans: list[CommPlan] = []
    for t, batch in enumerate(batches):
        plans += scheduler.submit(Batch(t, batch.offsets, batch.keys, 1))
    plans += scheduler.finish()
    return trainer, plans, job


def test_plans_run_and_mismatches_are_refused(cluster: ClusterFactory) -> None:
    trainer, plans, job = one_worker(cluster)
    batches = global_batches(job.read(), job.global_batch, job.iterations)
    traffic, loss = trainer.run_plan(plans[0], batches[0])
    assert traffic.pulls == plans[0].pull.shape[0] > 0 and np.isfinite(loss)
    held = plans[0].pull[:3]
    # Pulling rows the worker holds dirty is refused (their updates would be lost).
    with pytest.raises(PlanMismatch, match=r"holds dirty"):
        trainer.run_plan(replace(plans[1], pull=held), batches[1])
    # Evicting a row the worker never held is refused.
    with pytest.raises(PlanMismatch, match="does not hold"):
        trainer.run_plan(replace(plans[1], evict=np.array([12345], np.int64)), batches[1])
    # Writing back a row that will not be dirty is refused before anything is sent.
    with pytest.raises(PlanMismatch, match="will not hold dirty"):
        trainer.run_plan(
            replace(plans[1], pull=np.empty(0, np.int64), samples=np.empty(0, np.int64),
                    update_local=np.empty(0, np.int64), push_grads=np.empty(0, np.int64),
                    write_back=np.array([777], np.int64)),
            batches[1],
        )  # fmt: skip


def test_pulling_a_row_held_at_the_latest_version_is_refused(cluster: ClusterFactory) -> None:
    trainer, plans, job = one_worker(cluster, "naive")  # naive: rows are clean after each step
    batches = global_batches(job.read(), job.global_batch, job.iterations)
    trainer.run_plan(plans[0], batches[0])
    with pytest.raises(PlanMismatch, match="latest version"):
        trainer.run_plan(replace(plans[1], pull=plans[0].update_local[:2]), batches[1])
