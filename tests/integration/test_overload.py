"""Overload on real servers: idle streams, bounded concurrency, retries, bad requests.

Issue #14 section 4: 16 idle ExportIncremental streams froze a shard and 8 idle
WatchPlans streams a scheduler; here 100 idle streams leave health and other
clients answering within 2 s, and calls over the concurrency limit are answered
RESOURCE_EXHAUSTED (OVERLOADED) at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from heraldps import wire
from heraldps.client import PSClient, rpc
from heraldps.errors import Overloaded, error_from_rpc
from heraldps.optim import SGD
from heraldps.serving import channel_options
from heraldps.v1 import ps_pb2, ps_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from ps_server.server import PSServer
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests.conftest import ClusterFactory

IDLE_STREAMS, CHANNELS = 100, 10
ANSWER_WITHIN = 2.0  # seconds: what a health probe or another client may wait


def _channels(port: int, count: int) -> list[grpc.Channel]:
    """Clients whose receive window stays at HTTP/2's 64 KiB (no BDP probing grows it),
    so a stream they do not read stalls the server's send for sure."""
    options = [("grpc.http2.bdp_probe", 0)]
    return [grpc.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(count)]


def _healthy(channel: grpc.Channel) -> bool:
    health = health_pb2_grpc.HealthStub(channel)
    answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=ANSWER_WITHIN)
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def servers_metric(server: PSServer, name: str, labels: dict[str, str]) -> float:
    value = server.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _wait_until(condition: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture
def big_shard(cluster: ClusterFactory) -> Iterator[tuple[PSServer, PSClient]]:
    """One shard whose export (30,000 rows of 64 floats, ~8 MB) is far larger than a
    stream's flow-control window, so a client that does not read blocks the send."""
    servers, ps = cluster(1, stream_stall_seconds=2.0)
    ps.create_table("emb", dim=64, optimizer=SGD(lr=0.1))
    keys = np.arange(30_000)
    ps.pull("emb", keys)
    ps.push_gradients("emb", keys, np.ones((30_000, 64), np.float32), iteration=0)
    ps.commit(0)
    yield servers[0], ps


def test_idle_export_streams_leave_a_shard_answering(
    big_shard: tuple[PSServer, PSClient],
) -> None:
    shard, ps = big_shard
    idle = _channels(shard.port, CHANNELS)
    export = ps_pb2.ExportIncrementalRequest(since_iteration=-1)
    streams = [
        ps_pb2_grpc.ParameterServerStub(idle[i % CHANNELS]).ExportIncremental(export)
        for i in range(IDLE_STREAMS)
    ]  # opened, never read
    time.sleep(0.5)
    other = grpc.insecure_channel(f"127.0.0.1:{shard.port}")
    stub = ps_pb2_grpc.ParameterServerStub(other)
    started = time.monotonic()
    assert _healthy(other)
    info = stub.GetShardInfo(ps_pb2.GetShardInfoRequest(), timeout=ANSWER_WITHIN)
    assert info.tables[0].rows == 30_000
    pull = ps_pb2.PullRequest(table="emb", keys=wire.encode_keys(np.arange(1000)))
    stub.Pull(pull, timeout=ANSWER_WITHIN)
    assert time.monotonic() - started < 3 * ANSWER_WITHIN
    # At most --max-streams (16) are open at once; the others are told so at once.
    assert shard.admission.streams_open <= shard.limits.max_streams
    rejected = [s for s in streams if s.done() and s.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
    error = error_from_rpc(rejected[0])  # type: ignore[arg-type]
    assert isinstance(error, Overloaded) and error.metadata["started"] == "false"
    # The open ones stall (their client reads nothing) and are cancelled after 2 s,
    # which frees their threads (and lets streams still arriving in); in the end a
    # reader gets the whole export. (A client that reads nothing never sees its own
    # stream end: gRPC delivers the status after the messages.)

    def counted(why: str) -> float:
        return servers_metric(shard, "heraldps_rpc_rejected_total", {"why": why})

    def ended() -> float:  # handled to the end or cancelled, and refused
        labels = {"shard": "0", "method": "ExportIncremental", "code": "OK"}
        return servers_metric(shard, "heraldps_ps_requests_total", labels)

    _wait_until(lambda: ended() + counted("stream_limit") == IDLE_STREAMS, 30)
    assert counted("stalled") >= 1 and counted("stream_limit") >= 1
    assert shard.admission.streams_open == 0
    for stream in streams:
        stream.cancel()
    assert ps.export_incremental(-1)["emb"].keys.shape == (30_000,)
    for channel in (*idle, other):
        channel.close()


def test_idle_plan_streams_leave_the_scheduler_answering() -> None:
    # --threads 8 was frozen by 8 idle WatchPlans streams before.
    server = SchedulerServer(
        SchedulerConfig(workers=2, cache_rows=10, host="127.0.0.1", port=0, threads=8,
                        grace_seconds=0)
    )  # fmt: skip
    server.start()
    idle = _channels(server.port, CHANNELS)
    try:
        for worker in (0, 1):
            scheduler_pb2_grpc.SchedulerStub(idle[0]).RegisterWorker(
                scheduler_pb2.RegisterWorkerRequest(worker_id=worker), timeout=5
            )
        streams = [
            scheduler_pb2_grpc.SchedulerStub(idle[i % CHANNELS]).WatchPlans(
                scheduler_pb2.WatchPlansRequest(worker_id=i % 2)
            )
            for i in range(IDLE_STREAMS)
        ]
        time.sleep(0.5)
        other = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        assert _healthy(other)
        status = scheduler_pb2_grpc.SchedulerStub(other).GetStatus(
            scheduler_pb2.GetStatusRequest(), timeout=ANSWER_WITHIN
        )
        assert status.num_workers == 2
        limit = server.limits.max_streams  # workers + 16
        assert server.admission.streams_open == limit
        _wait_until(lambda: sum(s.done() for s in streams) == IDLE_STREAMS - limit, 5)
        # The open ones end when their clients go away.
        for channel in idle:
            channel.close()
        _wait_until(lambda: server.admission.streams_open == 0, 5)
        other.close()
    finally:
        server.stop(grace=0)


def _slow_lists(stub: scheduler_pb2_grpc.SchedulerStub, count: int) -> list[grpc.Future]:
    """``count`` ListWorkers calls that each wait 2 s for a worker that never comes."""
    request = scheduler_pb2.ListWorkersRequest(wait_seconds=2)
    return [stub.ListWorkers.future(request, timeout=10) for _ in range(count)]


def test_calls_over_the_limit_are_refused_at_once_and_health_still_answers() -> None:
    server = SchedulerServer(
        SchedulerConfig(workers=1, cache_rows=10, host="127.0.0.1", port=0, threads=5,
                        max_concurrent_rpcs=6, grace_seconds=0)
    )  # fmt: skip
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    try:
        held = _slow_lists(stub, 6)  # 5 running, 1 waiting for a thread
        _wait_until(lambda: server.admission.unary_in_flight == 6, 5)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=5)
        assert time.monotonic() - started < 1.0  # refused, not queued
        error = error_from_rpc(err.value)
        assert isinstance(error, Overloaded)
        assert "--max-concurrent-rpcs" in error.message
        assert _healthy(channel)  # health checks skip the line
        for call in held:  # the admitted ones ran their wait and answered
            assert call.exception().code() == grpc.StatusCode.UNAVAILABLE
            assert "not registered an all-reduce address" in call.exception().details()
        status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=5)
        assert status.num_workers == 1
    finally:
        channel.close()
        server.stop(grace=0)


