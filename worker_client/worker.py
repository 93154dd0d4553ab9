"""The worker process: register, follow the plan stream, train, report.

``heraldps worker --job JOB.json --worker-id W --scheduler ADDR --ps A,B``
reads the job (model, optimizer, cache policy), learns its mode and cache
size from the scheduler, picks its step once (:func:`make_step`: Herald plan
execution or HET) and runs it on every plan it receives. The samples arrive
inside the plans: a worker never opens a data file. Every iteration ends with
``ReportDone`` carrying the rows it moved; the scheduler commits once all
workers reported (in mode ``herald_pipelined`` the worker reads its plans
ahead and waits in ``ReportDone`` for the commit: :mod:`worker_client.pipeline`).
A failed RPC (scheduler or shard unreachable after the
client's retries) or a plan that contradicts the cache ends the process with
a message and exit code 1, never a hang: every call has a deadline, and the
plan stream (which has none) pings the scheduler, so a frozen one ends it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from heraldps.auth import SESSION_METADATA_KEY
from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition, HeraldError, Unavailable, error_from_rpc
from heraldps.job import EMBEDDING_TABLE, TrainingJob
from heraldps.modes import mode_named
from heraldps.security import ClientSecurity, ServerSecurity, open_channel
from heraldps.serving import channel_options, keepalive_options
from heraldps.tls import TlsFiles
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from worker_client.collective import (
    DENSE_STREAM,
    STATISTICS_STREAM,
    AllReduce,
    BatchSums,
    Mailbox,
    serve_collective,
)
from worker_client.dense_sync import AllReduceDense, DenseSync
from worker_client.device import array_module
from worker_client.het_step import HETStep
from worker_client.metrics import WorkerMetrics
from worker_client.pipeline import PipelinedPlanStep, PlanFeed
from worker_client.plan_step import PlanStep
from worker_client.step import Step

log = logging.getLogger(__name__)

ALLREDUCE_MESSAGE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class WorkerConfig:
    job: str
    worker_id: int
    scheduler: str
    ps: tuple[str, ...]
    report: str | None = None
    timeout_seconds: float = 120.0
    prefetch: str | None = None  # keyset file loaded into the PS caches before training
    metrics_port: int | None = None  # serve Prometheus /metrics here (0: a free port)
    advertise_host: str = "127.0.0.1"  # where the other workers reach this one's all-reduce
    collective_port: int = 0  # the all-reduce server's port (0: a free one)
    # TLS files and token presented to the scheduler, the shards and the other workers.
    security: ClientSecurity = field(default_factory=ClientSecurity)

    @property
    def bind_host(self) -> str:
        """Where this worker's own servers (all-reduce, /metrics) listen: loopback for a
        loopback advertise address, all interfaces otherwise."""
        return "127.0.0.1" if self.advertise_host in ("127.0.0.1", "localhost") else "0.0.0.0"

    def collective_security(self) -> tuple[ServerSecurity, ClientSecurity]:
        """The all-reduce server's security and its peers': TLS when this worker has a
        certificate, and the worker's own token required of the peers."""
        tls = self.security.tls if self.security.tls.cert else TlsFiles()
        token = self.security.token_file
        return ServerSecurity(tls, admin_token_file=token), ClientSecurity(tls, token)


def make_step(
    mode: str,
    job: TrainingJob,
    worker: int,
    ps: PSClient,
    cache_rows: int,
    xp: Any = np,
    dense: DenseSync | None = None,
) -> Step:
    """The step of a scheduler mode, chosen once: HET's clocks for a HET mode, plan
    execution with early pulls for a mode with early pulls, else plan execution."""
    fields = mode_named(mode)
    if fields.het:
        return HETStep(job, worker, ps, cache_rows, xp, dense)
    if fields.early_pulls:
        return PipelinedPlanStep(job, worker, ps, cache_rows, xp, dense)
    return PlanStep(job, worker, ps, cache_rows, xp, dense)


