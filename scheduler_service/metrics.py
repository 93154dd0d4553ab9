"""Prometheus metrics of the scheduler (``heraldps_scheduler_*``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from heraldps.traffic import Traffic

PLANNED_KINDS = ("pull", "grad_push", "write_back")
REPORTED_KINDS = (*PLANNED_KINDS, "final_flush", "version_check")
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_PLAN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class SchedulerMetrics:
    def __init__(self, mode: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.mode = mode
        r = self.registry
        self.requests = Counter(
            "heraldps_scheduler_requests", "RPCs handled, by method and status code",
            ["method", "code"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "heraldps_scheduler_request_seconds", "RPC handling time", ["method"], registry=r
        )
        self.plan_seconds = Histogram(
            "heraldps_scheduler_plan_seconds", "Partition + plan time of one batch", ["mode"],
            buckets=_PLAN_BUCKETS, registry=r,
        )  # fmt: skip
        self.plan_wait = Histogram(
            "heraldps_scheduler_plan_wait_seconds",
            "From a worker's report of iteration t (or its registration) to its plan of t+1 "
            "leaving the scheduler: the worker's wait at the barrier (herald_pipelined: its "
            "ReportDone's wait for the commit)",
            ["worker"], buckets=_WAIT_BUCKETS, registry=r,
        )  # fmt: skip
        self.planned_rows = Counter(
            "heraldps_scheduler_planned_rows",
            "Rows the plans move, by kind (pull, grad_push, write_back)", ["mode", "kind"],
            registry=r,
        )  # fmt: skip
        self.reported_rows = Counter(
            "heraldps_scheduler_reported_rows",
            "Rows workers report they moved, by kind (pull, grad_push, write_back, final_flush, "
            "version_check)",
            ["mode", "worker", "kind"], registry=r,
        )  # fmt: skip
        for kind in PLANNED_KINDS:  # from 0, so rates include the first plans
            self.planned_rows.labels(mode, kind)
        self.hit_ratio = Gauge(
            "heraldps_scheduler_cache_hit_ratio",
            "Share of a worker's trained rows found valid in its cache (last iteration)",
            ["worker"], registry=r,
        )  # fmt: skip
        self.backlog = Gauge(
            "heraldps_scheduler_backlog", "Planned iterations not yet committed", registry=r
        )
        self.committed = Gauge(
            "heraldps_scheduler_committed_iteration", "Last committed iteration", registry=r
        )
        self.commits = Counter(
            "heraldps_scheduler_commits", "Iterations committed on every PS shard", registry=r
        )
        self.last_commit = Gauge(
            "heraldps_scheduler_last_commit_timestamp_seconds",
            "Unix time of the last commit (of the scheduler's start before the first)",
            registry=r,
        )
        self.last_commit.set_to_current_time()
        self.registered = Gauge(
            "heraldps_scheduler_registered_workers", "Workers that called RegisterWorker",
            registry=r,
        )  # fmt: skip
        self.finished = Gauge(
            "heraldps_scheduler_finished", "1 once the feeder called Finish (no more batches)",
            registry=r,
        )  # fmt: skip
        self.aborted = Gauge(
            "heraldps_scheduler_run_aborted",
            "1 once the run was aborted (a worker silent past --worker-timeout, a failed or "
            "stuck commit); the reason is in the scheduler's log and its ABORTED answers",
            registry=r,
        )  # fmt: skip
        self.final_flush = Gauge(
            "heraldps_scheduler_final_flush_rows", "Dirty rows left for the final flush",
            registry=r,
        )  # fmt: skip

    def start_worker(self, worker: int) -> None:
        """Start a registered worker's report counters at 0: a rate over a window that
        begins before its first report then counts that report too."""
        for kind in REPORTED_KINDS:
            self.reported_rows.labels(self.mode, str(worker), kind)

    def watch_counts(
        self, counts: Callable[[], Traffic], naive: Callable[[], Traffic | None]
    ) -> None:
        """Export assignment locality from ``counts()`` and naive's rows from ``naive()``
        (None: not known), both read at scrape time."""
        self.registry.register(_CountsCollector(self.mode, counts, naive))


class _CountsCollector:
    """Counters read from the scheduler's own running counts when Prometheus scrapes."""

    def __init__(
        self,
        mode: str,
        counts: Callable[[], Traffic],
        naive: Callable[[], Traffic | None],
    ) -> None:
        self.mode = mode
        self.counts = counts
        self.naive = naive

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = self.counts()
        held = CounterMetricFamily(
            "heraldps_scheduler_held_samples",
            "Samples at least one of whose keys some worker held validly when planned",
            labels=["mode"],
        )
        held.add_metric([self.mode], c.held_samples)
        yield held
        local = CounterMetricFamily(
            "heraldps_scheduler_local_samples",
            "Held samples assigned to a worker holding the most of their keys (locality)",
            labels=["mode"],
        )
        local.add_metric([self.mode], c.local_samples)
        yield local
        naive = CounterMetricFamily(
            "heraldps_scheduler_naive_rows",
            "Rows mode naive would move on the same batches, by kind (pull, grad_push, write_back)",
            labels=["mode", "kind"],
        )
        n = self.naive()
        if n is not None:
            naive.add_metric([self.mode, "pull"], n.pulls)
            naive.add_metric([self.mode, "grad_push"], n.grad_pushes)
            naive.add_metric([self.mode, "write_back"], n.write_backs)
        yield naive

    def describe(self) -> Iterator[CounterMetricFamily]:
        """The families (without samples), so the registry rejects a duplicate name."""
        return self.collect()


class CheckpointMetrics:
    """The scheduler's checkpoints (``heraldps_scheduler_checkpoint*``): written, failed,
    how old and how big the newest good one is, and what a resume skipped."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        prefix = "heraldps_scheduler_checkpoint"

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{prefix}{name}", doc, labels, registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{prefix}{name}", doc, registry=r)

        self.written = counter("s_written", "Checkpoints written and published")
        self.failed = counter(
            "_failures", "Checkpoints that failed (training went on; the newest good one stays)"
        )
        self.consecutive_failures = gauge(
            "_consecutive_failures", "Checkpoints failed since the last one written"
        )
        self.last_good = gauge(
            "_last_good_timestamp_seconds",
            "Unix time the newest good checkpoint was written (0: none yet)",
        )
        self.age = gauge(
            "_age_seconds", "Seconds since the newest good checkpoint was written (-1: none yet)"
        )
        self._last_good_time = 0.0
        self.age.set_function(self._age)
        self.bytes = gauge("_bytes", "Bytes on disk of the newest good checkpoint")
        self.free_bytes = gauge(
            "_free_bytes", "Bytes free on the checkpoint disk, after the last checkpoint"
        )
        self.pruned_for_space = counter(
            "s_pruned_for_space", "Older checkpoints removed before a write to make room"
        )
        self.skipped = counter(
            "s_skipped",
            "Checkpoints a resume refused, by reason (unreadable, disagrees, damaged)",
            ("reason",),
        )
        for reason in ("unreadable", "disagrees", "damaged"):
            self.skipped.labels(reason)
        self.fallbacks = counter(
            "_fallbacks", "Resumes that took an older checkpoint because newer ones did not verify"
        )

    def _age(self) -> float:
        last = self._last_good_time
        return time.time() - last if last > 0 else -1.0

    def good(self, when: float, size: int) -> None:
        """A checkpoint was written (or resumed from) at Unix time ``when``."""
        self._last_good_time = when
        self.last_good.set(when)
        self.bytes.set(size)
