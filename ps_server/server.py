"""Running a PS shard: config, gRPC server, health, reflection, metrics, signals."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from heraldps.v1 import ps_pb2
from ps_server.metrics import PSMetrics
from ps_server.servicer import ParameterServerServicer
from ps_server.store import StagedStore

log = logging.getLogger(__name__)

SERVICE_NAME = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name


@dataclass(frozen=True)
class PSConfig:
    """Everything a shard process is configured with (CLI flags / HERALDPS_* env)."""

    host: str = "0.0.0.0"
    port: int = 7001
    shard_index: int = 0
    num_shards: int = 1
    metrics_port: int | None = None
    max_message_mb: int = 64
    memory_limit_gb: float | None = None
    threads: int = 16
    grace_seconds: float = 10.0
    port_file: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.shard_index < self.num_shards:
            raise ValueError(
                f"--shard-index must be in 0..{self.num_shards - 1} for --num-shards "
                f"{self.num_shards}, got {self.shard_index}"
            )
        if self.max_message_mb < 1:
            raise ValueError(f"--max-message-mb must be >= 1, got {self.max_message_mb}")

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mb * 2**20


def _serialize(message: Message | bytes) -> bytes:
    """Responses a handler already serialized (Pull) pass through untouched."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def add_servicer(servicer: ParameterServerServicer, server: grpc.Server) -> None:
    """Register every ParameterServer method, like the generated helper, but let a
    handler return pre-serialized bytes (the bulk Pull response)."""
    service = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
    handlers = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=request_class.FromString,
            response_serializer=_serialize,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """gRPC options shared by servers and clients (message limits raised from 4 MiB)."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


class PSServer:
    """One shard: a StagedStore behind a gRPC server with health and reflection."""

    def __init__(self, config: PSConfig) -> None:
        self.config = config
        limit = None
        if config.memory_limit_gb is not None:
            limit = int(config.memory_limit_gb * 2**30)
        self.store = StagedStore(config.shard_index, config.num_shards, limit)
        self.metrics = PSMetrics(config.shard_index)
        self.servicer = ParameterServerServicer(self.store, self.metrics, config.max_message_bytes)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="ps-rpc"),
            options=channel_options(config.max_message_bytes),
        )
        add_servicer(self.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        self.port = self._server.add_insecure_port(f"{config.host}:{config.port}")
        if self.port == 0:
            raise OSError(f"cannot bind {config.host}:{config.port}; is the port in use?")
        self.metrics_port: int | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        self._server.start()
        if self.config.metrics_port is not None:
            http_server, _ = start_http_server(
                self.config.metrics_port, registry=self.metrics.registry
            )
            self.metrics_port = http_server.server_port
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "shard %d/%d serving on %s:%d (metrics port %s), config %s",
            self.config.shard_index,
            self.config.num_shards,
            self.config.host,
            self.port,
            self.metrics_port,
            asdict(self.config),
        )
        if self.config.port_file:
            # Write then rename, so a watcher never reads a partial file.
            target = Path(self.config.port_file)
            partial = target.with_name(f".{target.name}.partial")
            partial.write_text(f"{self.port} {self.metrics_port or 0}\n")
            partial.replace(target)

    def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, refuse new RPCs, let in-flight ones finish within ``grace``."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        grace = self.config.grace_seconds if grace is None else grace
        self._server.stop(grace).wait()
        log.info("shard %d stopped", self.config.shard_index)

    def wait(self) -> None:
        self._server.wait_for_termination()


def serve(config: PSConfig) -> int:
    """Run a shard until SIGTERM/SIGINT, then drain and return 0."""
    server = PSServer(config)
    server.start()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: draining", signum)
        threading.Thread(target=server.stop, name="ps-drain").start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.wait()
    return 0
