"""A real cluster of shard servers on 127.0.0.1, driven through PSClient and raw stubs."""

from __future__ import annotations

import gc
import socket
import threading
import time
import urllib.request
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from heraldps import wire
from heraldps.client import PSClient
from heraldps.errors import (
    InvalidArgument,
    ResourceExhausted,
    StaleIteration,
    TableExists,
    Unavailable,
    UnknownTable,
    VersionConflict,
)
from heraldps.init import Normal, Uniform
from heraldps.optim import SGD, AdaGrad, Adam
from heraldps.v1 import ps_pb2, ps_pb2_grpc, types_pb2
from ps_server.server import PSConfig, PSServer
from tests.conftest import ClusterFactory


def test_readme_example(cluster: ClusterFactory) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=16, optimizer=SGD(lr=0.1), initializer=Normal(std=0.01, seed=7))
    keys = np.array([3, 1 << 40, 3], dtype=np.int64)
    values, versions = ps.pull("emb", keys)
    assert values.shape == (3, 16) and values.dtype == np.float32
    assert versions.tolist() == [0, 0, 0]
    ps.push_gradients("emb", keys, np.ones((3, 16), np.float32), iteration=0)
    assert ps.commit(iteration=0) == 2
    after, versions = ps.pull("emb", keys)
    np.testing.assert_allclose(after - values, [[-0.2] * 16, [-0.1] * 16, [-0.2] * 16], atol=1e-6)
    assert versions.tolist() == [1, 1, 1]


def test_rows_do_not_depend_on_shard_count(cluster: ClusterFactory) -> None:
    keys = np.random.default_rng(0).integers(-(2**60), 2**60, 3000)
    results = []
    for shards in (1, 3):
        _, ps = cluster(shards)
        ps.create_table("emb", dim=8, optimizer=AdaGrad(lr=0.1), initializer=Uniform(-1, 1, seed=4))
        results.append(ps.pull("emb", keys)[0])
        stats = ps.describe_table("emb")
        assert stats.rows == np.unique(keys).shape[0] and stats.state_width == 8
    assert np.array_equal(results[0], results[1])


def test_create_table_is_idempotent(cluster: ClusterFactory) -> None:
    _, ps = cluster(2)
    assert ps.create_table("t", dim=4, optimizer=Adam(lr=0.01)) is True
    assert ps.create_table("t", dim=4, optimizer=Adam(lr=0.01)) is False
    with pytest.raises(TableExists, match="different spec") as err:
        ps.create_table("t", dim=4, optimizer=Adam(lr=0.02))
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert err.value.reason == "TABLE_EXISTS" and err.value.address in ps.addresses
    assert list(ps.list_tables()) == ["t"]


def test_large_requests_are_chunked(cluster: ClusterFactory) -> None:
    """Shards accept 1 MiB; 40k keys x 32 floats is ~5 MiB per direction.

    The client is configured for 64 MiB and learns the shards' smaller limit.
    """
    _, ps = cluster(2, max_message_mb=1, client_max_message_mb=64)
    ps.create_table("big", dim=32, optimizer=SGD(lr=1.0), initializer=Normal(std=1, seed=2))
    keys = np.random.default_rng(1).permutation(40_000).astype(np.int64)
    values, _ = ps.pull("big", keys)
    assert np.array_equal(values, Normal(std=1, seed=2).generate(keys, 32))
    grads = np.ones((40_000, 32), np.float32)
    ps.push_gradients("big", keys, grads, iteration=0)
    ps.commit(0)
    after, versions = ps.pull("big", keys)
    np.testing.assert_allclose(after, values - 1, atol=1e-5)
    assert np.all(versions == 1)
    exported = ps.export_incremental(-1)["big"]  # streamed in blocks that fit 1 MiB
    order = np.argsort(exported.keys)
    assert np.array_equal(exported.keys[order], np.arange(40_000))
    assert np.array_equal(exported.values[order], after[np.argsort(keys)])
    # Block by block, keeping part of each (what an exporter of a large table holds).
    blocks = ps.export_blocks(-1, "big", keep=lambda r: replace(r, state=r.state[:0]))
    assert len(blocks) > 2 and {name for name, _ in blocks} == {"big"}
    kept = np.concatenate([r.keys for _, r in blocks])
    assert np.array_equal(np.sort(kept), np.arange(40_000))
    assert all(r.state.shape[0] == 0 for _, r in blocks)


