"""Running a PS shard: config, servicer registration, process (``heraldps.serving``)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from heraldps.admission import Limits
from heraldps.ports import check_port
from heraldps.security import ServerSecurity
from heraldps.serving import GrpcProcess, serve_until_signal
from heraldps.v1 import ps_pb2
from ps_server import parallel, snapshot
from ps_server.cached_store import CachedStore
from ps_server.cached_table import CachePolicy
from ps_server.metrics import PSMetrics
from ps_server.servicer import ParameterServerServicer
from ps_server.store import StagedStore

log = logging.getLogger(__name__)

SERVICE_NAME = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name
# The RPCs that create, replace, commit or copy out a model: the admin role's alone
# (heraldps.auth); workers train with the rest.
ADMIN_METHODS = tuple(
    f"/{SERVICE_NAME}/{m}"
    for m in ("Save", "Load", "CreateTable", "DropTable", "Commit", "ExportIncremental", "Claim")
)


@dataclass(frozen=True)
class PSConfig:
    """Everything a shard process is configured with (CLI flags / HERALDPS_* env)."""

    host: str = "127.0.0.1"  # containers pass 0.0.0.0 explicitly
    port: int = 7001
    shard_index: int = 0
    num_shards: int = 1
    metrics_port: int | None = None
    max_message_mb: int = 64
    memory_limit_gb: float | None = None
    expected_rows: int = 0  # staged store: rows each table is sized for up front
    kernel_threads: int = 0  # threads a big request's loops use (ps_server.parallel; 0: cores)
    threads: int = 16
    grace_seconds: float = 10.0
    port_file: str | None = None
    store: str = "staged"  # staged (host memory) | cached (LMDB on disk + host cache)
    data_dir: str | None = None
    cache_gb: float = 1.0  # per table, cached store; counted whole by memory_limit_gb
    target_hit_rate: float = 1.0
    max_num_evict: int = -1
    durability: str = "sync"
    max_disk_gb: float = 1024.0
    restore: str | None = None  # a Save snapshot to load at start (not confined: the operator's)
    snapshot_root: str | None = None  # Save/Load paths stay under it (None: any path)
    security: ServerSecurity = field(default_factory=ServerSecurity)
    max_concurrent_rpcs: int = 0  # 0: 4 x threads (heraldps.admission)
    max_streams: int = 16
    stream_stall_seconds: float = 60.0

    def __post_init__(self) -> None:
        check_port(self.port, "--port")
        check_port(self.metrics_port, "--metrics-port")
        if self.store not in ("staged", "cached"):
            raise ValueError(f"--store must be staged or cached, got {self.store!r}")
        if self.store == "cached" and not self.data_dir:
            raise ValueError("--store cached needs --data-dir DIR (where the LMDB files live)")
        if self.durability not in ("sync", "periodic"):
            raise ValueError(f"--durability must be sync or periodic, got {self.durability!r}")
        if not 0.0 <= self.target_hit_rate <= 1.0:
            raise ValueError(f"--target-hit-rate must be in [0, 1], got {self.target_hit_rate}")
        if not 0 <= self.shard_index < self.num_shards:
            raise ValueError(
                f"--shard-index must be in 0..{self.num_shards - 1} for --num-shards "
                f"{self.num_shards}, got {self.shard_index}"
            )
        if self.expected_rows < 0:
            raise ValueError(f"--expected-rows must be >= 0, got {self.expected_rows}")
        if self.kernel_threads < 0:
            raise ValueError(f"--kernel-threads must be >= 0, got {self.kernel_threads}")
        if self.max_message_mb < 1:
            raise ValueError(f"--max-message-mb must be >= 1, got {self.max_message_mb}")
        if self.snapshot_root and self.data_dir and _overlap(self.snapshot_root, self.data_dir):
            raise ValueError(
                f"--snapshot-root {self.snapshot_root!r} and --data-dir {self.data_dir!r} "
                "overlap: a Save there could overwrite the live store; keep them apart"
            )
        self.limits  # noqa: B018 (checks the limits' flags)

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mb * 2**20

    @property
    def limits(self) -> Limits:
        return Limits(
            self.threads, self.max_concurrent_rpcs, self.max_streams, self.stream_stall_seconds
        )


def _overlap(a: str, b: str) -> bool:
    """One directory is the other or lies inside it (after resolving links)."""
    first, second = Path(a).resolve(), Path(b).resolve()
    return first.is_relative_to(second) or second.is_relative_to(first)


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


class PSServer(GrpcProcess):
    """One shard: a StagedStore behind a gRPC server with health and reflection."""

    def __init__(self, config: PSConfig) -> None:
        self.config = config
        config.security.check()
        limit = None
        if config.memory_limit_gb is not None:
            limit = int(config.memory_limit_gb * 2**30)
        parallel.configure(config.kernel_threads)
        self.store: StagedStore | CachedStore
        if config.store == "cached":
            assert config.data_dir is not None
            policy = CachePolicy(
                int(config.cache_gb * 2**30), config.target_hit_rate, config.max_num_evict
            )
            # The limit counts every table's whole --cache-gb, gradient buffers and calls.
            self.store = CachedStore(
                config.data_dir, config.shard_index, config.num_shards, policy,
                config.durability, config.max_disk_gb, memory_limit_bytes=limit,
            )  # fmt: skip
        else:
            self.store = StagedStore(
                config.shard_index, config.num_shards, limit, config.expected_rows
            )
        if config.restore:
            iteration, tables = snapshot.read_for_shard(
                Path(config.restore), config.shard_index, config.num_shards
            )
            rows = self.store.replace_all(iteration, tables)
            log.info("restored %d rows at iteration %d from %s", rows, iteration, config.restore)
        self.metrics = PSMetrics(config.shard_index)
        self.servicer = ParameterServerServicer(
            self.store, self.metrics, config.max_message_bytes, config.snapshot_root
        )
        super().__init__(
            name=f"shard {config.shard_index}/{config.num_shards}",
            host=config.host,
            port=config.port,
            threads=config.threads,
            max_message_bytes=config.max_message_bytes,
            service_names=(SERVICE_NAME,),
            registry=self.metrics.registry,
            metrics_port=config.metrics_port,
            port_file=config.port_file,
            grace_seconds=config.grace_seconds,
            security=config.security,
            admin_methods=ADMIN_METHODS,
            limits=config.limits,
            # Looked up per call: a Load gives the store a fresh budget.
            reserve=lambda nbytes, what: self.store.budget.reserve(nbytes, what),
        )
        add_servicer(self.servicer, self.server)

    def start(self) -> None:
        super().start()
        log.info("config %s", asdict(self.config))

    def stop(self, grace: float | None = None) -> None:
        super().stop(grace)
        if isinstance(self.store, CachedStore):
            self.store.close()


def serve(config: PSConfig) -> int:
    """Run a shard until SIGTERM/SIGINT, then drain and return 0."""
    return serve_until_signal(PSServer(config))
