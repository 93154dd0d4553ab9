"""Prometheus metrics of a PS shard (``heraldps_ps_*``).

Labels are low-cardinality only: method, code, table, shard. Never a key.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class PSMetrics:
    """The metric families one shard exports, in their own registry."""

    def __init__(self, shard_index: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.shard = str(shard_index)
        r = self.registry
        self.requests = Counter(
            "heraldps_ps_requests",
            "RPCs handled, by method and status code",
            ["shard", "method", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "heraldps_ps_request_seconds",
            "RPC handling time",
            ["shard", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pulled = Counter(
            "heraldps_ps_pull_keys", "Keys answered by Pull", ["shard", "table"], registry=r
        )
        self.version_checks = Counter(
            "heraldps_ps_version_check_keys",
            "Keys whose clock GetVersions answered",
            ["shard", "table"],
            registry=r,
        )
        self.pushed = Counter(
            "heraldps_ps_push_keys",
            "Gradient rows received by PushGradients",
            ["shard", "table"],
            registry=r,
        )
        self.written_back = Counter(
            "heraldps_ps_write_back_keys",
            "Rows stored by WriteBack",
            ["shard", "table"],
            registry=r,
        )
        self.rows = Gauge("heraldps_ps_rows", "Rows held", ["shard", "table"], registry=r)
        self.bytes = Gauge(
            "heraldps_ps_bytes",
            "Bytes held (rows, index, gradient buffers)",
            ["shard", "table"],
            registry=r,
        )
        self.commit_seconds = Histogram(
            "heraldps_ps_commit_seconds",
            "Time to apply one Commit",
            ["shard"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.committed_iteration = Gauge(
            "heraldps_ps_committed_iteration", "Last committed iteration", ["shard"], registry=r
        )
        self.memory_limit = Gauge(
            "heraldps_ps_memory_limit_bytes",
            "Configured memory limit (0: none)",
            ["shard"],
            registry=r,
        )

    def add_table(self, table: str) -> None:
        """Start the table's row counters at 0, so every series exists before its first use
        (a dashboard query of, say, HET clock checks then returns 0, not nothing)."""
        for counter in (self.pulled, self.version_checks, self.pushed, self.written_back):
            counter.labels(self.shard, table)

    def drop_table(self, table: str) -> None:
        """Forget a dropped table's series (a table never created has none to show)."""
        for family in (self.pulled, self.version_checks, self.pushed, self.written_back,
                       self.rows, self.bytes):  # fmt: skip
            with contextlib.suppress(KeyError):
                family.remove(self.shard, table)
