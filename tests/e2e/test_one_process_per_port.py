"""One process per port: a server started on a port another process serves exits at once
with a one-line error naming the port, and the first keeps serving; ports outside 0..65535
are refused (issue 23, "Two shards on one port")."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from heraldps.client import PSClient
from heraldps.optim import SGD
from heraldps.security import OPEN
from tests.processes import heraldps, port, start, stop_all
from worker_client.collective import Mailbox, serve_collective
from worker_client.metrics import WorkerMetrics

SCHEDULER = ("scheduler", "--workers", "1", "--cache-rows", "16")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    stop_all(started)


def _first(
    role: tuple[str, ...], tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> tuple[int, int]:
    """Start ``role`` on free ports; (gRPC port, metrics port) once it serves."""
    port_file = tmp_path / "first.port"
    args = [*role, "--port", "0", "--metrics-port", "0", "--port-file", str(port_file)]
    proc = start("first", args, tmp_path)
    procs.append(proc)
    grpc_port = port(port_file, proc, tmp_path, "first")
    return grpc_port, int(port_file.read_text().split()[1])


def _second(*args: str) -> subprocess.CompletedProcess[str]:
    """``heraldps ARGS`` run to its end (it must end by itself: a server that serves fails)."""
    return subprocess.run(heraldps(*args), capture_output=True, text=True, timeout=30)


def _refused(done: subprocess.CompletedProcess[str], port: int) -> None:
    assert done.returncode != 0, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert str(port) in lines[0] and "in use" in lines[0], lines[0]
    assert "serving on" not in done.stdout + done.stderr


def test_a_second_shard_on_a_port_in_use_exits_and_the_first_serves(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    first, _ = _first(("ps",), tmp_path, procs)
    with PSClient([f"127.0.0.1:{first}"]) as client:
        client.create_table("emb", 4, SGD(0.1))
        client.push_gradients("emb", np.arange(10), np.ones((10, 4), np.float32), 0)
        client.commit(0)
    _refused(_second("ps", "--port", str(first)), first)
    assert procs[0].poll() is None
    # Every new client reaches the one shard that holds the rows (none an empty duplicate).
    for _ in range(12):
        with PSClient([f"127.0.0.1:{first}"]) as client:
            assert client.describe_table("emb").rows == 10


def test_a_second_scheduler_on_a_port_in_use_exits_and_the_first_serves(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    first, _ = _first(SCHEDULER, tmp_path, procs)
    _refused(_second(*SCHEDULER, "--port", str(first)), first)
    assert procs[0].poll() is None
    with grpc.insecure_channel(f"127.0.0.1:{first}") as channel:
        grpc.channel_ready_future(channel).result(timeout=10)


def test_a_metrics_port_in_use_fails_the_start(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    _, metrics = _first(("ps",), tmp_path, procs)
    _refused(_second("ps", "--port", "0", "--metrics-port", str(metrics)), metrics)
    _refused(_second(*SCHEDULER, "--port", "0", "--metrics-port", str(metrics)), metrics)
    assert procs[0].poll() is None


def test_a_port_held_by_a_plain_socket_fails_the_start() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        _refused(_second("ps", "--port", str(taken)), taken)


@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
@pytest.mark.parametrize("role", [("ps",), SCHEDULER], ids=["ps", "scheduler"])
@pytest.mark.parametrize("value", ["70000", "-1"])
def test_ports_outside_the_range_are_refused(flag: str, role: tuple[str, ...], value: str) -> None:
    done = _second(*role, flag, value)
    assert done.returncode == 2, done.stdout + done.stderr
    assert value in done.stderr and "0..65535" in done.stderr, done.stderr
    assert "serving on" not in done.stdout + done.stderr


def test_config_refuses_ports_outside_the_range() -> None:
    from ps_server.server import PSConfig
    from scheduler_service.server import SchedulerConfig

    with pytest.raises(ValueError, match=r"--port .*0\.\.65535"):
        PSConfig(port=70000)
    with pytest.raises(ValueError, match=r"--metrics-port .*0\.\.65535"):
        PSConfig(metrics_port=-5)
    with pytest.raises(ValueError, match=r"--port .*0\.\.65535"):
        SchedulerConfig(workers=1, cache_rows=4, port=65536)


def test_worker_servers_refuse_a_port_in_use() -> None:
    """The worker's all-reduce server and /metrics: the same rule, in process."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with pytest.raises(OSError, match=f"{taken}.*in use"):
            serve_collective(Mailbox(0, 2, 8), "127.0.0.1", taken, 2**20, OPEN)
        with pytest.raises(OSError, match=f"{taken}.*in use"):
            WorkerMetrics(CollectorRegistry()).serve(taken)


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--collective-port", "70000"],
        ["worker", "--metrics-port", "65536"],
        ["feed", "--metrics-port", "-2"],
    ],
    ids=" ".join,
)
def test_worker_and_feed_ports_outside_the_range_are_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.cli import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert "0..65535" in capsys.readouterr().err
