"""``ShardClient``: the routing and transport core of ``PSClient`` (ps-lite's KVWorker).

It holds one channel per shard, routes each key to its shard with the
servers' hash, sends every shard its part at once, splits parts above the
message limit into several requests, and reassembles results in the caller's
key order. NumPy in, NumPy out; no loop over keys in Python. Every call is a
future of gRPC futures (``rpc``); the blocking methods wait on it.

Every call waits for every shard's answer before it reports, even when one
shard failed early. What is all-or-nothing across shards: a request the
client can check whole (``checks``: shapes, finiteness, steps, versions,
iterations) is refused before any part is sent; a write-back spanning shards
first reads every shard's versions and sends nothing on a conflict; table
creation and Load check every shard first (``tables``, ``snapshots``). What
stays per shard is listed in docs/clients.md ("All or nothing").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from heraldps import wire
from heraldps.client import checks, rpc
from heraldps.client.arguments import (
    as_counts,
    as_keys,
    as_rows,
    check_name,
    integer,
)
from heraldps.client.assemble import place
from heraldps.client.routing import Index, count, plan_requests
from heraldps.errors import Internal, InvalidArgument, Unavailable, VersionConflict, shown
from heraldps.optim import lr_scale_of
from heraldps.security import PLAIN, ClientSecurity, open_channel
from heraldps.serving import channel_options
from heraldps.v1 import ps_pb2, ps_pb2_grpc

# Leave room for protobuf framing inside the message limit.
_MESSAGE_FILL = 0.9
_PULL_FIELDS = ps_pb2.PullResponse.DESCRIPTOR.fields_by_name
_VALUES, _VERSIONS, _STATE = (_PULL_FIELDS[f].number for f in ("values", "versions", "state"))

Pulled = tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float32]]
Self = TypeVar("Self", bound="ShardClient")


class ShardClient:
    """A connection to every shard of a cluster, in shard order."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        max_message_mb: int = 64,
        timeout: float = 120.0,
        retries: int = 5,
        backoff_seconds: float = 0.05,
        security: ClientSecurity = PLAIN,
    ) -> None:
        """``security``: TLS files and the bearer token to present (docs/security.md)."""
        _check_addresses(addresses)
        self.addresses = list(addresses)
        self.max_message_bytes = integer(max_message_mb, "max_message_mb", 1, 2047) * 2**20
        self.timeout = _seconds(timeout, "timeout", positive=True)
        self.retries = integer(retries, "retries", 0, 1000)
        self.backoff_seconds = _seconds(backoff_seconds, "backoff_seconds", positive=False)
        self._policy = rpc.RetryPolicy(retries, backoff_seconds)
        options = channel_options(self.max_message_bytes)
        self._channels = [open_channel(a, options, security) for a in self.addresses]
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
        # The claim commit and load carry once this client claimed the shards
        # (heraldps.client.claims; a scheduler's). None: unfenced calls.
        self.fence: ps_pb2.Fence | None = None

    @property
    def num_shards(self) -> int:
        return len(self._stubs)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self: Self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until every shard's channel is connected."""
        for address, channel in zip(self.addresses, self._channels, strict=True):
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                raise Unavailable(
                    f"shard {address} not reachable within {timeout}s; is it running?",
                    address=address,
                ) from None

    # ----- transport --------------------------------------------------------
    def _call(self, shard: int, method: str, request: Any, idempotent: bool) -> rpc.Call:
        """One RPC on ``shard``, not sent yet."""
        call = self._raw_pulls[shard] if method == "Pull" else getattr(self._stubs[shard], method)
        address = self.addresses[shard]
        return rpc.Call(call, request, self.timeout, address, idempotent, self._policy)

    def _unary(self, shard: int, method: str, request: Any, idempotent: bool) -> Future[Any]:
        """Start one RPC on ``shard`` now; the future holds its response or typed error."""
        return self._call(shard, method, request, idempotent).start()

    def _all_shards(self, method: str, request: Any, idempotent: bool = True) -> list[Any]:
        """``request`` sent to every shard at once; the responses in shard order."""
        calls = [self._unary(s, method, request, idempotent) for s in range(self.num_shards)]
        return rpc.wait(rpc.gather(calls, list))

    def _message_limit(self) -> int:
        """The smallest message limit of this client and every shard (asked once)."""
        if self._shard_limit is None:
            infos = self._all_shards("GetShardInfo", ps_pb2.GetShardInfoRequest())
            self._shard_limit = min(i.max_message_bytes or self.max_message_bytes for i in infos)
        return min(self.max_message_bytes, self._shard_limit)

    def _widths_of(self, table: str) -> tuple[int, int]:
        """(dim, state width) of ``table``, asked once per table."""
        if table not in self._widths:
            check_name(table)
            request = ps_pb2.DescribeTableRequest(table=table)
            info = rpc.wait(self._unary(0, "DescribeTable", request, idempotent=True))
            self._widths[table] = (info.spec.dim, info.state_width)
        return self._widths[table]

    def _requests(self, keys: npt.NDArray[np.int64], row_bytes: int) -> list[tuple[int, Index]]:
        """(shard, index into ``keys``) of each request, each under the message limit."""
        per_request = max(1, int(self._message_limit() * _MESSAGE_FILL) // max(row_bytes, 1))
        return plan_requests(keys, self.num_shards, per_request)

    # ----- pull -------------------------------------------------------------
    def pull(
        self, table: str, keys: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Values ``float32 [n, dim]`` and versions ``int64 [n]`` of ``keys``, in order."""
        values, versions, _ = rpc.wait(self._pull(table, keys, with_state=False, blocking=True))
        return values, versions

    def pull_with_state(self, table: str, keys: npt.ArrayLike) -> Pulled:
        """Values, versions and optimizer state ``float32 [n, state_width]`` of ``keys``."""
        return rpc.wait(self._pull(table, keys, with_state=True, blocking=True))

    def pull_async(
        self, table: str, keys: npt.ArrayLike
    ) -> Future[tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]]:
        """``pull`` without waiting; the future resolves to (values, versions) or the error.

        The first call for a table asks a shard for its width before returning.
        """
        return rpc.gather([self._pull(table, keys, with_state=False)], lambda r: r[0][:2])

    def pull_with_state_async(self, table: str, keys: npt.ArrayLike) -> Future[Pulled]:
        """``pull_with_state`` without waiting; the future resolves to (values, versions,
        state) or the error. The first call for a table asks a shard for its width first."""
        return self._pull(table, keys, with_state=True)

    @rpc.reports_errors
    def pull_some_state_async(
        self, table: str, keys: npt.ArrayLike, with_state: npt.ArrayLike
    ) -> Future[Pulled]:
        """Values and versions of every key, optimizer state only where ``with_state``
        (bool, one per key) is set, zeros elsewhere; the future resolves to (values,
        versions, state) in ``keys`` order. A plan step asks for the state of the rows it
        updates itself and leaves the rest on the PS: half of a row's bytes with AdaGrad,
        two thirds with Adam."""
        keys = as_keys(keys)
        mask = np.asarray(with_state, dtype=bool)
        if mask.shape != keys.shape:
            raise InvalidArgument(
                f"with_state has {mask.shape[0] if mask.ndim else 0} flags for "
                f"{keys.shape[0]} keys: pass one per key"
            )
        if mask.all():
            return self._pull(table, keys, with_state=True)
        dim, state_width = self._widths_of(table)
        parts = [self._pull(table, keys[mask], with_state=True)] if mask.any() else []
        parts.append(self._pull(table, keys[~mask], with_state=False))

        def join(pulled: list[Pulled]) -> Pulled:
            n = keys.shape[0]
            values = np.empty((n, dim), dtype=np.float32)
            versions = np.empty(n, dtype=np.int64)
            state = np.zeros((n, state_width), dtype=np.float32)
            if mask.any():
                values[mask], versions[mask], state[mask] = pulled[0]
            values[~mask], versions[~mask] = pulled[-1][:2]
            return values, versions, state

        return rpc.gather(parts, join)

    @rpc.reports_errors
    def _pull(
        self, table: str, keys: npt.ArrayLike, with_state: bool, blocking: bool = False
    ) -> Future[Pulled]:
        """``blocking``: the caller waits for the result anyway, so a pull of one request
        is made on its thread (``rpc.Call.run``)."""
        keys = as_keys(keys)
        n = keys.shape[0]
        dim, state_width = self._widths_of(table)
        sw = state_width if with_state else 0
        requests = self._requests(keys, 8 + 4 * (dim + sw))
        values = np.empty((n, dim), dtype=np.float32)
        versions = np.empty(n, dtype=np.int64)
        state = np.empty((n, sw), dtype=np.float32)

        def put(index: Index, answer: bytes) -> None:
            """One answer's rows copied once, into the caller's order, as it arrives."""
            fields = wire.decode_message(answer)
            rows = count(index, n)
            got = wire.len_field(fields, _VALUES)
            place(values, index, wire.decode_rows(got, rows, dim, "values", check_finite=False))
            clocks = wire.decode_keys(wire.len_field(fields, _VERSIONS), "versions")
            if clocks.shape[0] != rows:
                raise Internal(f"a shard answered {clocks.shape[0]} versions for {rows} keys")
            place(versions, index, clocks)
            if with_state:
                got = wire.len_field(fields, _STATE)
                place(state, index, wire.decode_rows(got, rows, sw, "state", check_finite=False))

        def request(index: Index) -> ps_pb2.PullRequest:
            return ps_pb2.PullRequest(
                table=table, keys=wire.encode_keys(keys[index]), with_state=with_state
            )

        if blocking and len(requests) == 1:
            shard, index = requests[0]
            put(index, self._call(shard, "Pull", request(index), True).run())
            return rpc.done((values, versions, state))
        calls = [
            rpc.then(self._unary(s, "Pull", request(index), True), functools.partial(put, index))
            for s, index in requests
        ]
        return rpc.gather(calls, lambda _: (values, versions, state))

    def versions(self, table: str, keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Clocks ``int64 [n]`` of ``keys`` in order, without their rows (0: never seen)."""
        return rpc.wait(self._versions(check_name(table), as_keys(keys)))

    def _versions(self, table: str, keys: npt.NDArray[np.int64]) -> Future[npt.NDArray[np.int64]]:
        requests = self._requests(keys, 16)
        calls = [
            self._unary(shard, "GetVersions", ps_pb2.GetVersionsRequest(
                table=table, keys=wire.encode_keys(keys[index])), idempotent=True)
            for shard, index in requests
        ]  # fmt: skip

        def assemble(answers: list[ps_pb2.GetVersionsResponse]) -> npt.NDArray[np.int64]:
            out = np.empty(keys.shape[0], dtype=np.int64)
            for (_, index), answer in zip(requests, answers, strict=True):
                out[index] = wire.decode_keys(answer.versions, "versions")
            return out

        return rpc.gather(calls, assemble)

    # ----- push / commit / write-back ----------------------------------------
    def push_gradients(
        self,
        table: str,
        keys: npt.ArrayLike,
        grads: npt.ArrayLike,
        iteration: int,
        steps: npt.ArrayLike | None = None,
        worker: int = 0,
    ) -> None:
        """Add ``grads [n, dim]`` to iteration ``iteration``'s buffer (duplicates summed).
        ``steps [n]`` (optional): optimizer steps each row stands for, applied as that many
        steps of ``grads / steps`` (see ``PushGradientsRequest.steps``). ``worker``: the
        pushing worker's id; the PS adds workers' sums in worker order, so reruns of a job
        give the same bits (``PushGradientsRequest.worker``)."""
        rpc.wait(self.push_gradients_async(table, keys, grads, iteration, steps, worker))

    @rpc.reports_errors
    def push_gradients_async(
        self,
        table: str,
        keys: npt.ArrayLike,
        grads: npt.ArrayLike,
        iteration: int,
        steps: npt.ArrayLike | None = None,
        worker: int = 0,
    ) -> Future[None]:
        """``push_gradients`` without waiting; the future resolves to None or the error."""
        keys = as_keys(keys)
        iteration = integer(iteration, "push: iteration")
        worker = integer(worker, "push: worker", 0, 2**31 - 1)
        dim, _ = self._widths_of(table)
        grads = as_rows(grads, keys.shape[0], dim, "grads")
        counts = None if steps is None else as_counts(steps, keys.shape[0], "steps")
        checks.finite_rows(grads, "push: grads")
        checks.iteration("push", iteration)
        if counts is not None:
            checks.steps(counts)

        def request(index: Index) -> ps_pb2.PushGradientsRequest:
            return ps_pb2.PushGradientsRequest(
                table=table, iteration=iteration, keys=wire.encode_keys(keys[index]),
                grads=wire.encode_floats(grads[index]),
                steps=b"" if counts is None else wire.encode_counts(counts[index]),
                worker=worker,
            )  # fmt: skip

        row_bytes = 8 + 4 * dim + (0 if counts is None else 4)
        calls = [
            self._unary(shard, "PushGradients", request(index), idempotent=False)
            for shard, index in self._requests(keys, row_bytes)
        ]
        return rpc.gather(calls, _nothing)

    def commit(self, iteration: int, lr_scale: float = 1.0) -> int:
        """Commit ``iteration`` on every shard, its optimizers' lr times ``lr_scale``; return
        the rows updated (0 if already done)."""
        iteration = integer(iteration, "commit: iteration")
        checks.iteration("commit", iteration)
        lr_scale_of(lr_scale)  # refused here, before any shard sees it
        request = ps_pb2.CommitRequest(iteration=iteration, fence=self.fence, lr_scale=lr_scale)
        responses = self._all_shards("Commit", request)
        return sum(r.rows_updated for r in responses)

    def committed_iteration(self) -> int:
        """The oldest last-committed iteration over the shards (-1 before any commit)."""
        return min(self.shard_committed_iterations())

    def shard_committed_iterations(self) -> list[int]:
        """Each shard's last committed iteration, in shard order (-1 before any commit)."""
        infos = self._all_shards("GetShardInfo", ps_pb2.GetShardInfoRequest())
        return [int(info.committed_iteration) for info in infos]

    def write_back(
        self,
        table: str,
        keys: npt.ArrayLike,
        values: npt.ArrayLike,
        state: npt.ArrayLike | None,
        base_versions: npt.ArrayLike,
        new_versions: npt.ArrayLike,
        *,
        check_first: bool = True,
    ) -> None:
        """Store rows a worker updated where each stored version equals its base (else
        ``VersionConflict``). ``check_first``: see ``write_back_async``."""
        rpc.wait(self.write_back_async(table, keys, values, state, base_versions, new_versions,
                                       check_first=check_first))  # fmt: skip

    @rpc.reports_errors
    def write_back_async(
        self,
        table: str,
        keys: npt.ArrayLike,
        values: npt.ArrayLike,
        state: npt.ArrayLike | None,
        base_versions: npt.ArrayLike,
        new_versions: npt.ArrayLike,
        *,
        check_first: bool = True,
    ) -> Future[None]:
        """``write_back`` without waiting; the future resolves to None or the error.

        Spanning several requests, it first reads the stored versions of every key
        (one GetVersions per shard) and sends nothing if any differs from its base
        (``VersionConflict``); the shards check again as they write. That read costs
        a round trip; ``check_first=False`` skips it where a conflict cannot happen
        (a Herald plan's write-backs), leaving each shard's own check: a conflict then
        leaves the other shards' parts written.
        """
        keys = as_keys(keys)
        n = keys.shape[0]
        dim, state_width = self._widths_of(table)
        values = as_rows(values, n, dim, "values")
        state = as_rows(
            np.empty((n, 0), np.float32) if state is None else state, n, state_width, "state"
        )
        base = as_keys(base_versions, "base_versions")
        new = as_keys(new_versions, "new_versions")
        checks.write_back(keys, base, new)
        checks.finite_rows(values, "write_back: values")
        checks.finite_rows(state, "write_back: state")
        requests = [
            (shard, ps_pb2.WriteBackRequest(
                table=table, keys=wire.encode_keys(keys[index]),
                values=wire.encode_floats(values[index]), state=wire.encode_floats(state[index]),
                base_versions=wire.encode_keys(base[index]),
                new_versions=wire.encode_keys(new[index])))
            for shard, index in self._requests(keys, 24 + 4 * (dim + state_width))
        ]  # fmt: skip

        def send(_: object = None) -> Future[None]:
            calls = [self._unary(s, "WriteBack", r, idempotent=False) for s, r in requests]
            return rpc.gather(calls, _nothing)

        if len(requests) <= 1 or not check_first:  # one request is all-or-nothing alone
            return send()

        def check_then_send(stored: npt.NDArray[np.int64]) -> Future[None]:
            _unchanged(table, keys, stored, base)
            return send()

        return rpc.chain(self._versions(table, keys), check_then_send)


def _unchanged(
    table: str,
    keys: npt.NDArray[np.int64],
    stored: npt.NDArray[np.int64],
    base: npt.NDArray[np.int64],
) -> None:
    """A write-back's base versions still match every stored version (else nothing is sent)."""
    moved = stored != base
    if moved.any():
        i = int(np.flatnonzero(moved)[0])
        raise VersionConflict(
            f"write_back to {table!r} not sent: {int(moved.sum())} of {keys.shape[0]} rows "
            f"changed since they were read (key {keys[i]}: stored version {stored[i]}, "
            f"base_version {base[i]}); pull them again and retry"
        )


def _nothing(_: list[Any]) -> None:
    return None


def _check_addresses(addresses: Sequence[str]) -> None:
    """A list of ``host:port`` strings, one per shard (a bare string is refused: it would
    be taken as one address per character)."""
    if isinstance(addresses, str) or not all(isinstance(a, str) and a for a in addresses):
        raise InvalidArgument(
            f"PSClient needs a list of shard addresses, e.g. ['127.0.0.1:7001'], got "
            f"{shown(addresses)}"
        )
    if not addresses:
        raise InvalidArgument("PSClient needs at least one shard address, e.g. ['127.0.0.1:7001']")


def _seconds(value: float, what: str, positive: bool) -> float:
    """A finite number of seconds (> 0 when ``positive``, else >= 0)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what} must be a number of seconds, got {shown(value)}") from None
    in_range = seconds > 0.0 if positive else seconds >= 0.0
    if not in_range or seconds == float("inf"):  # NaN is not in range
        bound = ">" if positive else ">="
        raise InvalidArgument(f"{what} must be a finite number {bound} 0, got {seconds:g}")
    return seconds
