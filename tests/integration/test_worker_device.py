"""The worker's device (CuPy) path without a GPU: every mode through ``tests.fakecupy``.

Real PS shards (in-process gRPC), the real scheduler core and the real worker
steps, with the caches, the model and the optimizer on fake device arrays that
refuse implicit host conversion. Two things are checked:

1. Exactness: after T iterations every mode's model equals single-process
   training (float32 summation order aside), as on NumPy.
2. Transfers: host<->device copies per worker per iteration stay within a
   bound that does not depend on the batch or the cache size. Derived from
   ``worker_client/plan_step.py``, ``het_step.py``, ``step.py`` and
   ``cache.py`` (docs/workers.md, "The GPU path"), per iteration at most:

   - plan step, host -> device 13: dense parameters 1; pull (slots, values,
     state) 3; gather slots 1; model inputs (field rows, dense features,
     labels) 3; local update (slots, gradient rows) 2; pushed gradient rows
     1; write-back slots 2 (rows the iteration does not train leave before
     it pulls, the others after the local update, the final flush with
     them).
     device -> host 7: loss 1; pushed gradients 1; dense gradient 1;
     write-back (values, state) 2 x 2.
   - HET step, host -> device 14: dense 1; stale rows' pending 1; evicted rows'
     pending 1; pull 3; gather 1; model inputs 3; add pending 1; local update 1;
     rows at the bound 1; final flush 1.
     device -> host 6: stale pending 1; evicted pending 1; loss 1; gradients
     (s = 0) or rows at the bound (s > 0) 1; dense gradient 1; final flush 1.
   - with dropout, one more host -> device: the samples' global indices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.client import PSClient
from heraldps.job import DENSE_TABLE, EMBEDDING_TABLE, TrainingJob
from heraldps.modes import ALL_MODES, HERALD_MODES, HET_MODE, PIPELINED_MODE
from heraldps.plan import CommPlan
from scheduler_service.batch import Batch
from scheduler_service.scheduler import make_scheduler
from scheduler_service.simulate import cache_rows_for
from tests import fakecupy
from tests.conftest import ClusterFactory
from worker_client.minibatch import global_batches
from worker_client.pipeline import PipelinedPlanStep
from worker_client.reference import ReferenceTrainer
from worker_client.worker import make_step

TRAIN, _ = bundled_data()
BOUNDS = {"plan": {"to_device": 13, "to_host": 7}, "het": {"to_device": 14, "to_host": 6}}


def small_job(staleness: int = 0) -> TrainingJob:
    job = TrainingJob(data=str(TRAIN), workers=4, batch_size_per_worker=32, iterations=16,
                      optimizer="adam", embedding_dim=4, hidden=(16,),
                      staleness=staleness)  # fmt: skip
    # A cache of 3% of the file's keys: evictions and eviction write-backs happen.
    return replace(job, cache_rows=cache_rows_for(job.read(), 0.03))


def showing(plan: CommPlan | None) -> Callable[[], list[CommPlan]]:
    """What a pipelined step sees held after the plan it runs."""
    return lambda: [] if plan is None else [plan]


def train_on_fake_device(
    cluster: ClusterFactory, job: TrainingJob, mode: str
) -> tuple[list[dict[str, int]], PSClient]:
    """Train every iteration with the real scheduler core and steps; the transfer
    counts of every (worker, iteration) and the PS client.

    Iteration t runs once plans t+1 exist. A pipelined step sees its plan t+1 while it runs
    t and prefetches its early rows there, before the other workers push and write back t
    and before t's commit."""
    dataset = job.read()
    _, ps = cluster(2)
    job.create_tables(ps)
    steps = [make_step(mode, job, w, ps, job.cache_rows, fakecupy) for w in range(job.workers)]
    scheduler = make_scheduler(job.workers, job.cache_rows, mode)
    batches = global_batches(dataset, job.global_batch, job.iterations)
    counts: list[dict[str, int]] = []
    early = 0

    def execute(plans: list[CommPlan], upcoming: list[CommPlan], final: bool) -> None:
        nonlocal early
        for plan in plans:
            plan.final_flush = final
            plan.mini_batch = batches[plan.iteration].take(plan.samples)
            step = steps[plan.worker]
            if isinstance(step, PipelinedPlanStep):
                step.follow(showing(upcoming[plan.worker] if upcoming else None))
            fakecupy.reset()
            traffic, _ = step.run(plan)
            early += traffic.early_pulls
            counts.append(dict(fakecupy.transfers))
        if plans:
            ps.commit(plans[0].iteration)

    pending: list[CommPlan] = []
    for t, batch in enumerate(batches):
        released = scheduler.submit(Batch(t, batch.offsets, batch.keys, job.workers))
        if released:
            execute(pending, released, final=False)
            pending = released
    last = scheduler.finish()
    execute(pending, last, final=False)
    execute(last, [], final=True)
    # Rows were prefetched exactly in the pipelined mode, as many as the plans marked.
    assert early == (scheduler.counts.early_pulls if mode == PIPELINED_MODE else 0)
    assert (early > 0) == (mode == PIPELINED_MODE)
    return counts, ps


