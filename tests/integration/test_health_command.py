"""``heraldps health ADDR``: exit 0 only when the real server reports SERVING."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from grpc_health.v1 import health_pb2

from launcher.cli import build_parser
from ps_server.server import SERVICE_NAME
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests.conftest import ClusterFactory


def health(*argv: str) -> int:
    args = build_parser().parse_args(["health", *argv])
    code: int = args.run(args)
    return code


def test_serving_shard_exits_0(cluster: ClusterFactory, capsys: pytest.CaptureFixture[str]) -> None:
    servers, _ = cluster(num_shards=1)
    address = f"127.0.0.1:{servers[0].port}"
    assert health(address) == 0
    assert capsys.readouterr().out.strip() == f"{address}: SERVING"
    assert health(address, "--service", SERVICE_NAME) == 0


def test_unknown_service_exits_1(
    cluster: ClusterFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    servers, _ = cluster(num_shards=1)
    assert health(f"127.0.0.1:{servers[0].port}", "--service", "no.Such") == 1
    assert "does not know the service 'no.Such'" in capsys.readouterr().err


def test_not_serving_exits_1(cluster: ClusterFactory, capsys: pytest.CaptureFixture[str]) -> None:
    servers, _ = cluster(num_shards=1)
    servers[0].health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert health(f"127.0.0.1:{servers[0].port}") == 1
    assert capsys.readouterr().err.strip().endswith(": NOT_SERVING")


def test_nothing_listening_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert health(f"127.0.0.1:{port}", "--timeout", "2") == 1
    assert "not reachable" in capsys.readouterr().err


def test_scheduler_through_the_real_cli() -> None:
    """The command a container healthcheck runs: a subprocess, exit code and stderr."""
    server = SchedulerServer(SchedulerConfig(workers=1, cache_rows=8, host="127.0.0.1", port=0))
    server.start()
    command = [sys.executable, "-m", "launcher", "health", f"127.0.0.1:{server.port}"]
    try:
        ok = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert (ok.returncode, ok.stdout.strip()) == (0, f"127.0.0.1:{server.port}: SERVING")
    finally:
        server.stop(grace=0)
    down = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1
    assert "not reachable" in down.stderr