def test_oversized_message_is_resource_exhausted(cluster: ClusterFactory) -> None:
    servers, _ = cluster(1, max_message_mb=1)
    with grpc.insecure_channel(
        f"127.0.0.1:{servers[0].port}", options=[("grpc.max_send_message_length", 8 * 2**20)]
    ) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        stub.CreateTable(
            ps_pb2.CreateTableRequest(
                spec=types_pb2.TableSpec(
                    name="t",
                    dim=4,
                    optimizer=types_pb2.Optimizer(sgd=types_pb2.SgdOptimizer(lr=0.1)),
                )
            )
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.Pull(ps_pb2.PullRequest(table="t", keys=b"\0" * (2 * 2**20)))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # A response over the limit is refused before any row is created.
        keys = wire.encode_keys(np.arange(100_000))
        with pytest.raises(grpc.RpcError) as err:
            stub.Pull(ps_pb2.PullRequest(table="t", keys=keys))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "message limit" in (err.value.details() or "")
        assert servers[0].store.table("t").rows == 0


class RawShard:
    """A stub on one shard plus a way to read every stored row directly."""

    def __init__(self, ps: PSClient, port: int, server: object) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = ps_pb2_grpc.ParameterServerStub(self.channel)
        self.server = server

    def rows(self) -> tuple[np.ndarray, ...]:
        block = self.server.store.table("emb").snapshot()  # type: ignore[attr-defined]
        return block.keys, block.values, block.state, block.versions

    def expect(self, code: grpc.StatusCode, call: str, request: object, match: str) -> None:
        before = self.rows()
        with pytest.raises(grpc.RpcError) as err:
            getattr(self.stub, call)(request)
        assert err.value.code() == code, err.value.details()
        assert match in (err.value.details() or ""), err.value.details()
        for x, y in zip(before, self.rows(), strict=True):
            assert np.array_equal(x, y)


@pytest.fixture
def raw(cluster: ClusterFactory) -> RawShard:
    servers, ps = cluster(1)
    ps.create_table("emb", dim=4, optimizer=AdaGrad(lr=0.1), initializer=Normal(std=1, seed=1))
    keys = np.arange(10)
    ps.pull("emb", keys)
    ps.push_gradients("emb", keys, np.ones((10, 4)), iteration=0)
    ps.commit(0)
    return RawShard(ps, servers[0].port, servers[0])


INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _keys(*k: int) -> bytes:
    return wire.encode_keys(np.array(k, dtype=np.int64))


def _floats(rows: int, width: int, fill: float = 1.0) -> bytes:
    return wire.encode_floats(np.full((rows, width), fill, np.float32))


def test_bad_input_codes_and_untouched_rows(raw: RawShard) -> None:
    push = ps_pb2.PushGradientsRequest
    raw.expect(
        grpc.StatusCode.NOT_FOUND, "Pull", ps_pb2.PullRequest(table="nope", keys=_keys(1)), "nope"
    )
    raw.expect(INVALID, "Pull", ps_pb2.PullRequest(table="emb", keys=b"\1\2\3"), "multiple of 8")
    raw.expect(
        grpc.StatusCode.NOT_FOUND,
        "GetVersions",
        ps_pb2.GetVersionsRequest(table="nope", keys=_keys(1)),
        "nope",
    )
    raw.expect(
        INVALID, "GetVersions", ps_pb2.GetVersionsRequest(table="emb", keys=b"\1"), "multiple of 8"
    )
    raw.expect(
        INVALID,
        "PushGradients",
        push(table="emb", iteration=1, keys=_keys(1, 2), grads=_floats(2, 3)),
        "4 float32",
    )
    raw.expect(
        INVALID,
        "PushGradients",
        push(table="emb", iteration=1, keys=_keys(1, 2), grads=_floats(2, 4, float("nan"))),
        "NaN",
    )
    raw.expect(
        INVALID,
        "PushGradients",
        push(table="emb", iteration=1, keys=_keys(1), grads=_floats(1, 4, float("inf"))),
        "Inf",
    )
    raw.expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "PushGradients",
        push(table="emb", iteration=0, keys=_keys(1), grads=_floats(1, 4)),
        "already committed",
    )
    raw.expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "Commit",
        ps_pb2.CommitRequest(iteration=-1),
        "already committed",
    )
    wb = ps_pb2.WriteBackRequest
    raw.expect(
        grpc.StatusCode.ABORTED,
        "WriteBack",
        wb(
            table="emb",
            keys=_keys(1, 2),
            values=_floats(2, 4),
            state=_floats(2, 4),
            base_versions=_keys(1, 0),
            new_versions=_keys(2, 1),
        ),
        "changed since",
    )
    raw.expect(
        INVALID,
        "WriteBack",
        wb(
            table="emb",
            keys=_keys(1),
            values=_floats(1, 4, float("nan")),
            state=_floats(1, 4),
            base_versions=_keys(1),
            new_versions=_keys(2),
        ),
        "NaN",
    )
    raw.expect(
        INVALID,
        "WriteBack",
        wb(
            table="emb",
            keys=_keys(1),
            values=_floats(1, 4),
            state=_floats(1, 2),
            base_versions=_keys(1),
            new_versions=_keys(2),
        ),
        "state",
    )
    raw.expect(
        INVALID,
        "WriteBack",
        wb(
            table="emb",
            keys=_keys(1),
            values=_floats(1, 4),
            state=_floats(1, 4),
            base_versions=_keys(1, 1),
            new_versions=_keys(2),
        ),
        "base_versions",
    )
    bad_spec = types_pb2.TableSpec(name="x", dim=-2, optimizer=SGD().to_proto())
    raw.expect(INVALID, "CreateTable", ps_pb2.CreateTableRequest(spec=bad_spec), "dim")
    no_opt = types_pb2.TableSpec(name="x", dim=2)
    raw.expect(INVALID, "CreateTable", ps_pb2.CreateTableRequest(spec=no_opt), "optimizer")
    raw.expect(
        grpc.StatusCode.ALREADY_EXISTS,
        "CreateTable",
        ps_pb2.CreateTableRequest(
            spec=types_pb2.TableSpec(name="emb", dim=5, optimizer=SGD().to_proto())
        ),
        "different spec",
    )
    raw.expect(INVALID, "Save", ps_pb2.SaveRequest(path=""), "path")
    raw.expect(INVALID, "Load", ps_pb2.LoadRequest(path="/nonexistent/snap"), "not a directory")


