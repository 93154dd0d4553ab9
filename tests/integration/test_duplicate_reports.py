"""Concurrent duplicate ``ReportDone`` calls for the iteration that completes: exactly one
commit and one checkpoint, whatever arrives (issue 23, section 3). Real shards, a real
scheduler server, and each caller on its own gRPC channel."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import numpy as np

from heraldps import checkpoints
from heraldps.optim import SGD
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.checkpointer import CheckpointConfig
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests.conftest import ClusterFactory
from tests.integration.test_scheduler_service import CAPACITY, WORKERS, make_batches, submit

CALLERS = 16


def test_concurrent_duplicates_of_the_completing_report_commit_once(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    ps.pull("emb", np.arange(2000, dtype=np.int64))  # rows, so each checkpoint takes a while
    root = tmp_path / "ckpt"
    config = SchedulerConfig(
        workers=WORKERS, cache_rows=CAPACITY, mode="herald", ps=tuple(ps.addresses),
        host="127.0.0.1", port=0, metrics_port=0, max_backlog=2, grace_seconds=1,
        checkpoints=CheckpointConfig(every=1, directory=str(root), keep=5),
    )  # fmt: skip
    server = SchedulerServer(config)
    server.start()
    address = f"127.0.0.1:{server.port}"
    try:
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for w in range(WORKERS):
                stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=w))
            for batch in make_batches(2):
                submit(stub, batch)  # releases iteration 0's plans
            for w in range(WORKERS - 1):
                stub.ReportDone(scheduler_pb2.ReportDoneRequest(worker_id=w, iteration=0))
            last = WORKERS - 1
            start = threading.Barrier(CALLERS)
            codes: list[grpc.StatusCode] = []
            committed: list[bool] = []
            lock = threading.Lock()

            def report() -> None:
                with grpc.insecure_channel(address) as own:
                    caller = scheduler_pb2_grpc.SchedulerStub(own)
                    grpc.channel_ready_future(own).result(timeout=30)
                    request = scheduler_pb2.ReportDoneRequest(worker_id=last, iteration=0)
                    start.wait()
                    try:
                        answer = caller.ReportDone(request, timeout=60)
                        with lock:
                            codes.append(grpc.StatusCode.OK)
                            committed.append(answer.committed)
                    except grpc.RpcError as err:
                        with lock:
                            codes.append(err.code())

            threads = [threading.Thread(target=report) for _ in range(CALLERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
                assert not t.is_alive()
            assert grpc.StatusCode.INTERNAL not in codes, codes
            assert codes.count(grpc.StatusCode.OK) == 1, codes
            assert committed == [True]
            assert codes.count(grpc.StatusCode.ALREADY_EXISTS) == CALLERS - 1, codes
            # Once committed, a late duplicate is told so too, and changes nothing.
            late = scheduler_pb2.ReportDoneRequest(worker_id=last, iteration=0)
            try:
                stub.ReportDone(late, timeout=30)
                raise AssertionError("a late duplicate report was accepted")
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err
                assert "already" in (err.details() or "")
            status = stub.GetStatus(scheduler_pb2.GetStatusRequest())
            assert status.committed_iteration == 0
        assert ps.shard_committed_iterations() == [0, 0]
        assert server.metrics.commits._value.get() == 1
        found = checkpoints.complete(root)
        assert [m.iteration for _, m in found] == [0]
        entries = sorted(p.name for p in root.iterdir())
        assert len(entries) == 1, entries  # one folder, no partial second one
    finally:
        server.stop(grace=0)
