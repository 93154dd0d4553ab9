"""A second scheduler must not roll back shards a live run trains (issue 23, section 1).

Real shards and a real scheduler (A) that trains and checkpoints; the second scheduler
is a ``heraldps scheduler`` process started with ``--resume-from`` against the same
shards. It must not load its checkpoint while A holds them: the shards keep A's commits
and A goes on. Only ``--force-takeover`` takes them, and then A's next commit is refused
(the run aborts, loudly) instead of landing on the rolled-back model."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from heraldps.optim import SGD
from heraldps.security import ServerSecurity
from heraldps.v1 import ps_pb2, scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.checkpointer import CheckpointConfig
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests import processes
from tests.conftest import ClusterFactory
from tests.integration.test_scheduler_resume import _train
from tests.integration.test_scheduler_service import CAPACITY, WORKERS, make_batches
from tests.integration.test_security import client, shard

LEASE = 3.0  # seconds: short, so a refused claim gives up quickly (after about one lease)


def _first(ps: PSClient, root: Path) -> SchedulerServer:
    """Scheduler A: checkpoints every 4 iterations, job-a."""
    checkpoint = CheckpointConfig(every=4, directory=str(root), resume_from=str(root),
                                  fingerprint="job-a")  # fmt: skip
    config = SchedulerConfig(
        workers=WORKERS, cache_rows=CAPACITY, mode="herald", ps=tuple(ps.addresses),
        host="127.0.0.1", port=0, max_backlog=2, grace_seconds=1, checkpoints=checkpoint,
        claim_lease_seconds=LEASE,
    )  # fmt: skip
    server = SchedulerServer(config)
    server.start()
    return server


def _second(
    name: str, ps: PSClient, root: Path, workdir: Path, *flags: str
) -> tuple[processes.subprocess.Popen[bytes], Path]:
    """``heraldps scheduler --resume-from ROOT`` against A's shards, as its own process."""
    args = [
        "scheduler", "--workers", str(WORKERS), "--cache-rows", str(CAPACITY),
        "--ps", ",".join(ps.addresses), "--port", "0", "--port-file", str(workdir / name),
        "--max-backlog", "2", "--checkpoint-every", "4", "--checkpoint-dir", str(root),
        "--resume-from", str(root), "--job-fingerprint", "job-a",
        "--claim-lease-seconds", str(LEASE), *flags,
    ]  # fmt: skip
    return processes.start(name, args, workdir), workdir / f"{name}.log"


def _ready(ps: PSClient, root: Path) -> SchedulerServer:
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    ps.pull("emb", np.arange(50, dtype=np.int64))
    first = _first(ps, root)
    _train(first, make_batches(11), finish=False)  # 0..9 committed; checkpoints 3, 7
    assert ps.shard_committed_iterations() == [9, 9]
    return first


def test_a_second_scheduler_cannot_roll_back_a_live_run(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    _, ps = cluster(2)
    first = _ready(ps, tmp_path / "ckpt")
    started: list[processes.subprocess.Popen[bytes]] = []
    try:
        # The same job again (the case): it waits for A's lease, which A renews, so
        # it gives up without touching the shards.
        same, log = _second("same-run", ps, tmp_path / "ckpt", tmp_path)
        started.append(same)
        assert same.wait(timeout=60) != 0
        text = log.read_text()
        assert "job-a" in text and "--force-takeover" in text, text
        assert ps.shard_committed_iterations() == [9, 9]  # not rolled back to 7
        # Another run: refused once A renewed the lease it waited for, naming both runs.
        other, log = _second("other-run", ps, tmp_path / "ckpt", tmp_path, "--run-id", "job-b")
        started.append(other)
        assert other.wait(timeout=60) != 0
        text = log.read_text()
        assert "job-a" in text and "job-b" in text, text
        assert ps.shard_committed_iterations() == [9, 9]
        # A's run goes on and ends: iteration 10 commits on its shards.
        _train(first, [], finish=True)
        assert ps.shard_committed_iterations() == [10, 10]
        assert first.barrier.failure is None
        first.stop(grace=0)
        # A released its claim when it stopped: a scheduler may now resume from a checkpoint.
        after, _ = _second("after", ps, tmp_path / "ckpt", tmp_path)
        started.append(after)
        processes.port(tmp_path / "after", after, tmp_path, "after")
        assert ps.shard_committed_iterations() == [7, 7]
    finally:
        first.stop(grace=0)
        processes.stop_all(started)


def _report_all(server: SchedulerServer) -> list[grpc.StatusCode]:
    """Workers of A that report every plan until the stream ends or a call fails."""
    codes: list[grpc.StatusCode] = []
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)

        def worker(w: int) -> None:
            try:
                stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=w))
                for plan in stub.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=w)):
                    done = scheduler_pb2.ReportDoneRequest(worker_id=w, iteration=plan.iteration)
                    stub.ReportDone(done, timeout=30)
            except grpc.RpcError as err:
                codes.append(err.code())

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
        for t in threads:
            t.start()
        stub.Finish(scheduler_pb2.FinishRequest(), timeout=30)
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()
    return codes