def test_memory_cap_over_grpc(cluster: ClusterFactory) -> None:
    servers, ps = cluster(1, memory_limit_gb=1 / 1024)  # 1 MiB
    ps.create_table("emb", dim=64, optimizer=AdaGrad())
    ps.pull("emb", np.arange(100))
    before = servers[0].store.table("emb").snapshot()
    with pytest.raises(ResourceExhausted, match="memory-limit-gb") as err:
        ps.pull("emb", np.arange(100, 10_000))
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.reason == "RESOURCE_EXHAUSTED"
    after = servers[0].store.table("emb").snapshot()
    assert np.array_equal(before.keys, after.keys) and np.array_equal(before.values, after.values)


def test_concurrent_clients_equal_serial(cluster: ClusterFactory) -> None:
    rng = np.random.default_rng(3)
    work = [
        (rng.integers(0, 300, 500), rng.normal(size=(500, 8)).astype(np.float32)) for _ in range(12)
    ]
    results = []
    for concurrent in (False, True):
        _, ps = cluster(2)
        ps.create_table("emb", dim=8, optimizer=SGD(lr=0.125), initializer=Normal(std=1, seed=3))
        clients = [PSClient(ps.addresses) for _ in work]
        if concurrent:
            threads = [
                threading.Thread(target=c.push_gradients, args=("emb", k, g, 0))
                for c, (k, g) in zip(clients, work, strict=True)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for c, (k, g) in zip(clients, work, strict=True):
                c.push_gradients("emb", k, g, 0)
        ps.commit(0)
        results.append(ps.pull_with_state("emb", np.arange(300)))
        for c in clients:
            c.close()
    assert np.array_equal(results[0][1], results[1][1])
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)


