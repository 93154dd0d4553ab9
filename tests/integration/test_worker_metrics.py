"""Worker metrics from real training: two HET workers (s = 1) against real in-process shards.

The staleness counts are checked from outside the trainer: a row is stale when the PS's
clock is more than s ahead of the worker's copy (asked of the PS before the iteration), and
a row released at the bound is a trained row no longer cached after the iteration. The
exported series must equal the sums of what the trainer counted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from heraldps.bundled import bundled_data
from heraldps.job import EMBEDDING_TABLE, TrainingJob
from heraldps.plan import CommPlan
from heraldps.traffic import Traffic
from tests.conftest import ClusterFactory
from worker_client.het_step import HETStep
from worker_client.metrics import WorkerMetrics
from worker_client.minibatch import global_batches, select
from worker_client.timing import PHASES

TRAIN, _ = bundled_data()
STALENESS, ITERATIONS, WORKERS = 1, 40, 4


def test_het_staleness_counts_and_their_metrics(cluster: ClusterFactory) -> None:
    job = TrainingJob(data=str(TRAIN), workers=WORKERS, batch_size_per_worker=32,
                      iterations=ITERATIONS, embedding_dim=4, hidden=(8,), cache_rows=3000,
                      staleness=STALENESS)  # fmt: skip
    dataset = job.read()
    _, ps = cluster(2)
    steps = [HETStep(job, w, ps, job.cache_rows) for w in range(WORKERS)]
    job.create_tables(ps)
    metrics = [WorkerMetrics() for _ in range(WORKERS)]
    for w, m in enumerate(metrics):
        m.bind(w, "het", job.staleness, job.cache_rows, job.row_bytes("het"))
    totals = [Traffic() for _ in range(WORKERS)]
    losses = [0.0] * WORKERS
    m_per = job.batch_size_per_worker
    for t, batch in enumerate(global_batches(dataset, job.global_batch, job.iterations)):
        for w, step in enumerate(steps):
            samples = np.arange(w * m_per, (w + 1) * m_per, dtype=np.int64)
            keys = select(batch, samples).keys
            cache = step.cache
            slots = cache.slots(keys)
            held = keys[slots >= 0]
            clocks = ps.versions(EMBEDDING_TABLE, held)
            expected_stale = int(np.count_nonzero(clocks > cache.clocks(slots[slots >= 0]) + 1))
            plan = CommPlan(t, w, samples=samples, final_flush=t == ITERATIONS - 1,
                            mini_batch=batch.take(samples))  # fmt: skip
            traffic, loss = step.run(plan)
            assert traffic.stale == expected_stale
            assert traffic.bound_releases == int(np.count_nonzero(cache.slots(keys) < 0))
            assert traffic.hits + traffic.pulls == keys.shape[0]
            metrics[w].observe(t, traffic, loss, m_per, 0.01, cache, step.timer.take())
            totals[w].add(traffic)
            losses[w] = loss
        ps.commit(t)
    assert sum(t.stale for t in totals) > 0 and sum(t.bound_releases for t in totals) > 0

    for w, (m, total) in enumerate(zip(metrics, totals, strict=True)):
        labels = {"worker": str(w), "mode": "het"}

        def value(name: str, extra: dict[str, str] | None = None) -> float | None:
            return m.registry.get_sample_value(name, {**labels, **(extra or {})})  # noqa: B023

        for kind, rows in (("pull", total.pulls), ("grad_push", total.grad_pushes),
                           ("write_back", total.write_backs), ("final_flush", total.final_flush),
                           ("version_check", total.version_checks)):  # fmt: skip
            assert value("heraldps_worker_rows_total", {"kind": kind}) == rows
        sizes = job.row_bytes("het")
        assert value("heraldps_worker_bytes_total", {"kind": "pull"}) == total.pulls * sizes["pull"]
        assert value("heraldps_worker_bytes_total", {"kind": "final_flush"}) == (
            total.final_flush * sizes["grad_push"]  # HET flushes gradients
        )
        assert value("heraldps_worker_stale_rows_total") == total.stale
        assert value("heraldps_worker_bound_releases_total") == total.bound_releases
        assert value("heraldps_worker_cache_hits_total") == total.hits
        assert value("heraldps_worker_cache_lookups_total") == total.hits + total.pulls
        assert value("heraldps_worker_iterations_total") == ITERATIONS
        assert value("heraldps_worker_samples_total") == ITERATIONS * m_per
        assert value("heraldps_worker_iteration_seconds_count") == ITERATIONS
        for phase in PHASES:  # every phase observed once per iteration, time where work was
            assert value("heraldps_worker_phase_seconds_count", {"phase": phase}) == ITERATIONS
        for phase in ("pull", "compute", "push", "dense_pull", "dense_push"):
            assert value("heraldps_worker_phase_seconds_sum", {"phase": phase}) > 0, phase
        assert value("heraldps_worker_dense_bytes_total") == 0  # observe got no dense bytes
        assert value("heraldps_worker_last_iteration") == ITERATIONS - 1
        assert value("heraldps_worker_staleness_bound") == STALENESS
        assert value("heraldps_worker_loss") == losses[w] / m_per
        assert value("heraldps_worker_cache_rows") == len(steps[w].cache)
        assert value("heraldps_worker_cache_capacity_rows") == job.cache_rows


def test_herald_modes_report_staleness_bound_zero() -> None:
    """Herald modes train synchronously whatever the job's staleness says."""
    job = replace(TrainingJob(data=str(TRAIN)), staleness=3)
    m = WorkerMetrics()
    m.bind(0, "herald", job.staleness, 10, job.row_bytes("herald"))
    labels = {"worker": "0", "mode": "herald"}
    assert m.registry.get_sample_value("heraldps_worker_staleness_bound", labels) == 0
    pulls = m.registry.get_sample_value("heraldps_worker_rows_total", {**labels, "kind": "pull"})
    assert pulls == 0
