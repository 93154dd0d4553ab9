"""A run that cannot go on ends clearly: a real scheduler on real PS shards answers ABORTED
with the reason (a failed commit, a silent worker) to every later call, never INTERNAL."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps import wire
from heraldps.optim import SGD
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from ps_server.server import PSServer
from scheduler_service.checkpointer import CheckpointConfig
from scheduler_service.server import ABORT_EXIT_SECONDS, SchedulerConfig, SchedulerServer
from tests.conftest import ClusterFactory

WORKERS = 3


@contextlib.contextmanager
def scheduler_on_shards(
    cluster: ClusterFactory, worker_timeout: float = 0.0, **config_fields: object
) -> Iterator[tuple[SchedulerServer, scheduler_pb2_grpc.SchedulerStub, list[PSServer]]]:
    servers, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    config = SchedulerConfig(workers=WORKERS, cache_rows=40, mode="herald",
                             ps=tuple(ps.addresses), host="127.0.0.1", port=0, max_backlog=4,
                             grace_seconds=1, worker_timeout=worker_timeout,
                             **config_fields)  # type: ignore[arg-type]  # fmt: skip
    server = SchedulerServer(config)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield server, scheduler_pb2_grpc.SchedulerStub(channel), servers
    finally:
        channel.close()
        server.stop(grace=0)


def submit(stub: scheduler_pb2_grpc.SchedulerStub, iteration: int) -> None:
    rng = np.random.default_rng(iteration)
    lens = rng.integers(1, 4, WORKERS * 4)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    stub.SubmitBatch(
        scheduler_pb2.SubmitBatchRequest(
            iteration=iteration, offsets=wire.encode_keys(offsets),
            keys=wire.encode_keys(rng.integers(0, 30, int(offsets[-1]))), table="emb",
        ),
        timeout=10,
    )  # fmt: skip


def start_iteration_0(stub: scheduler_pb2_grpc.SchedulerStub) -> None:
    """Every worker registered and holding its plan of iteration 0."""
    for w in range(WORKERS):
        stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=w), timeout=10)
    for t in range(2):  # the second batch releases the first's plans
        submit(stub, t)
    for w in range(WORKERS):
        stream = stub.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=w), timeout=10)
        assert next(stream).iteration == 0
        stream.cancel()


def report(stub: scheduler_pb2_grpc.SchedulerStub, worker: int, iteration: int = 0) -> bool:
    request = scheduler_pb2.ReportDoneRequest(worker_id=worker, iteration=iteration)
    return bool(stub.ReportDone(request, timeout=30).committed)


def assert_aborted(call: Callable[[], object], *texts: str) -> None:
    """``call`` (a stream is read to its end) fails with ABORTED, its details naming ``texts``."""
    with pytest.raises(grpc.RpcError) as caught:
        result = call()
        if isinstance(result, Iterator):
            list(result)
    assert caught.value.code() == grpc.StatusCode.ABORTED, caught.value.details()
    for text in texts:
        assert text in caught.value.details(), caught.value.details()


def test_a_failed_commit_aborts_the_run_instead_of_wedging_it(cluster: ClusterFactory) -> None:
    with scheduler_on_shards(cluster) as (server, stub, shards):
        start_iteration_0(stub)
        assert server.metrics.registry.get_sample_value("heraldps_scheduler_run_aborted") == 0
        assert not report(stub, 0) and not report(stub, 1)
        dead = shards[1]
        dead.stop(grace=0)  # the commit's PS shard is gone
        address = f"127.0.0.1:{dead.port}"
        reason = f"committing iteration 0 on the PS failed ({address}): UNAVAILABLE"
        # The last report triggers the commit: its retries fail, the run is aborted...
        assert_aborted(lambda: report(stub, 2), reason, "the run is aborted")
        # ... and every later call says so, with the PS's error, instead of INTERNAL.
        assert_aborted(lambda: report(stub, 2), reason)
        assert_aborted(lambda: stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=5), reason)
        watch = scheduler_pb2.WatchPlansRequest(worker_id=0)
        assert_aborted(lambda: stub.WatchPlans(watch, timeout=5), reason)
        assert_aborted(lambda: submit(stub, 2), reason)
        sample = server.metrics.registry.get_sample_value
        assert sample("heraldps_scheduler_run_aborted") == 1


def test_a_silent_worker_aborts_the_run_within_the_timeout(cluster: ClusterFactory) -> None:
    timeout = 1.0
    with scheduler_on_shards(cluster, worker_timeout=timeout) as (_, stub, _shards):
        start_iteration_0(stub)  # worker 2 is the last to receive its plan: its clock starts
        began = time.monotonic()
        assert not report(stub, 0) and not report(stub, 1)
        # A worker waiting for its next plan hears of the abort at once.
        outcome: list[grpc.RpcError] = []

        def watch() -> None:
            request = scheduler_pb2.WatchPlansRequest(worker_id=0)
            try:
                list(stub.WatchPlans(request, timeout=30))
            except grpc.RpcError as err:
                outcome.append(err)

        waiter = threading.Thread(target=watch)
        waiter.start()
        # Within the timeout the run goes on: a slow worker is not a silent one.
        time.sleep(timeout / 2)
        assert stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=5).committed_iteration == -1
        waiter.join(timeout=10)
        took = time.monotonic() - began
        assert outcome and outcome[0].code() == grpc.StatusCode.ABORTED
        reason = "worker 2 has not reported iteration 0 within 1 s (--worker-timeout)"
        assert reason in outcome[0].details()
        assert timeout - 0.1 < took < timeout + 2, took  # checked every quarter timeout
        assert_aborted(lambda: stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=5), reason)
        assert_aborted(lambda: report(stub, 2), reason)  # the late report is refused too


def test_an_aborted_scheduler_that_can_resume_exits_so_its_supervisor_restarts_it(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    """With --resume-from, an aborted run ends the scheduler (exit 1) after answering ABORTED
    for a few seconds, so a Kubernetes Deployment starts it again and it resumes from the
    newest checkpoint; without it (the test above) the scheduler keeps answering."""
    checkpoints = CheckpointConfig(resume_from=str(tmp_path))  # empty: a fresh run
    with scheduler_on_shards(cluster, worker_timeout=1.0, checkpoints=checkpoints) as (
        server, stub, _shards,
    ):  # fmt: skip
        start_iteration_0(stub)
        began = time.monotonic()
        stopped = threading.Thread(target=server.wait)
        stopped.start()
        stopped.join(timeout=1.0 + ABORT_EXIT_SECONDS + 10)
        assert not stopped.is_alive(), "the aborted scheduler did not exit"
        assert server.exit_code == 1
        assert time.monotonic() - began >= 1.0 + ABORT_EXIT_SECONDS - 0.5
