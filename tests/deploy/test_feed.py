"""``heraldps feed`` refuses what it cannot train, with a message, never a hang (real servers)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from heraldps.errors import HeraldError
from heraldps.init import Zeros
from heraldps.job import TrainingJob
from heraldps.optim import SGD
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from launcher.feed import FeedConfig, FeedError, run_feed
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests.conftest import ClusterFactory

JOB = TrainingJob(
    data="bundled:criteo_head8k", workers=2, batch_size_per_worker=32, iterations=6,
    embedding_dim=4, hidden=(8,), cache_rows=2000,
)  # fmt: skip


SchedulerFactory = Callable[[int, list[str]], str]


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.json"
    path.write_text(JOB.to_json())
    return path


@pytest.fixture
def scheduler_factory() -> Iterator[SchedulerFactory]:
    started: list[SchedulerServer] = []

    def start(workers: int, ps: list[str]) -> str:
        server = SchedulerServer(
            SchedulerConfig(
                workers=workers, cache_rows=2000, ps=tuple(ps), host="127.0.0.1", port=0
            )
        )
        server.start()
        started.append(server)
        return f"127.0.0.1:{server.port}"

    yield start
    for server in started:
        server.stop(grace=0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _feed(job: Path, scheduler: str, ps: list[str], timeout: float = 20.0) -> None:
    run_feed(FeedConfig(str(job), scheduler, tuple(ps), timeout_seconds=timeout))


def test_scheduler_for_another_worker_count(
    cluster: ClusterFactory, scheduler_factory: SchedulerFactory, job_file: Path
) -> None:
    servers, _ = cluster(num_shards=2)
    ps = [f"127.0.0.1:{s.port}" for s in servers]
    scheduler = scheduler_factory(3, ps)
    with pytest.raises(FeedError, match="HERALDPS_WORKERS=2"):
        _feed(job_file, scheduler, ps)


def test_table_of_another_job(
    cluster: ClusterFactory, scheduler_factory: SchedulerFactory, job_file: Path
) -> None:
    servers, client = cluster(num_shards=2)
    client.create_table("emb", dim=16, optimizer=SGD(lr=0.1), initializer=Zeros())
    ps = [f"127.0.0.1:{s.port}" for s in servers]
    with pytest.raises(FeedError, match="another spec"):
        _feed(job_file, scheduler_factory(2, ps), ps)


def test_shards_trained_by_an_earlier_run(
    cluster: ClusterFactory, scheduler_factory: SchedulerFactory, job_file: Path
) -> None:
    """compose `down` then `up` without -v: the Cached shard kept its model, the rest did not."""
    servers, client = cluster(num_shards=2)
    client.commit(0)
    ps = [f"127.0.0.1:{s.port}" for s in servers]
    with pytest.raises(FeedError, match=r"model of an earlier run.*down -v"):
        _feed(job_file, scheduler_factory(2, ps), ps)


def test_tables_are_created_idempotently_and_a_stall_fails(
    cluster: ClusterFactory, scheduler_factory: SchedulerFactory, job_file: Path
) -> None:
    """No workers: the scheduler's backlog fills up and the feed gives up after its timeout;
    the tables it created stay, and a second feed accepts them (same spec)."""
    servers, client = cluster(num_shards=2)
    ps = [f"127.0.0.1:{s.port}" for s in servers]
    with pytest.raises(FeedError, match=r"accepted no batch for 1\.5 s"):
        _feed(job_file, scheduler_factory(2, ps), ps, timeout=1.5)
    assert set(client.list_tables()) == {"emb", "dense"}
    with pytest.raises(FeedError, match="accepted no batch"):
        _feed(job_file, scheduler_factory(2, ps), ps, timeout=1.5)


def test_nothing_listening_fails_after_the_timeout(job_file: Path) -> None:
    port = _free_port()
    with pytest.raises(FeedError, match=rf"not ready after 1 s: 127.0.0.1:{port}: not reachable"):
        _feed(job_file, f"127.0.0.1:{_free_port()}", [f"127.0.0.1:{port}"], timeout=1.0)


def test_cli_exit_code_and_message(job_file: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "launcher", "feed", "--job", str(job_file),
               "--scheduler", f"127.0.0.1:{_free_port()}", "--ps", f"127.0.0.1:{_free_port()}",
               "--timeout-seconds", "1"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("heraldps feed: not ready after 1 s:"), result.stderr
    missing = [*command[:5], str(tmp_path / "nope.json"), *command[6:]]
    result = subprocess.run(missing, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "heraldps feed:" in result.stderr and "nope.json" in result.stderr


def test_a_run_aborted_by_a_silent_worker_fails_the_feed_with_the_reason(
    cluster: ClusterFactory, job_file: Path
) -> None:
    """Both workers register, then never report (frozen): the scheduler aborts the run after
    its --worker-timeout, and the feed ends at once with that reason, not after its own."""
    servers, _ = cluster(num_shards=2)
    ps = [f"127.0.0.1:{s.port}" for s in servers]
    config = SchedulerConfig(
        workers=2, cache_rows=2000, ps=tuple(ps), host="127.0.0.1", port=0, worker_timeout=1.0
    )
    server = SchedulerServer(config)
    server.start()
    address = f"127.0.0.1:{server.port}"
    try:
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for w in range(2):
                stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=w), timeout=5)
        began = time.monotonic()
        with pytest.raises((HeraldError, grpc.RpcError)) as caught:
            _feed(job_file, address, ps, timeout=60)
        assert time.monotonic() - began < 20
        error = caught.value
        code = error.code if isinstance(error, HeraldError) else error.code()
        assert code == grpc.StatusCode.ABORTED
        assert "workers 0, 1 have not reported iteration 0 within 1 s" in str(
            error if isinstance(error, HeraldError) else error.details()
        )
    finally:
        server.stop(grace=0)
