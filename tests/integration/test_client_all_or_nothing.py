"""A request over several real shards is refused whole or applied whole (issue #14, section 1):
the client checks it before sending anything, and write-back and table creation check every
shard first. Also the clock limits (versions, iterations) and table names on the wire."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from heraldps import wire
from heraldps.client import PSClient
from heraldps.errors import InvalidArgument, TableExists, VersionConflict
from heraldps.limits import MAX_VERSION
from heraldps.optim import SGD, AdaGrad
from heraldps.sharding import shard_of
from heraldps.spec import TableSpec
from heraldps.v1 import ps_pb2, ps_pb2_grpc
from tests.conftest import ClusterFactory


def rows(ps: PSClient, table: str = "emb") -> tuple[np.ndarray, ...]:
    r = ps.export_incremental(-1, table)[table]
    order = np.argsort(r.keys)
    return r.keys[order], r.values[order], r.state[order], r.versions[order]


def same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def stubs(ps: PSClient) -> list[tuple[grpc.Channel, ps_pb2_grpc.ParameterServerStub]]:
    channels = [grpc.insecure_channel(a) for a in ps.addresses]
    return [(c, ps_pb2_grpc.ParameterServerStub(c)) for c in channels]


def raw_code(call: object, request: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call(request)  # type: ignore[operator]
    return err.value.code()  # type: ignore[no-any-return]


def test_a_push_with_nan_in_one_key_reaches_no_shard(cluster: ClusterFactory) -> None:
    _, ps = cluster(3)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    keys = np.arange(300)
    ps.pull("emb", keys)
    before = rows(ps)
    grads = np.ones((300, 4), np.float32)
    grads[123, 2] = np.nan
    with pytest.raises(InvalidArgument, match="row 123 contains NaN"):
        ps.push_gradients("emb", keys, grads, 0)
    with pytest.raises(InvalidArgument, match="steps"):
        ps.push_gradients("emb", keys, np.ones((300, 4)), 0, steps=np.r_[np.ones(299, int), 0])
    assert ps.commit(0) == 0  # no shard buffered anything
    assert same(rows(ps), before)


def test_a_spec_conflict_on_one_shard_creates_nothing_anywhere(cluster: ClusterFactory) -> None:
    _, ps = cluster(3)
    spec = TableSpec("t", 4, optimizer=SGD()).to_proto()
    connections = stubs(ps)
    connections[1][1].CreateTable(ps_pb2.CreateTableRequest(spec=spec))  # only shard 1
    with pytest.raises(TableExists, match="nothing was created on any shard") as err:
        ps.create_table("t", dim=8, optimizer=SGD())
    assert err.value.address == ps.addresses[1]
    tables = [[i.spec.dim for i in stub.ListTables(ps_pb2.ListTablesRequest()).tables]
              for _, stub in connections]  # fmt: skip
    assert tables == [[], [4], []]
    assert ps.create_table("t", dim=4, optimizer=SGD()) is True  # the same spec completes it
    for channel, _ in connections:
        channel.close()


def test_a_stale_write_back_over_shards_writes_nothing(cluster: ClusterFactory) -> None:
    _, ps = cluster(3)
    ps.create_table("emb", dim=2, optimizer=AdaGrad(lr=0.1))
    keys = np.arange(60)
    values, versions, state = ps.pull_with_state("emb", keys)
    moved = int(keys[shard_of(keys, 3) == 2][0])  # one key of shard 2 moves on
    ps.push_gradients("emb", [moved], np.ones((1, 2), np.float32), 0)
    ps.commit(0)
    before = rows(ps)
    with pytest.raises(VersionConflict, match=f"key {moved}: stored version 1, base_version 0"):
        ps.write_back("emb", keys, values + 1, state, versions, versions + 1)
    assert same(rows(ps), before)  # shards 0 and 1 wrote nothing either
    with pytest.raises(InvalidArgument, match="finite"):
        ps.write_back("emb", keys, np.full_like(values, np.inf), state, versions, versions + 1)
    assert same(rows(ps), before)
    # check_first=False skips the read: shard 2 refuses its part, the others write theirs.
    with pytest.raises(VersionConflict):
        ps.write_back("emb", keys, values, state, versions, versions + 1, check_first=False)
    others = shard_of(keys, 3) != 2
    assert np.all(ps.versions("emb", keys)[others] == 1)


def test_versions_and_iterations_cannot_wrap(cluster: ClusterFactory) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=2, optimizer=SGD())
    top = np.iinfo(np.int64).max
    with pytest.raises(InvalidArgument, match="2\\*\\*62"):
        ps.write_back("emb", [1], np.zeros((1, 2)), None, [0], [top])
    connections = stubs(ps)
    stub = connections[shard_of(np.array([1]), 2)[0]][1]
    request = ps_pb2.WriteBackRequest(
        table="emb", keys=wire.encode_keys([1]), values=wire.encode_floats(np.zeros((1, 2))),
        base_versions=wire.encode_keys([0]), new_versions=wire.encode_keys([top]),
    )  # fmt: skip
    assert raw_code(stub.WriteBack, request) == grpc.StatusCode.INVALID_ARGUMENT
    negative = ps_pb2.WriteBackRequest()
    negative.CopyFrom(request)
    negative.base_versions, negative.new_versions = wire.encode_keys([-5]), wire.encode_keys([3])
    assert raw_code(stub.WriteBack, negative) == grpc.StatusCode.INVALID_ARGUMENT
    # The largest version is accepted, and a commit on top of it stays positive.
    ps.write_back("emb", [1], np.zeros((1, 2)), None, [0], [MAX_VERSION])
    ps.push_gradients("emb", [1], np.ones((1, 2)), 0)
    ps.commit(0)
    assert ps.pull("emb", [1])[1].tolist() == [MAX_VERSION + 1]
    # Iterations: a push or commit past 2**62 is refused (it would also block training).
    push = ps_pb2.PushGradientsRequest(table="emb", iteration=top, keys=wire.encode_keys([1]),
                                       grads=wire.encode_floats(np.ones((1, 2))))  # fmt: skip
    assert raw_code(stub.PushGradients, push) == grpc.StatusCode.INVALID_ARGUMENT
    commit = ps_pb2.CommitRequest(iteration=top)
    assert raw_code(stub.Commit, commit) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InvalidArgument):
        ps.push_gradients("emb", [1], np.ones((1, 2)), top)
    assert ps.shard_committed_iterations() == [0, 0]
    for channel, _ in connections:
        channel.close()


def test_a_table_name_with_a_trailing_newline_is_refused(cluster: ClusterFactory) -> None:
    _, ps = cluster(1)
    with pytest.raises(InvalidArgument, match="invalid"):
        TableSpec("emb\n", 4)
    spec = ps_pb2.CreateTableRequest(spec=TableSpec("emb", 4).to_proto())
    spec.spec.name = "emb\n"
    [(channel, stub)] = stubs(ps)
    assert raw_code(stub.CreateTable, spec) == grpc.StatusCode.INVALID_ARGUMENT
    assert ps.list_tables() == {}
    channel.close()