# A deeper MLP, another activation and dropout: masks drawn from each sample's global index.
MLP = {"hidden": (8, 8), "activation": "tanh", "dropout": 0.25}


@pytest.mark.parametrize("mlp", [{}, MLP], ids=["default_mlp", "tanh_dropout"])
@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_mode_on_the_fake_device_trains_the_single_process_model(
    mode: str, mlp: dict[str, Any], cluster: ClusterFactory
) -> None:
    job = replace(small_job(), **mlp)
    reference = ReferenceTrainer(job)
    reference.train(job.read())
    counts, ps = train_on_fake_device(cluster, job, mode)
    keys = np.unique(job.read().keys)
    values, versions, state = ps.pull_with_state(EMBEDDING_TABLE, keys)
    ref_values, ref_state, ref_versions = reference.rows_of(keys)
    np.testing.assert_allclose(values, ref_values, rtol=1e-4, atol=1e-6, err_msg=mode)
    np.testing.assert_allclose(state, ref_state, rtol=1e-4, atol=1e-6, err_msg=mode)
    if mode in HERALD_MODES:  # HET writes no rows back, so its clocks count commits only
        assert np.array_equal(versions, ref_versions), mode
    dense_param = job.dense_parameter(job.model().dense_size)
    dense, _, _ = ps.pull_with_state(DENSE_TABLE, dense_param.keys)
    np.testing.assert_allclose(dense, reference.dense_rows, rtol=1e-4, atol=1e-6, err_msg=mode)

    bound = dict(BOUNDS["het" if mode == HET_MODE else "plan"])
    bound["to_device"] += job.dropout > 0
    assert len(counts) == job.workers * (job.iterations or 0)
    for kind, most in bound.items():
        assert max(c.get(kind, 0) for c in counts) <= most, (mode, kind)
    assert all(c.get("to_device", 0) > 0 and c.get("to_host", 0) > 0 for c in counts)


def test_het_with_staleness_stays_within_the_transfer_bound(cluster: ClusterFactory) -> None:
    """s > 0 takes the other HET branches (pending gradients, rows at the bound)."""
    counts, _ = train_on_fake_device(cluster, small_job(staleness=2), HET_MODE)
    for kind, most in BOUNDS["het"].items():
        assert max(c.get(kind, 0) for c in counts) <= most, kind


def test_the_fake_device_refuses_implicit_conversions() -> None:
    x = fakecupy.asarray(np.arange(4, dtype=np.float32))
    for convert in (np.asarray, float, list, lambda a: a.tolist(), bool):
        with pytest.raises(TypeError, match="implicit conversion"):
            convert(x)
    with pytest.raises(TypeError, match="host NumPy array"):
        _ = x + np.ones(4, np.float32)
    with pytest.raises(TypeError, match="host NumPy array"):
        _ = x[np.array([0, 1])]
    fakecupy.reset()
    assert fakecupy.asnumpy(x[fakecupy.asarray(np.array([1, 3]))]).tolist() == [1.0, 3.0]
    assert dict(fakecupy.transfers) == {"to_device": 1, "to_host": 1}
