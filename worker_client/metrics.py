"""Prometheus metrics of a worker (``heraldps_worker_*``), served by ``--metrics-port``.

Updated once per iteration from the iteration's :class:`~heraldps.traffic.Traffic`
(counts the trainer already keeps), so metrics add no per-key work. Labels:
``worker`` and ``mode`` (the scheduler's mode, learnt at registration), plus
``kind`` for rows and bytes. Rows count as in the counting model (docs/scheduler.md):
one row in one direction is 1; bytes are payload bytes (keys, versions,
values, optimizer state), as ``heraldps local`` reports them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from heraldps.modes import mode_named
from heraldps.ports import serve_metrics
from heraldps.traffic import Traffic
from worker_client.cache import EmbeddingCache
from worker_client.timing import PHASES

ROW_KINDS = ("pull", "grad_push", "write_back", "final_flush", "version_check")
_ITERATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WorkerMetrics:
    """The families one worker exports; :meth:`bind` once the mode is known."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, labels = self.registry, ["worker", "mode"]
        self.iterations = Counter(
            "heraldps_worker_iterations", "Iterations this worker trained and reported",
            labels, registry=r,
        )  # fmt: skip
        self.samples = Counter(
            "heraldps_worker_samples", "Samples this worker trained", labels, registry=r
        )
        self.iteration_seconds = Histogram(
            "heraldps_worker_iteration_seconds",
            "Plan received to report sent, one iteration", labels,
            buckets=_ITERATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.last_iteration = Gauge(
            "heraldps_worker_last_iteration", "Last iteration this worker reported (-1: none)",
            labels,
            registry=r,
        )  # fmt: skip
        self.rows = Counter(
            "heraldps_worker_rows",
            "Embedding rows moved, by kind (pull, grad_push, write_back, final_flush, "
            "version_check)", [*labels, "kind"], registry=r,
        )  # fmt: skip
        self.bytes = Counter(
            "heraldps_worker_bytes",
            "Payload bytes of embedding rows moved, by kind (pull, grad_push, write_back, "
            "final_flush)", [*labels, "kind"], registry=r,
        )  # fmt: skip
        self.cache_hits = Counter(
            "heraldps_worker_cache_hits",
            "Trained rows found usable in the cache (no pull)", labels, registry=r,
        )  # fmt: skip
        self.cache_lookups = Counter(
            "heraldps_worker_cache_lookups",
            "Distinct rows of the worker's mini-batches (hits + pulls)", labels, registry=r,
        )  # fmt: skip
        self.cache_rows = Gauge(
            "heraldps_worker_cache_rows", "Rows held in the cache", labels, registry=r
        )
        self.cache_dirty_rows = Gauge(
            "heraldps_worker_cache_dirty_rows",
            "Cached rows newer than the PS (updated locally, not yet written back or pushed)",
            labels, registry=r,
        )  # fmt: skip
        self.cache_capacity = Gauge(
            "heraldps_worker_cache_capacity_rows", "Rows the cache can hold", labels, registry=r
        )
        self.staleness_bound = Gauge(
            "heraldps_worker_staleness_bound",
            "HET staleness bound s (0: synchronous; Herald modes always 0)", labels,
            registry=r,
        )  # fmt: skip
        self.stale_rows = Counter(
            "heraldps_worker_stale_rows",
            "HET: cached rows whose PS clock was more than s ahead (CheckValid failed), refetched",
            labels, registry=r,
        )  # fmt: skip
        self.bound_releases = Counter(
            "heraldps_worker_bound_releases",
            "HET with s > 0: rows with more than s unpushed local updates, so their "
            "gradients were pushed and the row released", labels, registry=r,
        )  # fmt: skip
        self.loss = Gauge(
            "heraldps_worker_loss", "Mean training loss of the worker's last mini-batch", labels,
            registry=r,
        )  # fmt: skip
        self.phase_seconds = Histogram(
            "heraldps_worker_phase_seconds",
            "Seconds of one iteration spent in each phase (plan_wait, pull, dense_pull, "
            "compute, optimizer, push, write_back, dense_push, peer_wait, report)",
            [*labels, "phase"],
            buckets=PHASE_BUCKETS, registry=r,
        )  # fmt: skip
        self.dense_bytes = Counter(
            "heraldps_worker_dense_bytes",
            "Bytes of dense parameters sent and received (PS pull/push or all-reduce)", labels,
            registry=r,
        )  # fmt: skip
        self._labels: tuple[str, str] | None = None
        self._row_bytes: dict[str, int] = {}

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on ``host:port`` (port 0: a free one); the port it got."""
        server = serve_metrics(port, host, self.registry, "the worker's /metrics")
        bound: int = server.server_port
        return bound

    def bind(
        self,
        worker: int,
        mode: str,
        staleness: int,
        cache_rows: int,
        row_bytes: dict[str, int],
    ) -> None:
        """Label values and constants, known once the scheduler answered RegisterWorker.

        ``row_bytes``: payload bytes per row of each kind (``TrainingJob.row_bytes(mode)``).
        Every series starts at 0, so a dashboard sees all of them from the first scrape.
        """
        labels = self._labels = (str(worker), mode)
        self._row_bytes = dict(row_bytes)
        for family in (self.iterations, self.samples, self.cache_hits, self.cache_lookups,
                       self.stale_rows, self.bound_releases):  # fmt: skip
            family.labels(*labels)
        for kind in ROW_KINDS:
            self.rows.labels(*labels, kind)
        for kind in self._row_bytes:
            self.bytes.labels(*labels, kind)
        self.iteration_seconds.labels(*labels)
        self.dense_bytes.labels(*labels)
        for phase in PHASES:
            self.phase_seconds.labels(*labels, phase)
        self.staleness_bound.labels(*labels).set(
            staleness if mode_named(mode).bounded_staleness else 0
        )
        self.cache_capacity.labels(*labels).set(cache_rows)
        self.cache_rows.labels(*labels).set(0)
        self.cache_dirty_rows.labels(*labels).set(0)
        self.last_iteration.labels(*labels).set(-1)

    def observe(
        self,
        iteration: int,
        traffic: Traffic,
        loss_sum: float,
        samples: int,
        seconds: float,
        cache: EmbeddingCache,
        phases: dict[str, float] | None = None,
    ) -> None:
        """One reported iteration: its traffic, loss, time (per phase) and the cache after it."""
        if self._labels is None:
            raise RuntimeError("WorkerMetrics.bind must come before observe")
        labels = self._labels
        self.iterations.labels(*labels).inc()
        self.samples.labels(*labels).inc(samples)
        self.iteration_seconds.labels(*labels).observe(seconds)
        self.last_iteration.labels(*labels).set(iteration)
        moved = {
            "pull": traffic.pulls,
            "grad_push": traffic.grad_pushes,
            "write_back": traffic.write_backs,
            "final_flush": traffic.final_flush,
            "version_check": traffic.version_checks,
        }
        for kind, rows in moved.items():
            self.rows.labels(*labels, kind).inc(rows)
            if kind in self._row_bytes:
                self.bytes.labels(*labels, kind).inc(rows * self._row_bytes[kind])
        if "pull_state" in self._row_bytes:  # bytes only: these rows are counted as pulls
            self.bytes.labels(*labels, "pull_state").inc(
                traffic.state_pulls * self._row_bytes["pull_state"]
            )
        self.dense_bytes.labels(*labels).inc(traffic.dense_bytes)
        for phase, spent in (phases or {}).items():
            self.phase_seconds.labels(*labels, phase).observe(spent)
        self.cache_hits.labels(*labels).inc(traffic.hits)
        self.cache_lookups.labels(*labels).inc(traffic.hits + traffic.pulls)
        self.stale_rows.labels(*labels).inc(traffic.stale)
        self.bound_releases.labels(*labels).inc(traffic.bound_releases)
        if samples:
            self.loss.labels(*labels).set(loss_sum / samples)
        self.cache_rows.labels(*labels).set(len(cache))
        self.cache_dirty_rows.labels(*labels).set(cache.dirty_count())
