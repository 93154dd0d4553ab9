"""Finite input that would store a non-finite row is refused whole (issue #14, section 1):
a commit, an immediate push, an initializer, on real Staged-PS and Cached-PS shards."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps.client import PSClient
from heraldps.errors import InvalidArgument
from heraldps.init import Normal
from heraldps.optim import SGD, Adam
from heraldps.v1 import ps_pb2, ps_pb2_grpc, types_pb2
from tests.conftest import ClusterFactory

STORES = ["staged", "cached"]


def one_shard(cluster: ClusterFactory, tmp_path: Path, store: str) -> PSClient:
    extra = {"store": "cached", "data_dir": str(tmp_path / "data"), "cache_gb": 0.001}
    extra = extra if store == "cached" else {}
    return cluster(1, **extra)[1]


def everything(ps: PSClient) -> tuple[int, dict[str, tuple[np.ndarray, ...]]]:
    rows = {}
    for name, r in ps.export_incremental(-1).items():
        order = np.argsort(r.keys)
        rows[name] = (r.keys[order], r.values[order], r.state[order], r.versions[order],
                      r.changed_iterations[order])  # fmt: skip
    return ps.committed_iteration(), rows


def assert_unchanged(ps: PSClient, before: tuple[int, dict[str, tuple[np.ndarray, ...]]]) -> None:
    now = everything(ps)
    assert now[0] == before[0] and now[1].keys() == before[1].keys()
    for name in now[1]:
        for x, y in zip(now[1][name], before[1][name], strict=True):
            assert np.array_equal(x, y)


@pytest.mark.parametrize("store", STORES)
def test_a_commit_that_would_overflow_applies_nothing_on_any_table(
    cluster: ClusterFactory, tmp_path: Path, store: str
) -> None:
    ps = one_shard(cluster, tmp_path, store)
    ps.create_table("a", dim=2, optimizer=SGD(lr=1.0))
    ps.create_table("b", dim=2, optimizer=Adam(lr=0.01))
    keys = np.arange(10)
    ps.push_gradients("a", keys, np.ones((10, 2), np.float32), 0)
    ps.push_gradients("b", keys, np.ones((10, 2), np.float32), 0)
    ps.commit(0)
    ps.save(str(tmp_path / "snap"))
    before = everything(ps)
    # Iteration 1: table 'b' gets fine gradients; table 'a' gets two finite 3e38
    # gradients on key 5, summing to Inf in float32.
    ps.push_gradients("b", keys, np.ones((10, 2), np.float32), 1)
    ps.push_gradients("a", keys, np.ones((10, 2), np.float32), 1)
    ps.push_gradients("a", [5], np.full((1, 2), 3e38, np.float32), 1)
    ps.push_gradients("a", [5], np.full((1, 2), 3e38, np.float32), 1)
    for _ in range(2):  # the buffers stay: a retry fails the same way
        with pytest.raises(InvalidArgument, match="non-finite") as err:
            ps.commit(1)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "key 5" in err.value.message and "'a'" in err.value.message
        assert_unchanged(ps, before)
    # Loading a snapshot drops the buffers; training goes on from there.
    ps.load(str(tmp_path / "snap"))
    ps.push_gradients("a", keys, np.ones((10, 2), np.float32), 1)
    assert ps.commit(1) == 10
    assert np.all(np.isfinite(ps.pull("a", keys)[0]))


@pytest.mark.parametrize("store", STORES)
def test_a_huge_learning_rate_or_immediate_overflow_stores_nothing(
    cluster: ClusterFactory, tmp_path: Path, store: str
) -> None:
    ps = one_shard(cluster, tmp_path, store)
    ps.create_table("sgd", dim=3, optimizer=SGD(lr=1e30))
    ps.create_table("now", dim=3, optimizer=SGD(lr=1.0), update_mode="immediate")
    ps.push_gradients("sgd", np.arange(5), np.ones((5, 3), np.float32), 0)
    ps.commit(0)  # -1e30: finite
    ps.pull("now", np.arange(5))
    before = everything(ps)
    ps.push_gradients("sgd", np.arange(5), np.full((5, 3), 1e9, np.float32), 1)
    with pytest.raises(InvalidArgument, match="non-finite"):
        ps.commit(1)  # 1e30 * 1e9 = 1e39: -Inf
    with pytest.raises(InvalidArgument, match="non-finite"):
        ps.push_gradients("now", [1, 1, 2], np.full((3, 3), 3e38, np.float32), 0)
    assert_unchanged(ps, before)


@pytest.mark.parametrize("store", STORES)
def test_an_initializer_that_could_create_non_finite_rows_is_refused_at_create_time(
    cluster: ClusterFactory, tmp_path: Path, store: str
) -> None:
    ps = one_shard(cluster, tmp_path, store)
    with pytest.raises(InvalidArgument, match="float32"):
        ps.create_table("n", dim=4, optimizer=SGD(), initializer=Normal(mean=3e38, std=1e38))
    bad = [
        types_pb2.Initializer(normal=types_pb2.NormalInit(mean=3e38, std=1e38)),
        types_pb2.Initializer(normal=types_pb2.NormalInit(mean=0, std=1e38)),
    ]
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        for init in bad:  # straight to the shard, past the client's own check
            spec = types_pb2.TableSpec(name="n", dim=4, initializer=init,
                                       optimizer=SGD().to_proto())  # fmt: skip
            with pytest.raises(grpc.RpcError) as err:
                stub.CreateTable(ps_pb2.CreateTableRequest(spec=spec))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ps.list_tables() == {}
    # The largest normal initializer that fits is accepted and its rows are finite.
    ps.create_table("n", dim=64, optimizer=SGD(), initializer=Normal(mean=0, std=3e37))
    assert np.all(np.isfinite(ps.pull("n", np.arange(-500, 500))[0]))
