"""What every heraldps gRPC process shares: server, health, reflection, metrics, signals."""

from __future__ import annotations

import logging
import os
import signal
import threading
from concurrent import futures
from http.server import HTTPServer
from pathlib import Path
from types import FrameType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from heraldps import malloc
from heraldps.admission import Admission, Limits, Reserve
from heraldps.ports import NO_REUSEPORT, check_port, serve_metrics
from heraldps.security import OPEN, ServerSecurity

log = logging.getLogger(__name__)


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """gRPC options shared by servers and clients (message limits raised from 4 MiB)."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def keepalive_options(seconds: float) -> list[tuple[str, int]]:
    """Client options that find a frozen server: ping it every ``seconds`` and drop the
    connection (its calls fail UNAVAILABLE) when a ping goes unanswered as long, even
    while a stream waits idle (a worker's plan stream during a long pause)."""
    ms = max(1000, int(seconds * 1000))
    return [
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms),
        ("grpc.http2.ping_timeout_ms", ms),  # grpcio 1.85 times pings out by this one
        ("grpc.http2.max_pings_without_data", 0),
    ]


# Servers accept those pings as often as every second, however long a stream idles
# (gRPC's defaults answer a ping more often than every 5 minutes with GOAWAY).
_PING_PERMISSIONS = [
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
]


class GrpcProcess:
    """A gRPC server with health (SERVING once started), reflection and /metrics.

    Subclasses register their servicers on ``self.server`` in ``__init__``
    and name their services in ``service_names``. ``security`` decides TLS, the
    role check (``admin_methods`` need the admin token) and reflection; /metrics
    binds the same host as gRPC.
    """

    def __init__(
        self,
        *,
        name: str,
        host: str,
        port: int,
        threads: int,
        max_message_bytes: int,
        service_names: tuple[str, ...],
        registry: CollectorRegistry,
        metrics_port: int | None,
        port_file: str | None,
        grace_seconds: float,
        security: ServerSecurity = OPEN,
        admin_methods: tuple[str, ...] = (),
        limits: Limits | None = None,
        reserve: Reserve | None = None,
    ) -> None:
        self.name = name
        self.service_names = service_names
        self.registry = registry
        self.grace_seconds = grace_seconds
        check_port(port, "--port")
        check_port(metrics_port, "--metrics-port")
        self._port_file = port_file
        self.health = health.HealthServicer(experimental_non_blocking=True)
        if "MALLOC_ARENA_MAX" not in os.environ:  # before the pool's threads allocate
            malloc.limit_arenas()
        self.limits = limits or Limits(threads=threads)
        self.admission = Admission(self.limits, registry, reserve)
        pool = self.limits.pool_threads  # a thread for every call admitted: no queue
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=pool, thread_name_prefix=f"{name}-rpc"),
            options=channel_options(max_message_bytes) + _PING_PERMISSIONS + NO_REUSEPORT,
            # The role check first: a refused caller is answered before admission counts it.
            interceptors=[*security.interceptors(admin_methods), self.admission],
            maximum_concurrent_rpcs=pool,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if security.reflection:
            reflection.enable_server_reflection(
                (*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
            )
        self.host = host
        self.security = security
        # Both ports are taken now, before anything serves: a port another process
        # holds fails the start with one line naming it (heraldps.ports).
        self.port = security.bind(self.server, host, port, name)
        self._metrics: HTTPServer | None = None
        if metrics_port is not None:
            try:
                self._metrics = serve_metrics(metrics_port, host, registry, name)
            except OSError:
                self.server.stop(0)  # free the gRPC port too
                raise
        self.metrics_port = None if self._metrics is None else self._metrics.server_port
        self._stopped = threading.Event()
        self.exit_code = 0  # what serve_until_signal returns once the server stopped

    def start(self) -> None:
        self.server.start()
        for service in ("", *self.service_names):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s serving on %s:%d (metrics port %s)", self.name, self.host, self.port,
                 self.metrics_port)  # fmt: skip
        if self._port_file:
            # Write then rename, so a watcher never reads a partial file.
            target = Path(self._port_file)
            partial = target.with_name(f".{target.name}.partial")
            partial.write_text(f"{self.port} {self.metrics_port or 0}\n")
            partial.replace(target)

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, refuse new RPCs, let in-flight ones finish within ``grace``."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self.before_stop()
        self.server.stop(self.grace_seconds if grace is None else grace).wait()
        log.info("%s stopped", self.name)

    def before_stop(self) -> None:
        """Hook: wake long-running streams so the drain does not wait for them."""

    def wait(self) -> None:
        self.server.wait_for_termination()


def serve_until_signal(process: GrpcProcess) -> int:
    """Run until SIGTERM/SIGINT (or the process stops itself), then drain; return the
    process's exit code (0 unless it stopped because it failed)."""
    process.start()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: draining", signum)
        threading.Thread(target=process.stop, name="drain").start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    process.wait()
    return process.exit_code