class DenseAllReduceSetup:
    """The all-reduce server a worker starts before it registers, and the sync built on it."""

    def __init__(self, config: WorkerConfig, job: TrainingJob) -> None:
        model = job.model()
        self.param = job.dense_parameter(model.dense_size)
        self.mailbox = Mailbox(config.worker_id, job.workers, self.param.size)
        mailboxes = {DENSE_STREAM: self.mailbox}
        # Batch norm: its statistics' all-reduce, sized for the model's largest reduction.
        self.statistics_size, self.reductions = model.max_reduction, model.reductions_per_step
        if self.reductions:
            mailboxes[STATISTICS_STREAM] = Mailbox(config.worker_id, job.workers,
                                                   self.statistics_size)  # fmt: skip
        self.mailboxes = mailboxes
        server_security, self.peer_security = config.collective_security()
        self.server, port = serve_collective(mailboxes, config.bind_host,
                                             config.collective_port, ALLREDUCE_MESSAGE_BYTES,
                                             server_security)  # fmt: skip
        self.address = f"{config.advertise_host}:{port}"

    def connect(
        self,
        scheduler: scheduler_pb2_grpc.SchedulerStub,
        config: WorkerConfig,
        job: TrainingJob,
        ps: PSClient,
    ) -> AllReduceDense:
        """Learn every worker's address from the scheduler (all registered), then connect."""
        deadline = time.monotonic() + config.timeout_seconds
        while True:
            wait = min(10.0, max(0.0, deadline - time.monotonic()))
            try:
                reply = scheduler.ListWorkers(
                    scheduler_pb2.ListWorkersRequest(wait_seconds=wait), timeout=wait + 10
                )
                break
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                    raise
        peers = list(reply.collective_addresses)
        all_reduce = AllReduce(config.worker_id, peers, self.param.size, self.mailbox,
                               config.timeout_seconds, ALLREDUCE_MESSAGE_BYTES,
                               self.peer_security)  # fmt: skip
        batch_sums = None
        if self.reductions:
            statistics = AllReduce(config.worker_id, peers, self.statistics_size,
                                   self.mailboxes[STATISTICS_STREAM], config.timeout_seconds,
                                   ALLREDUCE_MESSAGE_BYTES, self.peer_security,
                                   stream=STATISTICS_STREAM, exchange=True)  # fmt: skip
            batch_sums = BatchSums(statistics, self.reductions)
        return AllReduceDense(ps, self.param, job.dense_optimizer(), all_reduce,
                              job.dense_checkpoint_every, batch_sums)  # fmt: skip

    def stop(self) -> None:
        self.server.stop(grace=1.0)


def scheduler_options(config: WorkerConfig) -> list[tuple[str, int]]:
    """The scheduler channel's options: large plans, and keepalive pings, so a frozen
    scheduler fails the plan stream (which has no deadline) within about half of
    ``--timeout-seconds`` instead of leaving the worker waiting forever."""
    return channel_options(64 * 2**20) + keepalive_options(config.timeout_seconds / 4)


