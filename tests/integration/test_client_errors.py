"""Typed errors from real shards: the class, code, reason, message and shard of each failure."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from heraldps import wire
from heraldps.client import PSClient
from heraldps.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    HeraldError,
    NotFound,
    ResourceExhausted,
    Unavailable,
    UnknownTable,
)
from heraldps.optim import SGD, AdaGrad
from heraldps.v1 import ps_pb2, ps_pb2_grpc, types_pb2
from tests.conftest import ClusterFactory


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_not_found_arrives_as_unknown_table(cluster: ClusterFactory) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD())
    with pytest.raises(UnknownTable, match=r"table 'nope' does not exist.*create it") as err:
        ps.pull("nope", np.arange(3))
    error = err.value
    assert isinstance(error, NotFound) and isinstance(error, HeraldError)
    assert error.code == grpc.StatusCode.NOT_FOUND and error.reason == "TABLE_NOT_FOUND"
    assert error.address == ps.addresses[0] and error.name == "nope"
    assert "'emb'" in error.message and str(error).startswith(f"{ps.addresses[0]}: table 'nope'")
    assert isinstance(error.__cause__, grpc.RpcError)  # the raw status stays reachable


def test_a_plain_grpc_client_reads_the_error_info(cluster: ClusterFactory) -> None:
    """Clients in any language read the reason from the standard status details."""
    servers, _ = cluster(1)
    with grpc.insecure_channel(f"127.0.0.1:{servers[0].port}") as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Pull(ps_pb2.PullRequest(table="nope", keys=wire.encode_keys(np.arange(2))))
    call = err.value
    assert isinstance(call, grpc.Call)
    status = rpc_status.from_call(call)
    assert status is not None and status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert status.message == call.details() and "does not exist" in status.message
    infos = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert len(infos) == 1
    info = error_details_pb2.ErrorInfo()
    infos[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "TABLE_NOT_FOUND",
        "heraldps.io",
        {"table": "nope"},
    )


def test_an_unreachable_shard_is_unavailable_after_the_retries() -> None:
    address = f"127.0.0.1:{_free_port()}"
    retries, backoff = 2, 0.1
    with PSClient([address], retries=retries, backoff_seconds=backoff) as ps:
        started = time.monotonic()
        with pytest.raises(Unavailable) as err:
            ps.list_tables()
        waited = time.monotonic() - started
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.reason == ""
    assert err.value.address == address
    # Two backoffs of at least 0.5 * 0.1 s and 0.5 * 0.2 s: the call was retried.
    assert waited >= 0.5 * backoff * (2**retries - 1)


@pytest.fixture
def flaky_shard() -> Iterator[tuple[str, list[int]]]:
    """A stand-in shard (plain grpcio) whose Pull answers UNAVAILABLE twice, then the rows;
    yields its address and the Pull calls it saw (their key counts)."""
    seen: list[int] = []

    def describe(request: bytes, context: grpc.ServicerContext) -> bytes:
        spec = ps_pb2.DescribeTableRequest.FromString(request)
        info = types_pb2.TableInfo(rows=0)
        info.spec.name, info.spec.dim = spec.table, 2
        return bytes(info.SerializeToString())

    def pull(request: bytes, context: grpc.ServicerContext) -> bytes:
        keys = wire.decode_keys(ps_pb2.PullRequest.FromString(request).keys)
        seen.append(keys.shape[0])
        if len(seen) <= 2:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        values = np.repeat(keys[:, None].astype(np.float32), 2, axis=1)
        answer = ps_pb2.PullResponse(values=wire.encode_floats(values), dim=2,
                                     versions=wire.encode_keys(keys * 10))  # fmt: skip
        return bytes(answer.SerializeToString())

    def shard_info(request: bytes, context: grpc.ServicerContext) -> bytes:
        return bytes(ps_pb2.ShardInfo(num_shards=1, max_message_bytes=2**20).SerializeToString())

    handler = grpc.method_handlers_generic_handler(
        "heraldps.v1.ParameterServer",
        {
            "DescribeTable": grpc.unary_unary_rpc_method_handler(describe),
            "GetShardInfo": grpc.unary_unary_rpc_method_handler(shard_info),
            "Pull": grpc.unary_unary_rpc_method_handler(pull),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", seen
    server.stop(grace=0)


def test_a_blocking_pull_made_on_the_callers_thread_is_retried(
    flaky_shard: tuple[str, list[int]],
) -> None:
    """One shard: the pull runs on the caller's thread (``rpc.Call.run``), with the same
    retries on UNAVAILABLE as a pull sent as a future."""
    address, seen = flaky_shard
    keys = np.array([5, -1, 7], dtype=np.int64)
    with PSClient([address], backoff_seconds=0.01) as ps:
        values, versions = ps.pull("emb", keys)
        assert seen == [3, 3, 3]
        assert np.array_equal(values, [[5, 5], [-1, -1], [7, 7]])
        assert versions.tolist() == [50, -10, 70]
        seen.clear()
        with (
            PSClient([address], retries=1, backoff_seconds=0.01) as impatient,
            pytest.raises(Unavailable, match="restarting") as err,
        ):
            impatient.pull("emb", keys)
        assert seen == [3, 3] and err.value.address == address


def test_an_async_pull_fails_through_its_future(cluster: ClusterFactory) -> None:
    servers, ps = cluster(1, memory_limit_gb=1 / 1024)  # 1 MiB
    ps.create_table("emb", dim=64, optimizer=AdaGrad())
    pending = ps.pull_async("emb", np.arange(10_000))  # the Pull itself is refused
    with pytest.raises(ResourceExhausted, match="memory-limit-gb") as err:
        pending.result(timeout=30)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.reason == "RESOURCE_EXHAUSTED"
    assert err.value.address == ps.addresses[0]
    assert servers[0].store.table("emb").rows == 0
    unknown = ps.pull_async("nope", np.arange(3))  # refused before any Pull: same channel
    with pytest.raises(UnknownTable):
        unknown.result(timeout=30)
    pushed = ps.push_gradients_async("nope", np.arange(3), np.ones((3, 64)), iteration=0)
    assert isinstance(pushed.exception(timeout=30), UnknownTable)


def test_a_deadline_is_deadline_exceeded(cluster: ClusterFactory) -> None:
    _, ps = cluster(1)
    ps.create_table("emb", dim=64, optimizer=SGD())
    # 50 ms is plenty for the small calls before it, not for creating and sending 51 MB.
    with PSClient(ps.addresses, timeout=0.05) as hurried, pytest.raises(DeadlineExceeded) as err:
        hurried.pull("emb", np.arange(200_000))
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.value.reason == ""  # set by gRPC, not by a heraldps handler
    assert err.value.address == ps.addresses[0]


@pytest.fixture
def foreign_server() -> Iterator[str]:
    """A non-heraldps server whose ListTables answers NOT_FOUND with its own ErrorInfo."""

    def list_tables(request: bytes, context: grpc.ServicerContext) -> bytes:
        info = error_details_pb2.ErrorInfo(reason="TABLE_NOT_FOUND", domain="example.com")
        status = status_pb2.Status(code=grpc.StatusCode.NOT_FOUND.value[0], message="no tables")
        status.details.add().Pack(info)
        context.abort_with_status(rpc_status.to_status(status))

    handler = grpc.method_handlers_generic_handler(
        "heraldps.v1.ParameterServer",
        {"ListTables": grpc.unary_unary_rpc_method_handler(list_tables)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=0)


def test_reasons_of_other_domains_keep_the_class_of_the_code(foreign_server: str) -> None:
    with PSClient([foreign_server]) as ps, pytest.raises(NotFound) as err:
        ps.list_tables()
    assert type(err.value) is NotFound  # not UnknownTable: the reason is example.com's
    assert err.value.reason == "TABLE_NOT_FOUND" and err.value.message == "no tables"


def test_blocking_inside_a_callback_is_refused_not_a_hang(cluster: ClusterFactory) -> None:
    """Callbacks run on gRPC's thread, which a blocking call there would stall for good."""
    _, ps = cluster(1)
    ps.create_table("emb", dim=4, optimizer=SGD())
    seen: list[BaseException] = []
    done = threading.Event()

    def pull_again(_: object) -> None:
        try:
            ps.pull("emb", np.arange(3))
        except FailedPrecondition as exc:  # a heraldps error, as every client check
            seen.append(exc)
        finally:
            done.set()

    # Creating 200k rows outlasts adding the callback, so it runs on gRPC's thread.
    ps.pull_async("emb", np.arange(200_000)).add_done_callback(pull_again)
    assert done.wait(30)
    assert len(seen) == 1 and "inside a callback" in str(seen[0])
    assert ps.pull("emb", np.arange(3))[0].shape == (3, 4)  # the client still works
