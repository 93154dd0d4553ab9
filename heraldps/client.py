"""``PSClient``: the Python client of a heraldps parameter-server cluster.

The client routes each key to its shard with the servers' hash
(:mod:`heraldps.sharding`), sends every shard its part concurrently (gRPC
futures), splits parts above the message limit into several requests, and
returns results in the caller's key order. NumPy in, NumPy out.

Idempotent calls (pull, create/describe/list, commit, save, load, export)
are retried with exponential backoff on ``UNAVAILABLE``; pushes and
write-backs are not (a retry could apply a gradient twice). A request that
spans several shards is atomic per shard, not across shards.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from heraldps import wire
from heraldps.init import Initializer, Zeros
from heraldps.optim import Optimizer
from heraldps.serving import channel_options
from heraldps.sharding import split_by_shard
from heraldps.spec import TableSpec, UpdateMode
from heraldps.v1 import ps_pb2, ps_pb2_grpc, types_pb2

Response = TypeVar("Response")

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
# Leave room for protobuf framing inside the message limit.
_MESSAGE_FILL = 0.9
DENSE_ROW_WIDTH = 256


@dataclass(frozen=True)
class TableStats:
    """A table summed over every shard."""

    spec: TableSpec
    state_width: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class ExportedRows:
    """Rows of one table from ``export_incremental``."""

    keys: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    state: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int64]
    changed_iterations: npt.NDArray[np.int64]


@dataclass(frozen=True)
class DenseParameter:
    """A dense tensor stored as rows ``0..rows-1`` of a table (see ``create_dense``)."""

    name: str
    size: int
    row_width: int

    @property
    def rows(self) -> int:
        return -(-self.size // self.row_width)

    @property
    def keys(self) -> npt.NDArray[np.int64]:
        return np.arange(self.rows, dtype=np.int64)

    def to_rows(self, flat: npt.ArrayLike) -> npt.NDArray[np.float32]:
        flat = np.asarray(flat, dtype=np.float32).reshape(-1)
        if flat.shape[0] != self.size:
            raise ValueError(f"dense {self.name!r} has {self.size} elements, got {flat.shape[0]}")
        padded = np.zeros(self.rows * self.row_width, dtype=np.float32)
        padded[: self.size] = flat
        return padded.reshape(self.rows, self.row_width)

    def from_rows(self, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return rows.reshape(-1)[: self.size].copy()


class PSClient:
    """A connection to every shard of a cluster, in shard order."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        max_message_mb: int = 64,
        timeout: float = 120.0,
        retries: int = 5,
        backoff_seconds: float = 0.05,
    ) -> None:
        if not addresses:
            raise ValueError("PSClient needs at least one shard address, e.g. ['127.0.0.1:7001']")
        self.addresses = list(addresses)
        self.max_message_bytes = max_message_mb * 2**20
        self.timeout = timeout
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        options = channel_options(self.max_message_bytes)
        self._channels = [grpc.insecure_channel(a, options=options) for a in self.addresses]
        self._stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self._channels]
        # Pull answers arrive as raw bytes and are decoded straight into NumPy
        # (wire.decode_message): two fewer copies of the bulk payload.
        self._raw_pulls: list[grpc.UnaryUnaryMultiCallable[ps_pb2.PullRequest, bytes]] = [
            c.unary_unary(
                "/heraldps.v1.ParameterServer/Pull",
                request_serializer=ps_pb2.PullRequest.SerializeToString,
                response_deserializer=None,
            )
            for c in self._channels
        ]
        self._widths: dict[str, tuple[int, int]] = {}
        self._shard_limit: int | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def num_shards(self) -> int:
        return len(self._stubs)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until every shard's channel is connected."""
        for address, channel in zip(self.addresses, self._channels, strict=True):
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                raise TimeoutError(f"shard {address} not reachable within {timeout}s") from None

    # ----- transport --------------------------------------------------------
    def committed_iteration(self) -> int:
        """The oldest last-committed iteration over the shards (-1 before any commit)."""
        return min(self.shard_committed_iterations())

    def shard_committed_iterations(self) -> list[int]:
        """Each shard's last committed iteration, in shard order (-1 before any commit)."""
        infos = self._all_shards("GetShardInfo", ps_pb2.GetShardInfoRequest())
        return [int(info.committed_iteration) for info in infos]

    def _call(self, shard: int, method: str, request: Any, idempotent: bool) -> Callable[[], Any]:
        """Start one RPC now; the returned function waits for it (retrying if allowed)."""
        rpc = self._raw_pulls[shard] if method == "Pull" else getattr(self._stubs[shard], method)
        future = rpc.future(request, timeout=self.timeout)

        def result() -> Any:
            nonlocal future
            attempt = 0
            while True:
                try:
                    return future.result()
                except grpc.RpcError as err:
                    self._back_off_or_raise(err, attempt, idempotent)
                    attempt += 1
                    future = rpc.future(request, timeout=self.timeout)

        return result

    def _back_off_or_raise(self, err: grpc.RpcError, attempt: int, idempotent: bool) -> None:
        """Sleep before retry ``attempt + 1``, or re-raise when the call may not be retried."""
        code = err.code() if hasattr(err, "code") else None
        if not idempotent or code not in _RETRYABLE or attempt >= self.retries:
            raise err
        time.sleep(self.backoff_seconds * (2**attempt) * (0.5 + random.random()))

    def _all_shards(self, method: str, request: Any, idempotent: bool = True) -> list[Any]:
        waits = [self._call(s, method, request, idempotent) for s in range(self.num_shards)]
        return [wait() for wait in waits]

    def _message_limit(self) -> int:
        """The smallest message limit of this client and every shard (asked once)."""
        if self._shard_limit is None:
            infos = self._all_shards("GetShardInfo", ps_pb2.GetShardInfoRequest())
            self._shard_limit = min(i.max_message_bytes or self.max_message_bytes for i in infos)
        return min(self.max_message_bytes, self._shard_limit)

    def _widths_of(self, table: str) -> tuple[int, int]:
        if table not in self._widths:
            info = self._call(0, "DescribeTable", ps_pb2.DescribeTableRequest(table=table), True)()
            self._widths[table] = (info.spec.dim, info.state_width)
        return self._widths[table]

    def _chunks(
        self, keys: npt.NDArray[np.int64], row_bytes: int
    ) -> Iterator[tuple[int, npt.NDArray[np.intp] | slice]]:
        """(shard, index into ``keys``) of each request, each under the message limit.

        With one shard the index is a slice, so requests and results are plain
        contiguous copies instead of gathers and scatters.
        """
        per_request = max(1, int(self._message_limit() * _MESSAGE_FILL) // max(row_bytes, 1))
        if self.num_shards == 1:
            for start in range(0, keys.shape[0], per_request):
                yield 0, slice(start, min(start + per_request, keys.shape[0]))
            return
        order, slices = split_by_shard(keys, self.num_shards)
        for shard, part in enumerate(slices):
            positions = order[part]
            for start in range(0, positions.shape[0], per_request):
                yield shard, positions[start : start + per_request]

    # ----- tables -----------------------------------------------------------
    def create_table(
        self,
        name: str,
        dim: int,
        optimizer: Optimizer,
        initializer: Initializer | None = None,
        update_mode: str | UpdateMode = UpdateMode.SYNCHRONOUS,
    ) -> bool:
        """Create ``name`` on every shard; True if any shard created it (False: it existed)."""
        if isinstance(update_mode, str):
            update_mode = UpdateMode[update_mode.upper()]
        spec = TableSpec(name, dim, initializer or Zeros(), optimizer, update_mode)
        responses = self._all_shards("CreateTable", ps_pb2.CreateTableRequest(spec=spec.to_proto()))
        self._widths[name] = (dim, spec.state_width)
        return any(r.created for r in responses)

    def describe_table(self, name: str) -> TableStats:
        infos = self._all_shards("DescribeTable", ps_pb2.DescribeTableRequest(table=name))
        return _merge_infos(infos)

    def list_tables(self) -> dict[str, TableStats]:
        per_shard = self._all_shards("ListTables", ps_pb2.ListTablesRequest())
        by_name: dict[str, list[types_pb2.TableInfo]] = {}
        for response in per_shard:
            for info in response.tables:
                by_name.setdefault(info.spec.name, []).append(info)
        return {name: _merge_infos(infos) for name, infos in sorted(by_name.items())}

    # ----- pull -------------------------------------------------------------
    def pull(
        self, table: str, keys: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Values ``float32 [n, dim]`` and versions ``int64 [n]`` of ``keys``, in order."""
        values, versions, _ = self._pull(table, keys, with_state=False)
        return values, versions

    def pull_with_state(
        self, table: str, keys: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Values, versions and optimizer state ``float32 [n, state_width]`` of ``keys``."""
        return self._pull(table, keys, with_state=True)

    def pull_async(
        self, table: str, keys: npt.ArrayLike
    ) -> Future[tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]]:
        """``pull`` in the background; the future resolves to (values, versions)."""
        return self._background().submit(self.pull, table, keys)

    def _pull(
        self, table: str, keys: npt.ArrayLike, with_state: bool
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        keys = _as_keys(keys)
        dim, state_width = self._widths_of(table)
        sw = state_width if with_state else 0
        values = np.empty((keys.shape[0], dim), dtype=np.float32)
        versions = np.empty(keys.shape[0], dtype=np.int64)
        state = np.empty((keys.shape[0], sw), dtype=np.float32)
        pending = []
        for shard, index in self._chunks(keys, 8 + 4 * (dim + sw)):
            request = ps_pb2.PullRequest(
                table=table, keys=wire.encode_keys(keys[index]), with_state=with_state
            )
            pending.append((index, self._call(shard, "Pull", request, idempotent=True)))
        fields = ps_pb2.PullResponse.DESCRIPTOR.fields_by_name
        values_field, versions_field = fields["values"].number, fields["versions"].number
        state_field = fields["state"].number
        for index, wait in pending:
            response = wire.decode_message(wait())
            n = _count(index, keys.shape[0])
            values[index] = wire.decode_rows(
                wire.len_field(response, values_field), n, dim, "values", check_finite=False
            )
            versions[index] = wire.decode_keys(wire.len_field(response, versions_field), "versions")
            if with_state:
                state[index] = wire.decode_rows(
                    wire.len_field(response, state_field), n, sw, "state", check_finite=False
                )
        return values, versions, state

    def versions(self, table: str, keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Clocks ``int64 [n]`` of ``keys`` in order, without their rows (0: never seen)."""
        keys = _as_keys(keys)
        out = np.empty(keys.shape[0], dtype=np.int64)
        pending = []
        for shard, index in self._chunks(keys, 16):
            request = ps_pb2.GetVersionsRequest(table=table, keys=wire.encode_keys(keys[index]))
            pending.append((index, self._call(shard, "GetVersions", request, idempotent=True)))
        for index, wait in pending:
            out[index] = wire.decode_keys(wait().versions, "versions")
        return out

    def prefetch(self, table: str, keys: npt.ArrayLike) -> int:
        """Load the rows of ``keys`` into the shards' host caches; return rows now cached."""
        keys = _as_keys(keys)
        waits = [
            self._call(shard, "Prefetch",
                       ps_pb2.PrefetchRequest(table=table, keys=wire.encode_keys(keys[index])),
                       idempotent=True)
            for shard, index in self._chunks(keys, 8)
        ]  # fmt: skip
        return sum(int(wait().cached_rows) for wait in waits)

    def prefetch_keyset(self, table: str, path: str) -> int:
        """``prefetch`` of a HugeCTR keyset file (binary native-endian int64 keys)."""
        return self.prefetch(table, read_keyset(path))

    # ----- push / commit / write-back ----------------------------------------
    def push_gradients(
        self, table: str, keys: npt.ArrayLike, grads: npt.ArrayLike, iteration: int
    ) -> None:
        """Add ``grads [n, dim]`` to iteration ``iteration``'s buffer (duplicates summed)."""
        keys = _as_keys(keys)
        dim, _ = self._widths_of(table)
        grads = _as_rows(grads, keys.shape[0], dim, "grads")
        waits = []
        for shard, index in self._chunks(keys, 8 + 4 * dim):
            request = ps_pb2.PushGradientsRequest(
                table=table,
                iteration=iteration,
                keys=wire.encode_keys(keys[index]),
                grads=wire.encode_floats(grads[index]),
            )
            waits.append(self._call(shard, "PushGradients", request, idempotent=False))
        for wait in waits:
            wait()

    def push_gradients_async(
        self, table: str, keys: npt.ArrayLike, grads: npt.ArrayLike, iteration: int
    ) -> Future[None]:
        return self._background().submit(self.push_gradients, table, keys, grads, iteration)

    def commit(self, iteration: int) -> int:
        """Commit ``iteration`` on every shard; return the rows updated (0 if already done)."""
        responses = self._all_shards("Commit", ps_pb2.CommitRequest(iteration=iteration))
        return sum(r.rows_updated for r in responses)

    def write_back(
        self,
        table: str,
        keys: npt.ArrayLike,
        values: npt.ArrayLike,
        state: npt.ArrayLike | None,
        base_versions: npt.ArrayLike,
        new_versions: npt.ArrayLike,
    ) -> None:
        """Store rows a worker updated where each stored version equals its base (else ABORTED)."""
        keys = _as_keys(keys)
        n = keys.shape[0]
        dim, state_width = self._widths_of(table)
        values = _as_rows(values, n, dim, "values")
        state = _as_rows(
            np.empty((n, 0), np.float32) if state is None else state, n, state_width, "state"
        )
        base = _as_keys(base_versions)
        new = _as_keys(new_versions)
        waits = []
        for shard, index in self._chunks(keys, 24 + 4 * (dim + state_width)):
            request = ps_pb2.WriteBackRequest(
                table=table,
                keys=wire.encode_keys(keys[index]),
                values=wire.encode_floats(values[index]),
                state=wire.encode_floats(state[index]),
                base_versions=wire.encode_keys(base[index]),
                new_versions=wire.encode_keys(new[index]),
            )
            waits.append(self._call(shard, "WriteBack", request, idempotent=False))
        for wait in waits:
            wait()

    # ----- dense parameters -------------------------------------------------
    def create_dense(
        self,
        name: str,
        size: int,
        optimizer: Optimizer,
        initial: npt.ArrayLike | None = None,
        row_width: int = DENSE_ROW_WIDTH,
    ) -> DenseParameter:
        """Store a dense tensor (e.g. MLP weights) as rows of a table.

        The flat tensor is cut into rows of ``row_width`` floats (the last one
        zero-padded) under keys ``0..rows-1``; it trains with the same
        push/commit semantics as embeddings. ``initial`` is written only
        while the rows are untouched (version 0).
        """
        dense = DenseParameter(name, size, min(row_width, size))
        self.create_table(name, dense.row_width, optimizer, Zeros())
        if initial is not None:
            rows = dense.to_rows(initial)
            state = optimizer.init_state(dense.rows, dense.row_width)
            zeros = np.zeros(dense.rows, dtype=np.int64)
            self.write_back(name, dense.keys, rows, state, zeros, zeros)
        return dense

    def pull_dense(self, dense: DenseParameter) -> npt.NDArray[np.float32]:
        values, _ = self.pull(dense.name, dense.keys)
        return dense.from_rows(values)

    def push_dense_gradients(
        self, dense: DenseParameter, grad: npt.ArrayLike, iteration: int
    ) -> None:
        self.push_gradients(dense.name, dense.keys, dense.to_rows(grad), iteration)

    # ----- snapshots --------------------------------------------------------
    def save(self, path: str) -> int:
        """Snapshot every shard under ``path`` (a directory all shards can write); return rows."""
        return sum(r.rows for r in self._all_shards("Save", ps_pb2.SaveRequest(path=str(path))))

    def load(self, path: str) -> int:
        """Replace every shard's tables with a snapshot saved from any number of shards."""
        self._widths.clear()
        return sum(r.rows for r in self._all_shards("Load", ps_pb2.LoadRequest(path=str(path))))

    def export_incremental(self, since_iteration: int, table: str = "") -> dict[str, ExportedRows]:
        """Rows changed by commits after ``since_iteration`` (-1: every row), per table."""
        request = ps_pb2.ExportIncrementalRequest(since_iteration=since_iteration, table=table)
        blocks: dict[str, list[ps_pb2.RowBlock]] = {}
        for shard in range(self.num_shards):
            attempt = 0
            while True:
                try:
                    got = list(self._stubs[shard].ExportIncremental(request, timeout=self.timeout))
                    break
                except grpc.RpcError as err:
                    self._back_off_or_raise(err, attempt, idempotent=True)
                    attempt += 1
            for block in got:
                blocks.setdefault(block.table, []).append(block)
        return {name: _merge_blocks(parts) for name, parts in sorted(blocks.items())}

    def _background(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="psclient")
        return self._executor


def _count(index: npt.NDArray[np.intp] | slice, total: int) -> int:
    if isinstance(index, slice):
        return len(range(*index.indices(total)))
    return int(index.shape[0])


def _as_keys(keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
    array = np.asarray(keys)
    if array.ndim != 1:
        raise ValueError(f"keys must be 1-D, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"keys must be integers, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _as_rows(rows: npt.ArrayLike, n: int, width: int, what: str) -> npt.NDArray[np.float32]:
    array = np.ascontiguousarray(rows, dtype=np.float32)
    if array.shape != (n, width):
        raise ValueError(f"{what} must have shape ({n}, {width}), got {array.shape}")
    return array


def _merge_infos(infos: Sequence[types_pb2.TableInfo]) -> TableStats:
    first = infos[0]
    return TableStats(
        spec=TableSpec.from_proto(first.spec),
        state_width=first.state_width,
        rows=sum(i.rows for i in infos),
        bytes=sum(i.bytes for i in infos),
    )


def _merge_blocks(parts: list[ps_pb2.RowBlock]) -> ExportedRows:
    dim, sw = parts[0].dim, parts[0].state_width
    keys = np.concatenate([wire.decode_keys(p.keys) for p in parts])
    n = keys.shape[0]

    def floats(field: str, width: int) -> npt.NDArray[np.float32]:
        data = b"".join(getattr(p, field) for p in parts)
        return wire.decode_rows(data, n, width, field, check_finite=False)

    return ExportedRows(
        keys=keys,
        values=floats("values", dim),
        state=floats("state", sw),
        versions=np.concatenate([wire.decode_keys(p.versions) for p in parts]),
        changed_iterations=np.concatenate([wire.decode_keys(p.changed_iterations) for p in parts]),
    )


def read_keyset(path: str) -> npt.NDArray[np.int64]:
    """Keys of a HugeCTR keyset file: raw native-endian int64, no header."""
    raw = np.fromfile(path, dtype=np.dtype("=i8"))
    return raw.astype(np.int64, copy=False)


def write_keyset(path: str, keys: npt.ArrayLike) -> int:
    """Write distinct ``keys`` (sorted) as a HugeCTR keyset file; return how many."""
    unique = np.unique(np.asarray(keys, dtype=np.int64))
    unique.astype(np.dtype("=i8")).tofile(path)
    return int(unique.shape[0])