def test_write_back_and_dense(cluster: ClusterFactory) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=AdaGrad(lr=0.1, initial_accumulator=0.1))
    keys = np.arange(20)
    values, versions, state = ps.pull_with_state("emb", keys)
    opt = AdaGrad(lr=0.1, initial_accumulator=0.1)
    opt.apply(values, state, np.ones((20, 4), np.float32))
    ps.write_back("emb", keys, values, state, versions, versions + 1)
    got_v, got_ver, got_s = ps.pull_with_state("emb", keys)
    assert np.array_equal(got_v, values) and np.array_equal(got_s, state) and np.all(got_ver == 1)
    with pytest.raises(VersionConflict) as err:
        ps.write_back("emb", keys, values, state, versions, versions + 1)
    assert err.value.code == grpc.StatusCode.ABORTED and err.value.reason == "VERSION_CONFLICT"

    initial = np.linspace(-1, 1, 1000).astype(np.float32)
    dense = ps.create_dense("mlp", 1000, SGD(lr=0.5), initial=initial)
    assert dense.rows == 4
    assert np.array_equal(ps.pull_dense(dense), initial)
    ps.push_dense_gradients(dense, np.ones(1000, np.float32), iteration=0)
    ps.commit(0)
    np.testing.assert_allclose(ps.pull_dense(dense), initial - 0.5, atol=1e-6)


@pytest.mark.parametrize("wanted", ["some", "all", "none"])
def test_pull_some_state_brings_state_only_where_asked(
    cluster: ClusterFactory, wanted: str
) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=Adam(lr=0.01))
    keys = np.array([9, 2, 40, 7, 13, 5, 31, 0])
    ps.push_gradients("emb", keys[::2], np.ones((4, 4), np.float32), iteration=0)
    ps.commit(0)  # versions 1 and 0, state not at its initial value for half the rows
    values, versions, state = ps.pull_with_state("emb", keys)
    mask = {"some": np.arange(8) % 3 == 0, "all": np.ones(8, bool), "none": np.zeros(8, bool)}
    with_state = mask[wanted]
    got_values, got_versions, got_state = ps.pull_some_state_async("emb", keys, with_state).result()
    assert np.array_equal(got_values, values) and np.array_equal(got_versions, versions)
    assert got_state.shape == state.shape == (8, 2 * 4 + 1)  # Adam: two moments and a step
    assert np.array_equal(got_state[with_state], state[with_state])
    assert not got_state[~with_state].any()
    with pytest.raises(InvalidArgument, match="one per key"):
        ps.pull_some_state_async("emb", keys, with_state[:3]).result()


def test_versions_read_clocks_without_creating_rows(cluster: ClusterFactory) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    ps.pull("emb", np.arange(5))
    ps.push_gradients("emb", np.arange(3), np.ones((3, 4), np.float32), iteration=0)
    ps.commit(0)
    keys = np.array([4, 0, 99, 2, 0], dtype=np.int64)
    assert ps.versions("emb", keys).tolist() == [0, 1, 0, 1, 1]
    assert ps.describe_table("emb").rows == 5  # key 99 was not created


