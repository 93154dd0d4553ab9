"""``heraldps feed``: the data feeder of a deployed cluster.

``heraldps local`` creates the tables and feeds the scheduler itself. In a
deployment (compose, Kubernetes) the shards, the scheduler and the workers are
separate services, and ``heraldps feed`` is the one-shot process that does the
same. It is the only reader of the data: it submits whole samples, and each
worker gets its own inside its plans. It waits until the shards and the
scheduler serve, creates the job's tables (idempotent), submits every global
batch, calls Finish, and waits until the scheduler has committed the last
iteration. Exit 0 then; any failure, a stall included, ends it with a message
and a non-zero code, never a hang.

Run again against the same scheduler (a restarted feed container), it resumes
at the scheduler's next batch, or only waits if every batch was submitted.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry, Gauge

from heraldps.client import PSClient
from heraldps.data import SparseDataset, check
from heraldps.data.global_batches import StreamedBatches
from heraldps.data.shuffle import ShuffledEpochs
from heraldps.errors import Aborted, AlreadyExists, HeraldError, ResourceExhausted, error_from_rpc
from heraldps.healthcheck import wait_serving
from heraldps.job import TrainingJob
from heraldps.job_file import Schedule
from heraldps.ports import serve_metrics
from heraldps.samples import encode_samples
from heraldps.security import ClientSecurity, open_channel
from heraldps.serving import channel_options
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 2**20


class FeedError(HeraldError):
    """The run cannot be fed or did not finish; the message says why and what to do."""


@dataclass(frozen=True)
class FeedConfig:
    """``heraldps feed`` flags (or ``HERALDPS_*`` variables)."""

    job: str
    scheduler: str
    ps: tuple[str, ...]
    # Wait this long for the services to serve, per RPC, and for progress (a batch
    # accepted or an iteration committed) before giving up.
    timeout_seconds: float = 300.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    security: ClientSecurity = field(default_factory=ClientSecurity)


def submit_batches(
    stub: scheduler_pb2_grpc.SchedulerStub,
    batches: Iterable[SparseDataset],
    *,
    start: int = 0,
    stop: threading.Event | None = None,
    patience: float | None = None,
    timeout: float = 60.0,
    on_submitted: Callable[[int], None] | None = None,
    lr_scales: Sequence[float] = (),
    flush: Container[int] = (),
    checkpoint: Container[int] = (),
    finish: bool = True,
) -> bool:
    """Submit ``batches`` (iterations ``start``, ``start + 1``, ...) in order, whole samples
    each, then Finish (unless not ``finish``); False if ``stop`` was set first.

    Iteration t carries ``lr_scales[t]`` (1.0 past its end; a learning-rate schedule) and
    the flush marker when t is in ``flush`` (the PS holds the exact model once t commits),
    the checkpoint marker when t is in ``checkpoint`` (a flush, then a snapshot).

    ``batches`` is consumed one batch at a time, so a streamed run holds only the batch
    being sent (the scheduler's backlog bounds how far the feeder runs ahead).

    While the scheduler's backlog is full (``RESOURCE_EXHAUSTED``) the batch is
    retried once the scheduler committed another iteration (watched with the small
    ``GetStatus``, so a refused batch is not resent every few milliseconds over the
    scheduler's link); after ``patience`` seconds without an accepted batch, FeedError.
    """
    for t, batch in enumerate(batches, start=start):
        request = scheduler_pb2.SubmitBatchRequest(
            iteration=t,
            batch=encode_samples(batch),
            lr_scale=lr_scales[t] if t < len(lr_scales) else 1.0,
            flush=t in flush,
            checkpoint=t in checkpoint,
        )
        waiting_since = time.monotonic()
        while True:
            if stop is not None and stop.is_set():
                return False
            try:
                stub.SubmitBatch(request, timeout=timeout)
                break
            except grpc.RpcError as err:
                error = error_from_rpc(err, "scheduler")
                if not isinstance(error, ResourceExhausted):
                    raise error from err
            refused_at = _committed(stub, timeout)
            while _committed(stub, timeout) == refused_at:
                if stop is not None and stop.is_set():
                    return False
                if patience is not None and time.monotonic() - waiting_since > patience:
                    raise FeedError(
                        f"the scheduler accepted no batch for {patience:g} s (its backlog "
                        f"stays full at iteration {t}): are the workers running? see their logs"
                    )
                time.sleep(0.01)
        if on_submitted is not None:
            on_submitted(t)
    if stop is not None and stop.is_set():
        return False
    if finish:
        stub.Finish(scheduler_pb2.FinishRequest(), timeout=timeout)
    return True


def _committed(stub: scheduler_pb2_grpc.SchedulerStub, timeout: float) -> int:
    status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=timeout)
    return int(status.committed_iteration)


class FeedMetrics:
    """Progress of the feed on ``/metrics`` (``--metrics-port``)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.batches = Gauge("heraldps_feed_batches", "Global batches of the job", registry=r)
        self.submitted = Gauge(
            "heraldps_feed_submitted_batches", "Batches the scheduler accepted", registry=r
        )
        self.committed = Gauge(
            "heraldps_feed_committed_iteration",
            "Last iteration the scheduler reported committed (-1: none)",
            registry=r,
        )
        self.committed.set(-1)


def run_feed(config: FeedConfig) -> None:
    """Feed the job to the cluster and wait for the last commit; FeedError on failure."""
    if not config.ps:
        raise FeedError("--ps needs the PS shard addresses, comma-separated, in shard order")
    job, schedule = _load_job(config.job)
    check(job.data_spec())  # a wrong column or format fails here, before any batch is sent
    if job.data_spec().needs_stats():  # a job file's standardize/minmax: a first pass
        from dataclasses import replace

        from heraldps.data import scan

        log.info("reading %s once for the dense statistics its transforms need", job.data)
        profile = scan(job.data_spec())
        stats = tuple(s.to_dict() for s in profile.dense_stats)
        job = replace(job, dense_stats=stats, train_rows=profile.rows)
    metrics = FeedMetrics()
    if config.metrics_port is not None:
        serve_metrics(config.metrics_port, config.metrics_host, metrics.registry, "the feed")
    timeout = config.timeout_seconds
    deadline = time.monotonic() + timeout
    for address in (*config.ps, config.scheduler):
        health = wait_serving(address, "", deadline, security=config.security)
        if not health.serving:
            raise FeedError(f"not ready after {timeout:g} s: {health.message}")
    log.info("shards %s and scheduler %s serve", ",".join(config.ps), config.scheduler)
    batches = job_batches(job, schedule)
    metrics.batches.set(len(batches))
    options = channel_options(MAX_MESSAGE_BYTES)
    with open_channel(config.scheduler, options, config.security) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=timeout)
        with PSClient(list(config.ps), timeout=timeout, security=config.security) as ps:
            committed = dict(zip(config.ps, ps.shard_committed_iterations(), strict=True))
            _check_cluster(job, len(batches), status, committed)
            _create_tables(ps, job)
        start = int(status.next_batch_iteration)
        if not status.finished:
            log.info("submitting batches %d..%d of %d", start, len(batches) - 1, len(batches))
            submit_batches(
                stub, batches.iter_from(start), start=start, patience=timeout, timeout=timeout,
                on_submitted=lambda t: metrics.submitted.set(t + 1),
            )  # fmt: skip
        metrics.submitted.set(len(batches))
        _wait_committed(stub, len(batches) - 1, timeout, metrics)
    log.info("all %d iterations committed", len(batches))


def _load_job(path: str) -> tuple[TrainingJob, Schedule | None]:
    """A ``job.json``, or a job file (``heraldps.job_file``): its train split, the rows
    before those ``valid_fraction`` and ``test_fraction`` hold out, as ``heraldps train``
    trains it, and the file's schedule (None for a ``job.json``: file order)."""
    from heraldps import job_file

    raw = job_file.read(path)
    if not job_file.is_job_file(raw):
        return TrainingJob.load(path), None
    jf = job_file.from_dict(raw, Path(path))
    return job_file.training_split(jf), jf.schedule


def job_batches(
    job: TrainingJob, schedule: Schedule | None = None
) -> StreamedBatches | ShuffledEpochs:
    """The job's global batches, streamed; its rows are counted (parsed, not keyed) unless
    the job records them (``heraldps local`` and ``heraldps train`` write ``train_rows``).
    A job file's streaming shuffle (``shuffle_buffer_rows`` > 0) gives ``heraldps
    train``'s order, epoch by epoch; its in-memory shuffle is ``heraldps train``'s alone
    (the feeder holds no split in memory): file order, said in the log."""
    spec = job.data_spec()
    rows = job.train_rows
    if rows is None:
        from heraldps.data import count_rows

        log.info("counting the rows of %s (parsed only; the job has no train_rows)", job.data)
        rows = count_rows(spec)
    if schedule is not None and schedule.shuffle:
        if schedule.shuffle_buffer_rows:
            spill = Path(tempfile.gettempdir())
            log.info("streaming shuffle: buffer %d rows, seed %d, spill files in %s",
                     schedule.shuffle_buffer_rows, schedule.seed, spill)  # fmt: skip
            return ShuffledEpochs(spec, rows, job.global_batch, job.iterations, job.epochs,
                                  schedule.shuffle_buffer_rows, schedule.seed, spill)  # fmt: skip
        log.info("schedule.shuffle with shuffle_buffer_rows 0 is heraldps train's in-memory "
                 "shuffle; the feeder streams file order (set schedule.shuffle_buffer_rows "
                 "to shuffle as heraldps train does)")  # fmt: skip
    return StreamedBatches(spec, rows, job.global_batch, job.iterations, job.epochs)


def _check_cluster(
    job: TrainingJob,
    batches: int,
    status: scheduler_pb2.SchedulerStatus,
    shards_committed: dict[str, int],
) -> None:
    """Refuse a scheduler or shards that cannot train this job from where they are."""
    if status.num_workers != job.workers:
        raise FeedError(
            f"the scheduler plans for {status.num_workers} workers but the job has "
            f"{job.workers}: start the scheduler with --workers {job.workers} "
            f"(HERALDPS_WORKERS={job.workers})"
        )
    if status.next_batch_iteration > batches:
        raise FeedError(
            f"the scheduler already has batches up to iteration "
            f"{status.next_batch_iteration - 1}, but this job has {batches}: it is running "
            "another job; restart it"
        )
    fresh = status.committed_iteration < 0 and status.next_batch_iteration == 0
    trained = {a: c for a, c in shards_committed.items() if c >= 0}
    if fresh and not status.finished and trained:
        listed = ", ".join(f"{a} at iteration {c}" for a, c in trained.items())
        raise FeedError(
            f"the scheduler has not seen a batch, but PS shards already committed ({listed}): "
            "they hold a model of an earlier run. Start the shards empty (a fresh --data-dir "
            "for cached shards; compose: `docker compose -f deploy/docker-compose.yml down -v`)"
        )


def _create_tables(ps: PSClient, job: TrainingJob) -> None:
    """The job's tables, as ``heraldps local`` creates them; an existing same spec is fine."""
    try:
        job.create_tables(ps)
    except AlreadyExists as err:
        raise FeedError(
            f"the PS already has a table of this name with another spec ({err.message}): "
            "these shards hold another job's tables; start them empty"
        ) from None
    except Aborted:
        # The dense rows' initial values are written only while the rows are untouched
        # (version 0): a VersionConflict means this run already trained them. Keep them.
        log.info("dense rows already trained by this run; tables kept as they are")


def _wait_committed(
    stub: scheduler_pb2_grpc.SchedulerStub, last: int, patience: float, metrics: FeedMetrics
) -> None:
    """Poll GetStatus until ``last`` is committed; FeedError after ``patience`` s stalled."""
    seen, since, logged = -2, time.monotonic(), 0.0
    while True:
        status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=patience)
        now = time.monotonic()
        if status.committed_iteration != seen:
            seen, since = int(status.committed_iteration), now
            metrics.committed.set(seen)
            if now - logged > 5 or seen >= last:
                log.info("committed iteration %d of %d", seen, last)
                logged = now
        if status.finished and seen >= last:
            return
        if now - since > patience:
            registered = ", ".join(str(w) for w in status.registered_workers) or "none"
            raise FeedError(
                f"no iteration committed for {patience:g} s (last committed {seen} of {last}; "
                f"registered workers: {registered} of {status.num_workers}): is every worker "
                "running? see their logs"
            )
        time.sleep(0.1)