def run_worker(config: WorkerConfig) -> int:
    """Train until the plan stream ends; 0 on success, 1 with a logged reason otherwise."""
    job = TrainingJob.load(config.job)
    xp = array_module(job.device)
    channel = open_channel(config.scheduler, scheduler_options(config), config.security)
    scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
    ps = PSClient(list(config.ps), timeout=config.timeout_seconds, security=config.security)
    history: list[dict[str, object]] = []
    w = config.worker_id
    metrics = WorkerMetrics()
    if config.metrics_port is not None:
        port = metrics.serve(config.metrics_port, config.bind_host)
        log.info("worker %d: metrics on port %d", w, port)
    collective = DenseAllReduceSetup(config, job) if job.dense_sync == "allreduce" else None
    dense: DenseSync | None = None
    try:
        reply, call = scheduler.RegisterWorker.with_call(
            scheduler_pb2.RegisterWorkerRequest(
                worker_id=w, collective_address=collective.address if collective else ""
            ),
            timeout=config.timeout_seconds,
        )
        # Our session: WatchPlans and ReportDone carry it (scheduler_service.sessions).
        session = tuple(
            (k, v) for k, v in call.trailing_metadata() or () if k == SESSION_METADATA_KEY
        )
        if reply.num_workers != job.workers:
            raise FailedPrecondition(
                f"the scheduler runs {reply.num_workers} workers but the job says {job.workers}"
            )
        if collective is not None:
            dense = collective.connect(scheduler, config, job, ps)
            log.info("worker %d: dense all-reduce via %s", w, collective.address)
        step = make_step(reply.mode, job, w, ps, int(reply.cache_rows), xp, dense)
        metrics.bind(w, reply.mode, job.staleness, int(reply.cache_rows), job.row_bytes(reply.mode))
        if config.prefetch:
            cached = ps.prefetch_keyset(EMBEDDING_TABLE, config.prefetch)
            log.info("worker %d: prefetched %d rows of %s", w, cached, config.prefetch)
        log.info("worker %d: mode %s, cache %d rows", w, reply.mode, reply.cache_rows)
        dense_bytes = step.dense.bytes_moved
        stream = scheduler.WatchPlans(
            scheduler_pb2.WatchPlansRequest(worker_id=w), metadata=session
        )
        pipelined = isinstance(step, PipelinedPlanStep)
        feed = PlanFeed(stream, read_ahead=pipelined)
        if isinstance(step, PipelinedPlanStep):
            step.follow(feed.held)
        waiting = time.perf_counter()
        for received in feed:
            started = time.perf_counter()
            step.timer.add("plan_wait", started - waiting)
            plan = received.plan
            traffic, loss = step.run(plan)
            traffic.sample_bytes = received.sample_bytes
            traffic.dense_bytes = step.dense.bytes_moved - dense_bytes
            dense_bytes = step.dense.bytes_moved
            samples = int(plan.samples.shape[0])
            reporting = time.perf_counter()
            answer = scheduler.ReportDone(
                scheduler_pb2.ReportDoneRequest(
                    worker_id=w,
                    iteration=plan.iteration,
                    counters=traffic.to_proto(),
                    loss_sum=loss,
                    samples=samples,
                    wait_for_commit=pipelined,
                ),
                timeout=config.timeout_seconds,
                metadata=session,
            )
            waiting = time.perf_counter()
            # herald_pipelined waits for the commit inside ReportDone: barrier, not RPC.
            at_barrier = min(answer.commit_wait_seconds, waiting - reporting)
            step.timer.add("report", waiting - reporting - at_barrier)
            step.timer.add("plan_wait", at_barrier)
            seconds = waiting - started
            phases = step.timer.take()
            metrics.observe(plan.iteration, traffic, loss, samples, seconds, step.cache, phases)
            history.append(
                {
                    "iteration": plan.iteration,
                    "loss_sum": loss,
                    "samples": samples,
                    "seconds": seconds,
                    "phases": phases,
                    **traffic.as_dict(),
                }
            )
    except grpc.RpcError as err:  # the scheduler's stub
        log.error("worker %d: %s", w, _what(error_from_rpc(err, config.scheduler)))
        return 1
    except HeraldError as err:  # from a PS shard (PSClient) or the worker itself
        log.error("worker %d: %s", w, _what(err))
        return 1
    finally:
        if dense is not None:
            dense.close()
        if collective is not None:
            collective.stop()
        ps.close()
        channel.close()
        if config.report:
            Path(config.report).write_text(json.dumps({"worker": w, "iterations": history}))
    log.info("worker %d: done after %d iterations", w, len(history))
    return 0


def _what(err: HeraldError) -> str:
    """The log line of an error: for an RPC's, which server answered and the code."""
    if not err.address:
        return str(err)
    unreachable = " (unreachable)" if isinstance(err, Unavailable) else ""
    return f"an RPC to {err.address}{unreachable} failed: {err.code.name} {err.message}"