def test_save_load_and_export(cluster: ClusterFactory, tmp_path: Path) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=Adam(lr=0.01), initializer=Normal(std=1, seed=5))
    keys = np.arange(100)
    for it in range(3):
        ps.pull("emb", keys)
        ps.push_gradients("emb", keys[it::3], np.ones((keys[it::3].shape[0], 4)), iteration=it)
        ps.commit(it)
    assert ps.save(str(tmp_path / "snap")) == 100
    exported = ps.export_incremental(1)["emb"]
    assert sorted(exported.keys.tolist()) == keys[2::3].tolist()
    assert set(exported.changed_iterations.tolist()) == {2}
    assert len(ps.export_incremental(-1)["emb"].keys) == 100
    want = ps.pull_with_state("emb", keys)

    _, ps3 = cluster(3)
    assert ps3.load(str(tmp_path / "snap")) == 100
    got = ps3.pull_with_state("emb", keys)
    for x, y in zip(want, got, strict=True):
        assert np.array_equal(x, y)
    with pytest.raises(StaleIteration, match="already committed") as err:
        ps3.push_gradients("emb", keys, np.ones((100, 4)), iteration=2)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.reason == "STALE_ITERATION"
    assert sorted(p.name for p in (tmp_path / "snap").iterdir()) == [
        "shard-00000-of-00002",
        "shard-00001-of-00002",
    ]


def test_health_reflection_and_metrics(cluster: ClusterFactory) -> None:
    servers, ps = cluster(1)
    server = servers[0]
    ps.create_table("emb", dim=4, optimizer=SGD())
    ps.pull("emb", np.arange(7))
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "heraldps.v1.ParameterServer"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = list(
            refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        )
        names = {s.name for s in answers[0].list_services_response.service}
        assert "heraldps.v1.ParameterServer" in names
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read().decode()
    assert 'heraldps_ps_pull_keys_total{shard="0",table="emb"} 7.0' in text
    assert 'heraldps_ps_requests_total{code="OK",method="Pull",shard="0"} 1.0' in text
    assert 'heraldps_ps_rows{shard="0",table="emb"} 7.0' in text
    assert "heraldps_ps_request_seconds_bucket" in text


def test_graceful_stop_reports_not_serving_and_finishes_in_flight(cluster: ClusterFactory) -> None:
    servers, ps = cluster(1)
    server = servers[0]
    ps.create_table("emb", dim=64, optimizer=AdaGrad())
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    result: dict[str, object] = {}

    def big_pull() -> None:
        result["values"] = ps.pull("emb", np.arange(400_000))[0]

    parts = len(ps._requests(np.arange(400_000), 8 + 4 * 64))
    puller = threading.Thread(target=big_pull)
    puller.start()
    deadline = time.monotonic() + 10
    # Once the server has admitted every part of the pull, it is in flight.
    while server.admission.unary_in_flight < parts:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 10})
    stopper.start()
    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()  # an open Watch stream would hold the drain for the whole grace period
    puller.join()
    stopper.join()
    assert result["values"].shape == (400_000, 64)  # type: ignore[attr-defined]
    with pytest.raises(Unavailable) as err:
        ps.pull("emb", np.arange(3))
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert err.value.reason == ""  # from gRPC itself, not from a heraldps handler
    channel.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_idempotent_calls_retry_until_the_shard_is_up() -> None:
    port = _free_port()
    client = PSClient([f"127.0.0.1:{port}"], retries=10, backoff_seconds=0.05)
    with pytest.raises(Unavailable) as err:  # never retried: could apply a gradient twice
        client._unary(0, "PushGradients", ps_pb2.PushGradientsRequest(table="emb"), False).result()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert err.value.address == client.addresses[0]
    server = PSServer(PSConfig(host="127.0.0.1", port=port, grace_seconds=0))
    starter = threading.Timer(0.5, server.start)
    starter.start()
    try:
        client.create_table("emb", dim=4, optimizer=SGD(lr=1.0))  # retried while the port is closed
        values, _ = client.pull("emb", [1, 2])
        assert values.shape == (2, 4)
    finally:
        starter.join()
        client.close()
        server.stop(grace=0)


