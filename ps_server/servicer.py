"""gRPC servicer of heraldps.v1.ParameterServer: wire <-> NumPy, errors -> status codes.

The servicer holds no logic of its own: it decodes and validates requests,
calls the store, and leaves domain errors to ``heraldps.status`` (the error's
class gives the status code, shared by every servicer).
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Iterator

import grpc

from heraldps import wire
from heraldps.errors import (
    FailedPrecondition,
    HeraldError,
    InvalidArgument,
    ResourceExhausted,
    shown,
)
from heraldps.limits import check_path
from heraldps.optim import lr_scale_of
from heraldps.spec import TableSpec
from heraldps.status import stream_handler, unary_handler
from heraldps.v1 import ps_pb2, ps_pb2_grpc, types_pb2
from ps_server import paths, snapshot
from ps_server.cached_store import CachedStore
from ps_server.cached_table import CachedTable
from ps_server.checks import check_steps
from ps_server.claim import ShardClaims
from ps_server.metrics import PSMetrics
from ps_server.pull_response import PullResponseBuffer
from ps_server.store import StagedStore
from ps_server.table import StagedTable

Store = StagedStore | CachedStore
Table = StagedTable | CachedTable

log = logging.getLogger(__name__)

DEFAULT_EXPORT_BLOCK_ROWS = 65536


def _os_error(exc: OSError, what: str) -> HeraldError:
    if exc.errno == errno.ENOSPC:
        return ResourceExhausted(f"{what}: disk full ({exc}); free space or pick another path")
    return FailedPrecondition(f"{what}: {exc}")


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    """Serves one shard's store."""

    def __init__(
        self,
        store: Store,
        metrics: PSMetrics,
        max_message_bytes: int,
        snapshot_root: str | None = None,
    ) -> None:
        self.store = store
        self.snapshot_root = snapshot_root  # Save/Load stay under it (ps_server.paths)
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self.claims = ShardClaims(store.shard_index)  # which run's scheduler it serves
        # The memory cap: tables (a Cached-PS's whole caches) and calls' buffers.
        metrics.memory_limit.labels(metrics.shard).set(store.budget.limit_bytes or 0)
        metrics.committed_iteration.labels(metrics.shard).set(store.committed_iteration)

    # ----- helpers ----------------------------------------------------------
    def record_rpc(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        m = self.metrics
        m.requests.labels(m.shard, method, code.name).inc()
        m.latency.labels(m.shard, method).observe(seconds)

    def _info(self, table: Table) -> types_pb2.TableInfo:
        return types_pb2.TableInfo(
            spec=table.spec.to_proto(),
            state_width=table.state_width,
            rows=table.rows,
            bytes=table.nbytes,
            shard_index=self.store.shard_index,
            num_shards=self.store.num_shards,
        )

    def _observe_size(self, table: Table) -> None:
        m = self.metrics
        m.rows.labels(m.shard, table.name).set(table.rows)
        m.bytes.labels(m.shard, table.name).set(table.nbytes)

    def _check_response_size(self, rows: int, width: int, what: str) -> int:
        """The response's size in bytes, or ResourceExhausted over the message limit."""
        size = rows * (width * 4 + 8)
        if size > self.max_message_bytes:
            raise ResourceExhausted(
                f"{what}: the response would be {size / 2**20:.1f} MiB, over the shard's "
                f"{self.max_message_bytes / 2**20:.0f} MiB message limit; send fewer keys per "
                "request (PSClient splits requests automatically) or raise --max-message-mb"
            )
        return size

    # ----- tables -----------------------------------------------------------
    @unary_handler
    def CreateTable(
        self, request: ps_pb2.CreateTableRequest, context: grpc.ServicerContext
    ) -> ps_pb2.CreateTableResponse:
        table, created = self.store.create_table(
            TableSpec.from_proto(request.spec), request.validate_only
        )
        if table is None:  # validate_only: it would be created
            return ps_pb2.CreateTableResponse()
        if created:
            log.info("created table %s", table.spec)
        self.metrics.add_table(table.name)
        self._observe_size(table)
        return ps_pb2.CreateTableResponse(table=self._info(table), created=created)

    @unary_handler
    def DropTable(
        self, request: ps_pb2.DropTableRequest, context: grpc.ServicerContext
    ) -> ps_pb2.DropTableResponse:
        self.store.drop_table(request.table)
        log.info("dropped empty table %s", request.table)
        self.metrics.drop_table(request.table)
        return ps_pb2.DropTableResponse()

    @unary_handler
    def ListTables(
        self, request: ps_pb2.ListTablesRequest, context: grpc.ServicerContext
    ) -> ps_pb2.ListTablesResponse:
        return ps_pb2.ListTablesResponse(tables=[self._info(t) for t in self.store.tables()])

    @unary_handler
    def DescribeTable(
        self, request: ps_pb2.DescribeTableRequest, context: grpc.ServicerContext
    ) -> types_pb2.TableInfo:
        return self._info(self.store.table(request.table))

    # ----- training ---------------------------------------------------------
    @unary_handler
    def Pull(  # type: ignore[override]
        self, request: ps_pb2.PullRequest, context: grpc.ServicerContext
    ) -> bytes:
        """Answer with an already serialized PullResponse whose rows the table gathered
        straight into the message (``ps_server.pull_response``)."""
        table = self.store.table(request.table)
        keys = wire.decode_keys(request.keys)
        n = keys.shape[0]
        sw = table.state_width if request.with_state else 0
        size = self._check_response_size(n, table.dim + sw, f"pull of {n} keys")
        # The message; a Cached-PS table also builds the rows as arrays first.
        copies = 1 if isinstance(table, StagedTable) else 2
        with self.store.budget.reserve(copies * size, "the pull's response"):
            response = PullResponseBuffer(n, table.dim, sw)
            table.pull_into(keys, response.values, response.versions, response.state)
            self.metrics.pulled.labels(self.metrics.shard, table.name).inc(n)
            self._observe_size(table)
            return response.message

    @unary_handler
    def GetVersions(
        self, request: ps_pb2.GetVersionsRequest, context: grpc.ServicerContext
    ) -> ps_pb2.GetVersionsResponse:
        table = self.store.table(request.table)
        keys = wire.decode_keys(request.keys)
        # The versions array, its bytes and the message's copy of them.
        with self.store.budget.reserve(3 * 8 * keys.shape[0], "the GetVersions response"):
            versions = table.versions(keys)
            self.metrics.version_checks.labels(self.metrics.shard, table.name).inc(keys.shape[0])
            return ps_pb2.GetVersionsResponse(versions=wire.encode_keys(versions))

    @unary_handler
    def Prefetch(
        self, request: ps_pb2.PrefetchRequest, context: grpc.ServicerContext
    ) -> ps_pb2.PrefetchResponse:
        table = self.store.table(request.table)
        keys = wire.decode_keys(request.keys)
        cached = self.store.prefetch(table.name, keys)
        self._observe_size(table)
        return ps_pb2.PrefetchResponse(cached_rows=cached)

    @unary_handler
    def PushGradients(
        self, request: ps_pb2.PushGradientsRequest, context: grpc.ServicerContext
    ) -> ps_pb2.PushGradientsResponse:
        table = self.store.table(request.table)
        keys = wire.decode_keys(request.keys)
        grads = wire.decode_rows(request.grads, keys.shape[0], table.dim, "grads")
        steps = None
        if request.steps:
            steps = wire.decode_counts(request.steps, keys.shape[0], "steps")
            check_steps(steps)
        if request.worker < 0:
            raise InvalidArgument(
                f"push: worker is {request.worker}; send the pushing worker's id (>= 0), "
                "or leave it 0"
            )
        applied = self.store.push(table.name, request.iteration, keys, grads, steps,
                                  request.worker)  # fmt: skip
        self.metrics.pushed.labels(self.metrics.shard, table.name).inc(keys.shape[0])
        self._observe_size(table)
        return ps_pb2.PushGradientsResponse(rows=keys.shape[0], applied=applied)

    @unary_handler
    def Commit(
        self, request: ps_pb2.CommitRequest, context: grpc.ServicerContext
    ) -> ps_pb2.CommitResponse:
        started = time.perf_counter()
        self.claims.check(request.fence if request.HasField("fence") else None, "commit")
        updated, already = self.store.commit(request.iteration, lr_scale_of(request.lr_scale))
        m = self.metrics
        if not already:
            m.commit_seconds.labels(m.shard).observe(time.perf_counter() - started)
            m.committed_iteration.labels(m.shard).set(self.store.committed_iteration)
            for table in self.store.tables():
                self._observe_size(table)
        return ps_pb2.CommitResponse(
            committed_iteration=self.store.committed_iteration,
            rows_updated=updated,
            already_committed=already,
        )

    @unary_handler
    def WriteBack(
        self, request: ps_pb2.WriteBackRequest, context: grpc.ServicerContext
    ) -> ps_pb2.WriteBackResponse:
        table = self.store.table(request.table)
        keys = wire.decode_keys(request.keys)
        n = keys.shape[0]
        values = wire.decode_rows(request.values, n, table.dim, "values")
        state = wire.decode_rows(request.state, n, table.state_width, "state")
        base = wire.decode_keys(request.base_versions, "base_versions")
        new = wire.decode_keys(request.new_versions, "new_versions")
        if base.shape[0] != n or new.shape[0] != n:
            raise InvalidArgument(
                f"write_back: {n} keys but {base.shape[0]} base_versions and "
                f"{new.shape[0]} new_versions; send one of each per key"
            )
        self.store.write_back(table.name, keys, values, state, base, new)
        self.metrics.written_back.labels(self.metrics.shard, table.name).inc(n)
        self._observe_size(table)
        return ps_pb2.WriteBackResponse(rows=n)

    # ----- snapshots and export --------------------------------------------
    @unary_handler
    def Save(
        self, request: ps_pb2.SaveRequest, context: grpc.ServicerContext
    ) -> ps_pb2.SaveResponse:
        """Write this shard's snapshot under ``request.path``.

        A path inside (or over) the store's own data directory, or an existing
        ``shard-*`` entry there that is not a snapshot, is FAILED_PRECONDITION
        (``snapshot.check_target``), checked before the tables are copied.
        """
        check_path(request.path, "save")
        root = paths.confine(request.path, self.snapshot_root, "save")
        keep_out = self.store.data_paths()
        shard, shards = self.store.shard_index, self.store.num_shards
        try:
            snapshot.check_target(root, shard, shards, keep_out)
            iteration, tables = self.store.consistent_snapshot()
            shard_dir = snapshot.write_shard(root, shard, shards, iteration, tables, keep_out)
        except OSError as exc:
            raise _os_error(exc, f"save to {shown(request.path)}") from None
        return ps_pb2.SaveResponse(
            rows=sum(len(block) for _, block in tables),
            committed_iteration=iteration,
            shard_dir=str(shard_dir),
        )

    @unary_handler
    def Load(
        self, request: ps_pb2.LoadRequest, context: grpc.ServicerContext
    ) -> ps_pb2.LoadResponse:
        """Replace every table with a snapshot, checked whole first (``validate_only``:
        check it and that it fits, and change nothing)."""
        check_path(request.path, "load")
        self.claims.check(request.fence if request.HasField("fence") else None, "load")
        try:
            iteration, tables = snapshot.read_for_shard(
                paths.confine(request.path, self.snapshot_root, "load"),
                self.store.shard_index,
                self.store.num_shards,
                confine=self.snapshot_root,
            )
        except OSError as exc:
            raise _os_error(exc, f"load from {shown(request.path)}") from None
        rows = self.store.replace_all(iteration, tables, apply=not request.validate_only)
        if request.validate_only:
            return ps_pb2.LoadResponse(rows=rows, committed_iteration=iteration)
        m = self.metrics
        m.committed_iteration.labels(m.shard).set(iteration)
        for table in self.store.tables():
            self._observe_size(table)
        log.info("loaded %d rows at iteration %d from %s", rows, iteration, request.path)
        return ps_pb2.LoadResponse(rows=rows, committed_iteration=iteration)

    @stream_handler
    def ExportIncremental(
        self, request: ps_pb2.ExportIncrementalRequest, context: grpc.ServicerContext
    ) -> Iterator[ps_pb2.RowBlock]:
        if request.block_rows < 0:
            raise InvalidArgument(f"export: block_rows must be >= 0, got {request.block_rows}")
        for table, block in self.store.export(request.since_iteration, request.table):
            # Blocks shrink to fit the message limit for wide rows.
            row_bytes = 4 * (table.dim + table.state_width) + 24
            fitting = max(1, int(self.max_message_bytes * 0.9) // row_bytes)
            block_rows = min(request.block_rows or DEFAULT_EXPORT_BLOCK_ROWS, fitting)
            for start in range(0, len(block), block_rows):
                part = slice(start, start + block_rows)
                yield ps_pb2.RowBlock(
                    table=table.name,
                    dim=table.dim,
                    state_width=table.state_width,
                    keys=wire.encode_keys(block.keys[part]),
                    values=wire.encode_floats(block.values[part]),
                    state=wire.encode_floats(block.state[part]),
                    versions=wire.encode_keys(block.versions[part]),
                    changed_iterations=wire.encode_keys(block.changed[part]),
                )

    @unary_handler
    def GetShardInfo(
        self, request: ps_pb2.GetShardInfoRequest, context: grpc.ServicerContext
    ) -> ps_pb2.ShardInfo:
        claim, max_epoch = self.claims.info()
        return ps_pb2.ShardInfo(
            shard_index=self.store.shard_index,
            num_shards=self.store.num_shards,
            committed_iteration=self.store.committed_iteration,
            tables=[self._info(t) for t in self.store.tables()],
            max_message_bytes=self.max_message_bytes,
            claim=claim,
            max_epoch=max_epoch,
        )

    @unary_handler
    def Claim(
        self, request: ps_pb2.ClaimRequest, context: grpc.ServicerContext
    ) -> ps_pb2.ClaimResponse:
        return self.claims.claim(request)
