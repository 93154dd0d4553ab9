"""The worker process: register, follow the plan stream, train, report.

``heraldps worker --job JOB.json --worker-id W --scheduler ADDR --ps A,B``
reads the job (data, model, optimizer), cuts the same global batches as the
data feeder, and executes each plan it receives (Herald modes) or trains its
samples as a HET worker (mode ``het``). Every iteration ends with
``ReportDone`` carrying the rows it moved; the scheduler commits once all
workers reported. A failed RPC (scheduler or shard unreachable after the
client's retries) or a plan that contradicts the cache ends the process with
a message and exit code 1, never a hang: every call has a deadline.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from heraldps.client import PSClient
from heraldps.errors import HeraldError
from heraldps.serving import channel_options
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.servicer import plan_from_proto
from worker_client.device import array_module
from worker_client.job import EMBEDDING_TABLE, TrainingJob
from worker_client.metrics import WorkerMetrics
from worker_client.minibatch import global_batches
from worker_client.trainer import Traffic, WorkerTrainer

log = logging.getLogger(__name__)


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


def counters(traffic: Traffic) -> scheduler_pb2.TrafficCounters:
    return scheduler_pb2.TrafficCounters(
        pulled_rows=traffic.pulls,
        pushed_gradient_rows=traffic.grad_pushes,
        written_back_rows=traffic.write_backs,
        cache_hits=traffic.hits,
        final_flush_rows=traffic.final_flush,
        version_checks=traffic.version_checks,
    )


def run_worker(config: WorkerConfig) -> int:
    """Train until the plan stream ends; 0 on success, 1 with a logged reason otherwise."""
    job = TrainingJob.load(config.job)
    xp = array_module(job.device)
    dataset = job.read()
    batches = global_batches(dataset, job.global_batch, job.iterations, job.epochs)
    channel = grpc.insecure_channel(config.scheduler, options=channel_options(64 * 2**20))
    scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
    ps = PSClient(list(config.ps), timeout=config.timeout_seconds)
    history: list[dict[str, object]] = []
    w = config.worker_id
    metrics = WorkerMetrics()
    if config.metrics_port is not None:
        log.info("worker %d: metrics on port %d", w, metrics.serve(config.metrics_port))
    try:
        reply = scheduler.RegisterWorker(
            scheduler_pb2.RegisterWorkerRequest(worker_id=w), timeout=config.timeout_seconds
        )
        trainer = WorkerTrainer(job, dataset, w, ps, int(reply.cache_rows), xp)
        metrics.bind(w, reply.mode, job.staleness, int(reply.cache_rows), job.row_bytes())
        if config.prefetch:
            cached = ps.prefetch_keyset(EMBEDDING_TABLE, config.prefetch)
            log.info("worker %d: prefetched %d rows of %s", w, cached, config.prefetch)
        log.info("worker %d: mode %s, cache %d rows", w, reply.mode, reply.cache_rows)
        stream = scheduler.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=w))
        for message in stream:
            plan = plan_from_proto(message)
            if not 0 <= plan.iteration < len(batches):
                raise HeraldError(
                    f"plan for iteration {plan.iteration}, but the job has {len(batches)} batches"
                )
            started = time.perf_counter()
            batch = batches[plan.iteration]
            if reply.mode == "het":
                traffic, loss = trainer.run_het(
                    plan.iteration, plan.samples, batch, plan.final_flush
                )
            else:
                traffic, loss = trainer.run_plan(plan, batch)
            scheduler.ReportDone(
                scheduler_pb2.ReportDoneRequest(
                    worker_id=w,
                    iteration=plan.iteration,
                    counters=counters(traffic),
                    loss_sum=loss,
                    samples=int(plan.samples.shape[0]),
                ),
                timeout=config.timeout_seconds,
            )
            seconds = time.perf_counter() - started
            samples = int(plan.samples.shape[0])
            metrics.observe(plan.iteration, traffic, loss, samples, seconds, trainer.cache)
            history.append(
                {
                    "iteration": plan.iteration,
                    "loss_sum": loss,
                    "samples": samples,
                    "seconds": seconds,
                    **traffic.as_dict(),
                }
            )
    except grpc.RpcError as err:
        log.error("worker %d: %s failed: %s %s", w, _what(err), err.code().name, err.details())
        return 1
    except HeraldError as err:
        log.error("worker %d: %s", w, err)
        return 1
    finally:
        ps.close()
        channel.close()
        if config.report:
            Path(config.report).write_text(json.dumps({"worker": w, "iterations": history}))
    log.info("worker %d: done after %d iterations", w, len(history))
    return 0


def _what(err: grpc.RpcError) -> str:
    """Which side an RPC error came from, for the log line."""
    code = err.code() if hasattr(err, "code") else None
    if code == grpc.StatusCode.UNAVAILABLE:
        return "an RPC (scheduler or PS shard unreachable)"
    return "an RPC"