def test_async_variants(cluster: ClusterFactory) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=1.0))
    keys = np.arange(50)
    before, _ = ps.pull_async("emb", keys).result(timeout=30)
    ps.push_gradients_async("emb", keys, np.ones((50, 4)), iteration=0).result(timeout=30)
    ps.commit(0)
    after, versions = ps.pull_async("emb", keys).result(timeout=30)
    np.testing.assert_allclose(after, before - 1)
    assert np.all(versions == 1)


def test_generated_stub_reads_the_hand_encoded_pull(cluster: ClusterFactory) -> None:
    """Clients in any language parse Pull with their generated classes."""
    servers, ps = cluster(1)
    ps.create_table("emb", dim=3, optimizer=AdaGrad(), initializer=Normal(std=1, seed=4))
    keys = np.array([5, 6, 5])
    values, versions, state = ps.pull_with_state("emb", keys)
    with grpc.insecure_channel(f"127.0.0.1:{servers[0].port}") as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        answer = stub.Pull(ps_pb2.PullRequest(table="emb", keys=_keys(5, 6, 5), with_state=True))
    assert answer.dim == 3 and answer.state_width == 3
    assert answer.values == values.tobytes() and answer.state == state.tobytes()
    assert answer.versions == versions.tobytes()


def test_export_of_an_unknown_table_is_not_found(cluster: ClusterFactory) -> None:
    _, ps = cluster(1)
    with pytest.raises(UnknownTable, match="create it") as err:
        ps.export_incremental(-1, table="nope")
    assert err.value.code == grpc.StatusCode.NOT_FOUND and err.value.reason == "TABLE_NOT_FOUND"
    assert err.value.name == "nope"


def test_calls_leave_no_reference_cycles(cluster: ClusterFactory) -> None:
    """A cycle through a call's futures would keep each response (megabytes) alive until
    the cyclic GC runs, and every pull would fault in fresh memory (1.5x slower pulls)."""
    _, ps = cluster(2)
    ps.create_table("emb", dim=8, optimizer=SGD(lr=0.1))
    keys = np.arange(5000)
    ps.pull("emb", keys)  # learns the widths and the message limit
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        ps.pull("emb", keys)
        ps.pull_async("emb", keys).result(timeout=30)
        ps.push_gradients("emb", keys, np.ones((5000, 8)), iteration=0)
        ps.versions("emb", keys)
        gc.collect()
        ours = [
            type(o).__name__
            for o in gc.garbage
            if isinstance(o, Future | bytes) or type(o).__module__.startswith("heraldps")
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []


def test_pull_with_state_in_key_order_across_shards(cluster: ClusterFactory) -> None:
    """Each shard's answer is copied into the caller's order: three shards, duplicate keys
    and rows updated by a commit give what one shard gives."""
    keys = np.random.default_rng(5).integers(-(2**62), 2**62, 5000)
    keys = np.concatenate([keys, keys[:700]])
    results = []
    for shards in (1, 3):
        _, ps = cluster(shards)
        ps.create_table("emb", dim=5, optimizer=AdaGrad(lr=0.1), initializer=Normal(seed=9))
        ps.pull("emb", keys)
        ps.push_gradients("emb", keys[::3], np.ones((keys[::3].shape[0], 5)), iteration=0)
        ps.commit(0)
        results.append(ps.pull_with_state("emb", keys))
    for one, three in zip(*results, strict=True):
        assert np.array_equal(one, three)
    values, versions, state = results[0]
    assert np.array_equal(values[5000:], values[:700]) and np.array_equal(state[5000:], state[:700])
    assert set(versions.tolist()) == {0, 1} and (state != 0).any()