def push_concurrently(
    ps: PSClient, keys: np.ndarray, grads: np.ndarray, clients: int, pushes: int
) -> list[BaseException]:
    """``clients`` threads each pushing ``grads`` of ``keys`` to iteration 0 ``pushes``
    times on one PSClient; the errors they raised."""
    errors: list[BaseException] = []

    def push() -> None:
        try:
            for _ in range(pushes):
                ps.push_gradients("emb", keys, grads, iteration=0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=push) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_overloaded_pushes_are_retried_and_applied_once(cluster: ClusterFactory) -> None:
    """A shard that runs one call at a time and admits two: eight clients pushing at
    once are refused often, retry, and every gradient lands exactly once."""
    servers, ps = cluster(1, threads=1, max_concurrent_rpcs=1)
    ps.create_table("emb", dim=32, optimizer=SGD(lr=1.0))
    keys = np.arange(20_000)
    before, _ = ps.pull("emb", keys)
    clients, pushes = 8, 5
    grads = np.ones((20_000, 32), np.float32)
    assert push_concurrently(ps, keys, grads, clients, pushes) == []
    assert servers_metric(servers[0], "heraldps_rpc_rejected_total", {"why": "overloaded"}) > 0
    ps.commit(0)
    after, versions = ps.pull("emb", keys)
    np.testing.assert_allclose(after, before - clients * pushes, rtol=0, atol=1e-4)
    assert (versions == 1).all()


