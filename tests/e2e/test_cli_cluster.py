"""The real ``heraldps ps`` CLI in subprocesses: train, save, re-shard, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from heraldps.client import PSClient
from heraldps.init import Normal
from heraldps.optim import AdaGrad, Adam
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc


class Shard:
    def __init__(self, index: int, num_shards: int, workdir: Path) -> None:
        self.port_file = workdir / f"shard-{index}-of-{num_shards}.port"
        self.log = open(workdir / f"shard-{index}-of-{num_shards}.log", "w")  # noqa: SIM115
        env = {**os.environ, "HERALDPS_NUM_SHARDS": str(num_shards)}  # also proves env config
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "launcher",
                "ps",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--shard-index",
                str(index),
                "--metrics-port",
                "0",
                "--grace-seconds",
                "5",
                "--port-file",
                str(self.port_file),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while not self.port_file.exists() or not self.port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"shard {index} did not start: {self.log_text()}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text().split()[0])

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text()

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self.log.close()
        return code


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[object]:
    shards: list[Shard] = []

    def start(num_shards: int) -> tuple[list[Shard], PSClient]:
        group = [Shard(i, num_shards, tmp_path) for i in range(num_shards)]
        shards.extend(group)
        client = PSClient([f"127.0.0.1:{s.port}" for s in group])
        client.wait_ready()
        return group, client

    yield start
    for shard in shards:
        if shard.proc.poll() is None:
            shard.proc.kill()
            shard.proc.wait()


def test_train_save_load_onto_three_shards_and_sigterm(
    start_cluster: object, tmp_path: Path
) -> None:
    two, ps = start_cluster(2)  # type: ignore[operator]
    ps.create_table(
        "emb",
        dim=8,
        optimizer=AdaGrad(lr=0.1, initial_accumulator=0.1),
        initializer=Normal(std=0.1, seed=11),
    )
    ps.create_table("item", dim=4, optimizer=Adam(lr=0.01), initializer=Normal(std=0.1, seed=12))
    rng = np.random.default_rng(0)
    for it in range(5):
        keys = rng.integers(0, 2000, 512)
        ps.pull("emb", keys)
        ps.push_gradients("emb", keys, rng.normal(size=(512, 8)), iteration=it)
        ps.push_gradients("item", keys % 100, rng.normal(size=(512, 4)), iteration=it)
        ps.commit(it)
    all_emb, all_item = np.arange(2000), np.arange(100)
    want = (ps.pull_with_state("emb", all_emb), ps.pull_with_state("item", all_item))
    snap = tmp_path / "snap"
    assert ps.save(str(snap)) == 2000 + 100
    ps.close()
    for shard in two:
        assert shard.terminate() == 0
        assert "draining" in shard.log_text()

    three, ps3 = start_cluster(3)  # type: ignore[operator]
    assert ps3.load(str(snap)) == 2100
    got = (ps3.pull_with_state("emb", all_emb), ps3.pull_with_state("item", all_item))
    for w, g in zip(want, got, strict=True):
        for x, y in zip(w, g, strict=True):
            assert np.array_equal(x, y)
    assert ps3.describe_table("emb").rows == 2000
    # Training continues from the snapshot's iteration.
    ps3.push_gradients("emb", [1], np.ones((1, 8)), iteration=5)
    assert ps3.commit(5) == 1
    ps3.close()
    for shard in three:
        assert shard.terminate() == 0


def test_bad_flags_exit_with_a_message(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "launcher", "ps", "--shard-index", "3", "--num-shards", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--shard-index must be in 0..1" in out.stderr


# examples/quickstart.sh binds 127.0.0.1:7001/7002 (and 9101/9102), as the compose tests' published
# ports do: under `-n 2 --dist loadgroup` tests of this group run one after another.
@pytest.mark.xdist_group("host-ports")
def test_quickstart_example_runs(start_cluster: object) -> None:
    shards, ps = start_cluster(2)  # type: ignore[operator]
    ps.close()
    example = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    out = subprocess.run(
        [sys.executable, str(example), *(f"127.0.0.1:{s.port}" for s in shards)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "key 3 moved by -0.2" in out.stdout
    assert "table ids: dim 8, 5000 rows" in out.stdout
    for shard in shards:
        assert shard.terminate() == 0


def test_scheduler_cli_serves_and_drains(tmp_path: Path) -> None:
    port_file = tmp_path / "scheduler.port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "scheduler", "--workers", "2", "--cache-rows",
         "100", "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            status = check(health_pb2.HealthCheckRequest(service="heraldps.v1.Scheduler")).status
            assert status == health_pb2.HealthCheckResponse.SERVING
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=1))
            assert list(stub.GetStatus(scheduler_pb2.GetStatusRequest()).registered_workers) == [1]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "draining" in out
    finally:
        if proc.poll() is None:
            proc.kill()
