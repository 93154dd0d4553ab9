"""gRPC servicer of heraldps.v1.Scheduler: wire <-> the barrier and scheduler core."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import grpc

from heraldps import wire
from heraldps.auth import ADMIN, SESSION_METADATA_KEY, Tokens, caller_role
from heraldps.errors import (
    DeadlineExceeded,
    InvalidArgument,
    PermissionDenied,
    Unavailable,
    shown,
)
from heraldps.optim import lr_scale_of
from heraldps.plan import CommPlan, plan_to_proto
from heraldps.samples import decode_samples
from heraldps.status import stream_handler, unary_handler
from heraldps.traffic import Traffic
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.barrier import Barrier
from scheduler_service.batch import Batch
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.sessions import WorkerSessions
from scheduler_service.shadow import NaiveShadow

log = logging.getLogger(__name__)

WATCH_POLL_SECONDS = 0.5
MAX_ADDRESS_CHARS = 255
MAX_LIST_WAIT_SECONDS = 60.0


def _is_host_port(address: str) -> bool:
    """``host:port`` with a port in 1..65535 (IPv6 hosts in brackets)."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self,
        barrier: Barrier,
        metrics: SchedulerMetrics,
        table: str,
        stopping: threading.Event,
        shadow: NaiveShadow | None = None,
        compress_plans: bool = False,
        tokens: Tokens | None = None,
        session_expiry: float = 60.0,
    ) -> None:
        """``tokens``: the server's tokens; when on, refuse plans and reports without the
        worker's session, and a second registration of a live worker id."""
        self.barrier = barrier
        self.tokens = tokens or Tokens()
        self.sessions = WorkerSessions(self.tokens.enabled, session_expiry)
        self.metrics = metrics
        self.table = table
        self.stopping = stopping
        self.shadow = shadow
        self.compress_plans = compress_plans
        self.reported = Traffic()  # every report so far, summed
        self._waiting_since: dict[int, float] = {}  # worker -> when it last reported/registered
        self._reported_lock = threading.Lock()

    def record_rpc(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        self.metrics.requests.labels(method, code.name).inc()
        self.metrics.latency.labels(method).observe(seconds)

    def _observe(self, plans: list[CommPlan]) -> None:
        m = self.metrics
        for plan in plans:
            m.planned_rows.labels(m.mode, "pull").inc(plan.pull.shape[0])
            m.planned_rows.labels(m.mode, "grad_push").inc(plan.push_grads.shape[0])
            m.planned_rows.labels(m.mode, "write_back").inc(plan.write_back.shape[0])
            trained = plan.update_local.shape[0] + plan.push_grads.shape[0]
            if trained:
                m.hit_ratio.labels(str(plan.worker)).set(1 - plan.pull.shape[0] / trained)
        m.backlog.set(self.barrier.backlog)

    @unary_handler
    def RegisterWorker(
        self, request: scheduler_pb2.RegisterWorkerRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.RegisterWorkerResponse:
        address = request.collective_address
        if len(address) > MAX_ADDRESS_CHARS or (address and not _is_host_port(address)):
            raise InvalidArgument(
                f"collective_address must be host:port (at most {MAX_ADDRESS_CHARS} characters), "
                f"got {address[:80]!r}"
            )
        self.barrier.check_worker(request.worker_id)
        role = caller_role(self.tokens, context.invocation_metadata())
        if request.take_over and self.tokens.enabled and role != ADMIN:
            raise PermissionDenied(
                f"take_over of worker {request.worker_id} needs the admin role; a worker "
                "token may only register an id nobody holds"
            )
        session = self.sessions.issue(request.worker_id, request.take_over)
        self.barrier.register(request.worker_id, address)
        context.set_trailing_metadata(((SESSION_METADATA_KEY, session),))
        self._waiting_since[request.worker_id] = time.monotonic()
        self.metrics.registered.set(len(self.barrier.registered))
        self.metrics.start_worker(request.worker_id)
        log.info("worker %d registered", request.worker_id)
        s = self.barrier.scheduler
        return scheduler_pb2.RegisterWorkerResponse(
            num_workers=s.num_workers, mode=s.mode, cache_rows=s.capacity, table=self.table
        )

    @unary_handler
    def SubmitBatch(
        self, request: scheduler_pb2.SubmitBatchRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.SubmitBatchResponse:
        if request.table and request.table != self.table:
            raise InvalidArgument(
                f"this scheduler plans table {self.table!r}, not {shown(request.table)}"
            )
        batch = self._batch(request)
        started = time.perf_counter()
        released = self.barrier.submit(batch)
        self.metrics.plan_seconds.labels(self.metrics.mode).observe(time.perf_counter() - started)
        self._observe(released)
        if self.shadow is not None:  # after the barrier accepted it: same batches, in order
            self.shadow.submit(batch)
        return scheduler_pb2.SubmitBatchResponse(
            released_iteration=released[-1].iteration if released else -1
        )

    def _batch(self, request: scheduler_pb2.SubmitBatchRequest) -> Batch:
        """Keys only (``offsets``, ``keys``) or whole samples (``batch``), not both."""
        workers = self.barrier.num_workers
        lr_scale, checkpoint = lr_scale_of(request.lr_scale), request.checkpoint
        flush = request.flush or checkpoint
        if not request.HasField("batch"):
            offsets = wire.decode_keys(request.offsets, "offsets")
            keys = wire.decode_keys(request.keys, "keys")
            return Batch(request.iteration, offsets, keys, workers, None, lr_scale, flush,
                         checkpoint)  # fmt: skip
        if request.offsets or request.keys:
            raise InvalidArgument(
                "send the batch either as offsets and keys or as whole samples in `batch`, not both"
            )
        samples = decode_samples(request.batch, "batch")
        return Batch.of_samples(request.iteration, samples, workers, lr_scale, flush, checkpoint)

    @unary_handler
    def Finish(
        self, request: scheduler_pb2.FinishRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.FinishResponse:
        self._observe(self.barrier.finish())
        if self.shadow is not None:
            self.shadow.finish()
        self.metrics.final_flush.set(self.barrier.final_flush)
        self.metrics.finished.set(1)
        return scheduler_pb2.FinishResponse(final_flush=self.barrier.final_flush)

    @stream_handler
    def WatchPlans(
        self, request: scheduler_pb2.WatchPlansRequest, context: grpc.ServicerContext
    ) -> Iterator[scheduler_pb2.CommPlan]:
        worker = request.worker_id
        session = self.sessions.check(worker, context.invocation_metadata())
        if self.compress_plans:
            context.set_compression(grpc.Compression.Gzip)
        self.sessions.stream_opened(worker, session)
        lost = True  # unless the stream ends with the plans
        try:
            yield from self._plans_of(worker, context)
            lost = not context.is_active()
        finally:
            self.sessions.stream_closed(worker, session, lost)

    def _plans_of(
        self, worker: int, context: grpc.ServicerContext
    ) -> Iterator[scheduler_pb2.CommPlan]:
        iteration: int | None = None  # the iteration in progress, once batches arrive
        while context.is_active() and not self.stopping.is_set():
            plan = self.barrier.next_plan(worker, iteration, WATCH_POLL_SECONDS)
            if plan is None:
                if self.barrier.is_over(iteration):
                    return
                continue
            since = self._waiting_since.pop(worker, None)
            if since is not None:
                self.metrics.plan_wait.labels(str(worker)).observe(time.monotonic() - since)
            yield plan_to_proto(plan, self.table)
            if plan.final_flush:
                return
            iteration = plan.iteration + 1

    @unary_handler
    def ReportDone(
        self, request: scheduler_pb2.ReportDoneRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.ReportDoneResponse:
        self.sessions.check(request.worker_id, context.invocation_metadata())
        committed = self.barrier.report_done(
            request.worker_id, request.iteration, request.loss_sum, request.samples
        )
        if not request.wait_for_commit:  # its barrier wait ends when its next plan leaves
            self._waiting_since[request.worker_id] = time.monotonic()
        m, c, worker = self.metrics, request.counters, str(request.worker_id)
        with self._reported_lock:
            self.reported.add(Traffic.from_proto(c))
        m.reported_rows.labels(m.mode, worker, "pull").inc(c.pulled_rows)
        m.reported_rows.labels(m.mode, worker, "grad_push").inc(c.pushed_gradient_rows)
        m.reported_rows.labels(m.mode, worker, "write_back").inc(c.written_back_rows)
        m.reported_rows.labels(m.mode, worker, "final_flush").inc(c.final_flush_rows)
        m.reported_rows.labels(m.mode, worker, "version_check").inc(c.version_checks)
        if committed:
            m.commits.inc()
            m.last_commit.set_to_current_time()
            m.committed.set(request.iteration)
            m.backlog.set(self.barrier.backlog)
        waited = 0.0
        if request.wait_for_commit:  # herald_pipelined: the barrier wait is this call's
            began = time.monotonic()
            if not committed:
                self._wait_committed(request.iteration, context)
            waited = time.monotonic() - began
            m.plan_wait.labels(worker).observe(waited)
        return scheduler_pb2.ReportDoneResponse(committed=committed, commit_wait_seconds=waited)

    def _wait_committed(self, iteration: int, context: grpc.ServicerContext) -> None:
        """Hold a report until its iteration is committed (``wait_for_commit``)."""
        while not self.barrier.wait_committed(iteration, WATCH_POLL_SECONDS):
            if self.stopping.is_set():
                raise Unavailable(
                    f"the scheduler is stopping before iteration {iteration} was committed"
                )
            if not context.is_active():
                raise DeadlineExceeded(
                    f"iteration {iteration} was not committed before the report's deadline: "
                    "some worker has not reported it; see the workers' logs"
                )

    @unary_handler
    def ListWorkers(
        self, request: scheduler_pb2.ListWorkersRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.ListWorkersResponse:
        wait = request.wait_seconds
        if not 0 <= wait <= MAX_LIST_WAIT_SECONDS:  # also refuses NaN
            raise InvalidArgument(
                f"wait_seconds must be in [0, {MAX_LIST_WAIT_SECONDS:g}], got {wait}"
            )
        addresses = self.barrier.collective_addresses(wait)
        return scheduler_pb2.ListWorkersResponse(collective_addresses=addresses)

    @unary_handler
    def GetStatus(
        self, request: scheduler_pb2.GetStatusRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.SchedulerStatus:
        b = self.barrier
        b.check_running()  # an aborted run answers ABORTED, with why
        next_batch = b.scheduler.next_iteration
        return scheduler_pb2.SchedulerStatus(
            num_workers=b.num_workers,
            registered_workers=sorted(b.registered),
            committed_iteration=b.committed,
            next_batch_iteration=0 if next_batch is None else next_batch,
            backlog=b.backlog,
            finished=b.finished,
            reported=self.reported.to_proto(),
            last_loss=b.last_loss,
            committed_loss_sum=b.loss_sum_committed,
            committed_samples=b.loss_samples_committed,
        )