def test_unparsable_requests_are_invalid_argument_and_logged_once(
    cluster: ClusterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    servers, ps = cluster(1)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    keys = np.arange(10)
    before, versions_before = ps.pull("emb", keys)
    channel = grpc.insecure_channel(f"127.0.0.1:{servers[0].port}")
    garbage = b"\xff\xff\xff\xff"  # field 0x1f..., wire type 7: no protobuf message
    codes = []
    with caplog.at_level(logging.WARNING, logger="heraldps.admission"):
        for method in ("Pull", "PushGradients", "WriteBack", "Load") * 10:
            call = channel.unary_unary(f"/heraldps.v1.ParameterServer/{method}")
            with pytest.raises(grpc.RpcError) as err:
                call(garbage, timeout=5)
            codes.append(err.value.code())
            assert "not a valid protobuf message" in err.value.details()
    assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
    logged = [r for r in caplog.records if "does not parse" in r.getMessage()]
    assert len(logged) == 1  # once per client host, not per request
    assert servers_metric(servers[0], "heraldps_rpc_rejected_total", {"why": "unparsable"}) == 40
    after, versions_after = ps.pull("emb", keys)
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(versions_after, versions_before)
    channel.close()


def test_unparsable_scheduler_request_is_invalid_argument() -> None:
    server = SchedulerServer(
        SchedulerConfig(workers=1, cache_rows=10, host="127.0.0.1", port=0, grace_seconds=0)
    )
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        for method in ("ReportDone", "WatchPlans"):
            call = (channel.unary_stream if method == "WatchPlans" else channel.unary_unary)(
                f"/heraldps.v1.Scheduler/{method}"
            )
            with pytest.raises(grpc.RpcError) as err:
                result = call(b"\xff\xff\xff\xff", timeout=5)
                if method == "WatchPlans":
                    list(result)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()
        server.stop(grace=0)


def test_memory_limit_counts_request_and_response_buffers(cluster: ClusterFactory) -> None:
    """16 concurrent 64 MB GetVersions took a shard from 0.1 to 2.8 GB, none of it
    counted: now a call's request and response are charged while it runs."""
    servers, ps = cluster(1, memory_limit_gb=0.05)  # 51.2 MiB
    shard = servers[0]
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    ps.pull("emb", np.arange(100))
    held = shard.store.budget.used_bytes
    channel = grpc.insecure_channel(f"127.0.0.1:{shard.port}", options=channel_options(2**26))
    stub = ps_pb2_grpc.ParameterServerStub(channel)

    def versions(n: int) -> ps_pb2.GetVersionsResponse:
        keys = wire.encode_keys(np.arange(n, dtype=np.int64))
        return stub.GetVersions(ps_pb2.GetVersionsRequest(table="emb", keys=keys), timeout=30)

    # 1M keys: 8 MB request (16 MiB charged) + 24 MB response: fits.
    assert len(versions(1_000_000).versions) == 8_000_000
    # 3M keys: 46 MiB for the request and 69 MiB for the response: refused, nothing made.
    with pytest.raises(grpc.RpcError) as err:
        versions(3_000_000)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--memory-limit-gb" in err.value.details()
    assert not rpc.not_started(error_from_rpc(err.value))  # the handler's: never retried
    assert shard.store.budget.used_bytes == held  # every reservation released
    assert ps.describe_table("emb").rows == 100
    channel.close()


def test_pushes_over_a_budget_held_by_calls_in_flight_are_retried(cluster: ClusterFactory) -> None:
    """A budget full only because other admitted pushes hold their requests' bytes frees as
    they finish: the call is refused as not started (Overloaded), PSClient backs off and
    retries, and every gradient lands once. (It was a plain RESOURCE_EXHAUSTED, never
    retried: the worker, then the run, failed.)"""
    servers, ps = cluster(1, threads=1, max_concurrent_rpcs=8, memory_limit_gb=0.015)
    ps.create_table("emb", dim=32, optimizer=SGD(lr=1.0))
    keys = np.arange(20_000)
    grads = np.ones((20_000, 32), np.float32)
    before, _ = ps.pull("emb", keys)
    ps.push_gradients("emb", keys, grads, iteration=0)  # the buffer exists: pushes add no rows
    clients, pushes = 6, 3
    assert push_concurrently(ps, keys, grads, clients, pushes) == []
    assert servers_metric(servers[0], "heraldps_rpc_rejected_total", {"why": "overloaded"}) > 0
    ps.commit(0)
    after, _ = ps.pull("emb", keys)
    np.testing.assert_allclose(after, before - (1 + clients * pushes), rtol=0, atol=1e-3)
