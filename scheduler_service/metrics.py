"""Prometheus metrics of the scheduler (``heraldps_scheduler_*``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.final_flush = Gauge(
            "heraldps_scheduler_final_flush_rows", "Dirty rows left for the final flush",
            registry=r,
        )  # fmt: skip