@pytest.mark.parametrize("flag", ["--force-takeover"])
def test_a_forced_takeover_fences_the_old_scheduler_out(
    cluster: ClusterFactory, tmp_path: Path, flag: str
) -> None:
    _, ps = cluster(2)
    first = _ready(ps, tmp_path / "ckpt")
    second, log = _second("forced", ps, tmp_path / "ckpt", tmp_path, "--run-id", "job-b", flag)
    try:
        processes.port(tmp_path / "forced", second, tmp_path, "forced")
        assert ps.shard_committed_iterations() == [7, 7]  # what the operator asked for
        assert "took over" in log.read_text()
        codes = _report_all(first)  # A's commit of 10 is refused: its run aborts
        assert grpc.StatusCode.ABORTED in codes, codes
        assert first.barrier.failure is not None
        assert "job-b" in first.barrier.failure.message, first.barrier.failure.message
        assert ps.shard_committed_iterations() == [7, 7]  # nothing of A's landed
    finally:
        first.stop(grace=0)
        processes.stop_all([second])


def test_claim_rules_on_a_shard(cluster: ClusterFactory) -> None:
    """The shard's rules, through PSClient: a held claim refuses unfenced and stale calls,
    a lapsed or released one refuses nothing; epochs only grow."""
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    intruder = PSClient(ps.addresses, timeout=5, retries=1)
    try:
        ps.claim("job-a", 1, lease_seconds=2)
        ps.commit(0)  # the holder's fenced commit
        with pytest.raises(FailedPrecondition, match="names no run") as err:
            intruder.commit(1)
        assert err.value.reason == "SHARD_CLAIMED" and "job-a" in str(err.value)
        with pytest.raises(FailedPrecondition, match="already granted epoch 1"):
            intruder.claim("job-b", 1, lease_seconds=2, force=True)
        with pytest.raises(InvalidArgument, match="lease_seconds"):
            intruder.claim("job-b", 2, lease_seconds=0.1)
        assert ps.shard_committed_iterations() == [0, 0]
        time.sleep(2.2)  # the lease runs out without a renewal: nobody is refused
        intruder.commit(1)
        ps.renew_claim(2)  # the holder comes back: still its claim
        with pytest.raises(FailedPrecondition, match="job-a"):
            intruder.commit(2)
        ps.release_claim("job-a", 1)
        intruder.commit(2)
        info = ps._all_shards("GetShardInfo", ps_pb2.GetShardInfoRequest())
        assert [i.max_epoch for i in info] == [1, 1] and not info[0].HasField("claim")
        assert ps.shard_committed_iterations() == [2, 2]
    finally:
        intruder.close()


def test_claim_needs_the_admin_token(tmp_path: Path) -> None:
    admin, worker = tmp_path / "admin.token", tmp_path / "worker.token"
    admin.write_text("admin-" + "a" * 32)
    worker.write_text("worker-" + "w" * 32)
    security = ServerSecurity(admin_token_file=str(admin), worker_token_file=str(worker))
    with shard(security=security) as server:
        for token, allowed in ((worker.read_text(), False), (admin.read_text(), True)):
            caller = client(server, token=token)
            try:
                if allowed:
                    caller.claim("job-a", 1, lease_seconds=5)
                else:
                    with pytest.raises(PermissionDenied, match="admin"):
                        caller.claim("job-a", 1, lease_seconds=5)
            finally:
                caller.close()
