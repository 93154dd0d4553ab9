"""Session takeover (issue 23, section 3): with tokens on, a worker id held by a live
session cannot be registered again, by the worker token, until that session ends (its
process dies, or it stays silent past the liveness timeout); an admin may force it.

A real scheduler server with tokens; the real worker 1 is a separate process that holds
its plan stream and reports every plan it gets."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from heraldps import wire
from heraldps.auth import SESSION_METADATA_KEY
from heraldps.security import ClientSecurity, ServerSecurity, open_channel
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.server import SchedulerServer
from tests.integration.test_security import scheduler as security_scheduler

ADMIN_TOKEN = "admin-" + "a" * 32
WORKER_TOKEN = "worker-" + "w" * 32

# The real worker 1: registers, writes its session to a file, reports every plan it gets.
HOLDER = """
import sys, grpc
from heraldps.auth import SESSION_METADATA_KEY
from heraldps.security import ClientSecurity, open_channel
from heraldps.v1 import scheduler_pb2 as pb, scheduler_pb2_grpc as rpc
address, token, out = sys.argv[1:4]
stub = rpc.SchedulerStub(open_channel(address, (), ClientSecurity(token=token)))
_, call = stub.RegisterWorker.with_call(pb.RegisterWorkerRequest(worker_id=1))
session = ((SESSION_METADATA_KEY, dict(call.trailing_metadata())[SESSION_METADATA_KEY]),)
for plan in stub.WatchPlans(pb.WatchPlansRequest(worker_id=1), metadata=session):
    stub.ReportDone(pb.ReportDoneRequest(worker_id=1, iteration=plan.iteration),
                    metadata=session)
    open(out, "a").write(f"{plan.iteration}\\n")
"""


@contextlib.contextmanager
def scheduler(tmp_path: Path, worker_timeout: float = 60.0) -> Iterator[SchedulerServer]:
    admin, worker = tmp_path / "admin.token", tmp_path / "worker.token"
    admin.write_text(ADMIN_TOKEN)
    worker.write_text(WORKER_TOKEN)
    security = ServerSecurity(admin_token_file=str(admin), worker_token_file=str(worker))
    with security_scheduler(security, worker_timeout=worker_timeout) as server:
        yield server


def stub(server: SchedulerServer, token: str) -> scheduler_pb2_grpc.SchedulerStub:
    channel = open_channel(f"127.0.0.1:{server.port}", (), ClientSecurity(token=token))
    return scheduler_pb2_grpc.SchedulerStub(channel)


def register(
    caller: scheduler_pb2_grpc.SchedulerStub, worker: int, take_over: bool = False
) -> tuple[tuple[str, str], ...]:
    request = scheduler_pb2.RegisterWorkerRequest(worker_id=worker)
    if take_over:
        request.take_over = True
    _, call = caller.RegisterWorker.with_call(request, timeout=10)
    return ((SESSION_METADATA_KEY, dict(call.trailing_metadata())[SESSION_METADATA_KEY]),)


def refused(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code(), err.value.details() or ""


def submit(admin: scheduler_pb2_grpc.SchedulerStub, iteration: int) -> None:
    offsets = wire.encode_keys(wire.np.array([0, 1, 2, 3, 4], dtype=wire.np.int64))
    keys = wire.encode_keys(wire.np.array([1, 2, 3, 4], dtype=wire.np.int64))
    request = scheduler_pb2.SubmitBatchRequest(iteration=iteration, offsets=offsets, keys=keys)
    admin.SubmitBatch(request, timeout=10)


def start_holder(server: SchedulerServer, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    done = tmp_path / "holder.done"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, f"127.0.0.1:{server.port}", WORKER_TOKEN, str(done)]
    )
    status = scheduler_pb2.GetStatusRequest()
    admin = stub(server, ADMIN_TOKEN)
    deadline = time.monotonic() + 60
    while 1 not in admin.GetStatus(status).registered_workers:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # its plan stream is open
    return proc, done


def test_a_live_worker_session_cannot_be_taken_over(tmp_path: Path) -> None:
    with scheduler(tmp_path) as server:
        holder, done = start_holder(server, tmp_path)
        try:
            intruder = stub(server, WORKER_TOKEN)  # holds worker 0's place
            admin = stub(server, ADMIN_TOKEN)
            mine = register(intruder, 0)
            # The attack: register worker 1 again with the worker token.
            code, text = refused(lambda: register(intruder, 1))
            assert code == grpc.StatusCode.ALREADY_EXISTS, text
            assert "worker 1" in text and "take_over" in text
            # Forcing needs the admin role.
            code, text = refused(lambda: register(intruder, 1, take_over=True))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in text
            # The real worker 1 still trains: iteration 0 completes with its report.
            submit(admin, 0)
            admin.Finish(scheduler_pb2.FinishRequest(), timeout=10)
            plans = intruder.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=0), metadata=mine)
            plan = next(iter(plans))
            report = scheduler_pb2.ReportDoneRequest(worker_id=0, iteration=plan.iteration)
            intruder.ReportDone(report, metadata=mine, timeout=10)
            forged = scheduler_pb2.ReportDoneRequest(worker_id=1, iteration=plan.iteration)
            code, _ = refused(lambda: intruder.ReportDone(forged, metadata=mine, timeout=10))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert holder.wait(timeout=60) == 0
            assert done.read_text().split() == ["0"]
            status = admin.GetStatus(scheduler_pb2.GetStatusRequest())
            assert status.committed_iteration == 0
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()


def test_a_dead_workers_session_frees_its_id_and_an_admin_may_force(tmp_path: Path) -> None:
    with scheduler(tmp_path) as server:
        holder, _ = start_holder(server, tmp_path)
        intruder = stub(server, WORKER_TOKEN)
        admin = stub(server, ADMIN_TOKEN)
        assert refused(lambda: register(intruder, 1))[0] == grpc.StatusCode.ALREADY_EXISTS
        holder.send_signal(signal.SIGKILL)  # its plan stream ends with the process
        holder.wait()
        deadline = time.monotonic() + 10
        while True:  # the scheduler notices the lost stream within a poll (0.5 s)
            try:
                restarted = register(intruder, 1)
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.ALREADY_EXISTS
                assert time.monotonic() < deadline, "a dead worker's id stayed held"
                time.sleep(0.1)
        # Registered but silent (no stream yet): live; the admin may still force it.
        assert refused(lambda: register(intruder, 1))[0] == grpc.StatusCode.ALREADY_EXISTS
        forced = register(admin, 1, take_over=True)
        assert forced != restarted
        stale = scheduler_pb2.ReportDoneRequest(worker_id=1, iteration=0)
        code, _ = refused(lambda: intruder.ReportDone(stale, metadata=restarted, timeout=10))
        assert code == grpc.StatusCode.PERMISSION_DENIED  # the forced-out session is dead


def test_a_silent_session_expires_after_the_worker_timeout(tmp_path: Path) -> None:
    with scheduler(tmp_path, worker_timeout=1.0) as server:
        intruder = stub(server, WORKER_TOKEN)
        first = register(intruder, 1)
        assert refused(lambda: register(intruder, 1))[0] == grpc.StatusCode.ALREADY_EXISTS
        time.sleep(1.5)  # no stream, no call: the session is over
        assert register(intruder, 1) != first
