"""Prometheus metrics of the scheduler (``heraldps_scheduler_*``)."""

from __future__ import annotations

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
