"""Load is all-or-nothing and checks everything (issue #14, section 1): a damaged, edited or
mixed snapshot is INVALID_ARGUMENT on real shards, and every shard is left exactly as it was."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition, HeraldError, InvalidArgument, ResourceExhausted
from heraldps.optim import Adam
from heraldps.v1 import ps_pb2, ps_pb2_grpc
from ps_server.server import PSConfig, PSServer
from tests.conftest import ClusterFactory

Shape = tuple[list[str], list[int], dict[str, tuple[np.ndarray, ...]]]


def train(ps: PSClient, iterations: range, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    if "emb" not in ps.list_tables():
        ps.create_table("emb", dim=4, optimizer=Adam(lr=0.01))
    for t in iterations:
        keys = np.unique(rng.integers(0, 400, 150))
        ps.push_gradients("emb", keys, rng.normal(0, 1, (keys.shape[0], 4)).astype(np.float32), t)
        ps.commit(t)


def state(ps: PSClient) -> Shape:
    """Tables, committed iterations and every row (keys, values, state, versions, changed)."""
    rows = {}
    for name, r in ps.export_incremental(-1).items():
        order = np.argsort(r.keys)
        rows[name] = (r.keys[order], r.values[order], r.state[order], r.versions[order],
                      r.changed_iterations[order])  # fmt: skip
    return list(ps.list_tables()), ps.shard_committed_iterations(), rows


def assert_same(a: Shape, b: Shape) -> None:
    assert a[0] == b[0] and a[1] == b[1] and a[2].keys() == b[2].keys()
    for name in a[2]:
        for x, y in zip(a[2][name], b[2][name], strict=True):
            assert np.array_equal(x, y)


SHARD0 = "shard-00000-of-00002"
SHARD1 = "shard-00001-of-00002"


def edit_meta(snap: Path, shard: str, change: Callable[[dict], None]) -> None:
    path = snap / shard / "meta.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def rewrite(snap: Path, shard: str, field: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    """Replace one array and record its new checksum: a consistent but wrong snapshot, as a
    buggy tool would write it (the content checks, not the checksum, must catch it)."""
    path = snap / shard / f"emb.{field}.npy"
    np.save(path, change(np.load(path)))
    record_sum(snap, shard, path)


def record_sum(snap: Path, shard: str, path: Path) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    edit_meta(snap, shard, lambda m: m["tables"][0]["sha256"].__setitem__(path.name, digest))


def setitem(index: object, value: object) -> Callable[[np.ndarray], np.ndarray]:
    def change(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[index] = value  # type: ignore[index]
        return a

    return change


def flip_byte(snap: Path) -> None:
    path = snap / SHARD0 / "emb.values.npy"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # a bit of the last value: still a readable .npy, silently different
    path.write_bytes(bytes(data))


def truncate(snap: Path, record: bool) -> None:
    path = snap / SHARD1 / "emb.state.npy"
    path.write_bytes(path.read_bytes()[:-20])
    if record:
        record_sum(snap, SHARD1, path)


def duplicate_across(snap: Path) -> None:
    other = int(np.load(snap / SHARD0 / "emb.keys.npy")[0])
    rewrite(snap, SHARD1, "keys", setitem(0, other))


def meta_field(field: str, value: object) -> Callable[[Path], None]:
    return lambda snap: [edit_meta(snap, s, lambda m: m.__setitem__(field, value))
                         for s in (SHARD0, SHARD1)]  # fmt: skip


def table_field(field: str, value: object) -> Callable[[Path], None]:
    return lambda snap: edit_meta(snap, SHARD0, lambda m: m["tables"][0].__setitem__(field, value))


def spec_dim(snap: Path) -> None:
    edit_meta(snap, SHARD0, lambda m: m["tables"][0]["spec"].__setitem__("dim", 0))
    edit_meta(snap, SHARD1, lambda m: m["tables"][0]["spec"].__setitem__("dim", 0))


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "iteration is a string": (meta_field("committed_iteration", "7"), "committed_iteration"),
    "iteration is a float": (meta_field("committed_iteration", 1.5), "committed_iteration"),
    "iteration below -1": (meta_field("committed_iteration", -5), "committed_iteration"),
    "iteration too large": (meta_field("committed_iteration", 2**63), "committed_iteration"),
    "NaN value": (lambda s: rewrite(s, SHARD0, "values", setitem((2, 1), np.nan)), "NaN"),
    "Inf state": (lambda s: rewrite(s, SHARD1, "state", setitem((0, 0), np.inf)), "NaN or Inf"),
    "duplicate key in a file": (
        lambda s: rewrite(s, SHARD0, "keys", lambda k: np.concatenate([k[:1], k[:-1]])),
        "twice",
    ),
    "duplicate key across shards": (duplicate_across, "two shard directories"),
    "negative version": (lambda s: rewrite(s, SHARD0, "versions", setitem(3, -1)), "versions"),
    "changed after the commit": (
        lambda s: rewrite(s, SHARD1, "changed", setitem(0, 99)),
        "changed",
    ),
    "float64 values": (
        lambda s: rewrite(s, SHARD0, "values", lambda v: v.astype(np.float64)),
        "float64",
    ),
    "wrong width": (lambda s: rewrite(s, SHARD0, "values", lambda v: v[:, :3]), "shape"),
    "flipped bit": (flip_byte, "sha256"),
    "truncated": (lambda s: truncate(s, record=False), "sha256"),
    "truncated, checksum updated": (lambda s: truncate(s, record=True), "not a readable .npy"),
    "missing file": (lambda s: (s / SHARD0 / "emb.changed.npy").unlink(), "missing"),
    "no checksum": (
        lambda s: edit_meta(s, SHARD0, lambda m: m["tables"][0].pop("sha256")),
        "sha256",
    ),
    "rows miscounted": (table_field("rows", 3), "rows"),
    "bad spec": (spec_dim, "dim"),
    "meta.json garbage": (
        lambda s: (s / SHARD1 / "meta.json").write_text("{not json"),
        "unreadable",
    ),
    "renamed shard folder": (
        lambda s: (s / SHARD1 / "meta.json").write_text(
            (s / SHARD1 / "meta.json").read_text().replace('"shard_index": 1', '"shard_index": 0')
        ),
        "",
    ),
}


@pytest.mark.parametrize("store", ["staged", "cached"])
def test_a_damaged_snapshot_is_refused_and_every_shard_is_left_as_it_was(
    cluster: ClusterFactory, tmp_path: Path, store: str
) -> None:
    extra = {"store": "cached", "data_dir": str(tmp_path / "data"), "cache_gb": 0.001}
    extra = extra if store == "cached" else {}
    _, ps = cluster(2, **extra)
    train(ps, range(3))
    good = tmp_path / "good"
    ps.save(str(good))
    train(ps, range(3, 5), seed=1)  # the shards now differ from the snapshot
    ps.pull("emb", np.arange(10))  # rows a pull creates: the checks below pull them again
    before = state(ps)
    for kind, (corrupt, words) in CORRUPTIONS.items():
        snap = tmp_path / kind.replace(" ", "-")
        shutil.copytree(good, snap)
        corrupt(snap)
        with pytest.raises((InvalidArgument, FailedPrecondition)) as err:
            ps.load(str(snap))
        assert isinstance(err.value, HeraldError) and words in err.value.message, (kind, err.value)
        if kind != "renamed shard folder":
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, (kind, err.value)
        assert_same(state(ps), before)
        ps.pull("emb", np.arange(10))  # still serving
    # load("") would read the server's working directory: refused, on the wire too.
    with pytest.raises(InvalidArgument, match="path is empty"):
        ps.load("")
    for address in ps.addresses:
        with grpc.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            with pytest.raises(grpc.RpcError) as raw:
                stub.Load(ps_pb2.LoadRequest(path=""))
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_same(state(ps), before)
    # The good snapshot still loads, and gives back iteration 2 exactly.
    ps.load(str(good))
    assert ps.shard_committed_iterations() == [2, 2]


def test_a_format_1_snapshot_without_checksums_still_loads_and_is_still_checked(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    _, ps = cluster(2)
    train(ps, range(2))
    ps.save(str(tmp_path / "v2"))
    want = state(ps)
    v1 = tmp_path / "v1"
    shutil.copytree(tmp_path / "v2", v1)
    for shard in (SHARD0, SHARD1):
        edit_meta(
            v1, shard, lambda m: (m.__setitem__("format_version", 1), m["tables"][0].pop("sha256"))
        )
    _, fresh = cluster(2)
    fresh.load(str(v1))
    assert_same(state(fresh), want)
    np.save(v1 / SHARD0 / "emb.values.npy", np.full_like(np.load(v1 / SHARD0 / "emb.values.npy"),
                                                         np.nan))  # fmt: skip
    with pytest.raises(InvalidArgument, match="NaN"):
        fresh.load(str(v1))
    assert_same(state(fresh), want)


def test_a_load_one_shard_cannot_take_changes_no_shard(tmp_path: Path) -> None:
    """Shard 1 has a memory cap the snapshot's part does not fit: every shard refuses, none
    loads (the client asks every shard to validate first and waits for all of them)."""
    servers = []
    try:
        for index, limit in ((0, None), (1, 0.0002)):
            server = PSServer(PSConfig(host="127.0.0.1", port=0, shard_index=index, num_shards=2,
                                       memory_limit_gb=limit, grace_seconds=0.5))  # fmt: skip
            server.start()
            servers.append(server)
        ps = PSClient([f"127.0.0.1:{s.port}" for s in servers])
        ps.create_table("emb", dim=4, optimizer=Adam(lr=0.01))
        ps.push_gradients("emb", np.arange(20), np.ones((20, 4), np.float32), 0)
        ps.commit(0)
        before = state(ps)
        big = tmp_path / "big"
        _write_big_snapshot(big)
        with pytest.raises(ResourceExhausted):
            ps.load(str(big))
        assert_same(state(ps), before)
        # A later good load is never overwritten by the failed one.
        small = tmp_path / "small"
        ps.save(str(small))
        ps.push_gradients("emb", np.arange(20), np.ones((20, 4), np.float32), 1)
        ps.commit(1)
        ps.load(str(small))
        assert_same(state(ps), before)
        ps.close()
    finally:
        for server in servers:
            server.stop(grace=0)


def _write_big_snapshot(path: Path) -> None:
    """A two-shard snapshot of 20,000 rows (about 1 MB per shard in memory)."""
    servers = [PSServer(PSConfig(host="127.0.0.1", port=0, shard_index=i, num_shards=2,
                                 grace_seconds=0.5)) for i in range(2)]  # fmt: skip
    for server in servers:
        server.start()
    try:
        with PSClient([f"127.0.0.1:{s.port}" for s in servers]) as ps:
            ps.create_table("emb", dim=4, optimizer=Adam(lr=0.01))
            ps.push_gradients("emb", np.arange(20_000), np.ones((20_000, 4), np.float32), 5)
            ps.commit(5)
            ps.save(str(path))
    finally:
        for server in servers:
            server.stop(grace=0)


def test_restore_at_start_checks_the_snapshot_the_same_way(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    _, ps = cluster(2)
    train(ps, range(2))
    good = tmp_path / "good"
    ps.save(str(good))
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    flip_byte(bad)
    with pytest.raises(InvalidArgument, match="sha256"):
        PSServer(PSConfig(host="127.0.0.1", port=0, shard_index=0, num_shards=2,
                          restore=str(bad)))  # fmt: skip
    server = PSServer(PSConfig(host="127.0.0.1", port=0, restore=str(good)))
    assert server.store.committed_iteration == 1 and server.store.table("emb").rows > 0


def test_a_validate_only_load_leaves_no_trace_in_the_lmdb_file(tmp_path: Path) -> None:
    from ps_server.cached_store import CachedStore
    from ps_server.cached_table import CachePolicy
    from ps_server.snapshot import read_for_shard

    servers = [PSServer(PSConfig(host="127.0.0.1", port=0, grace_seconds=0.5))]
    servers[0].start()
    try:
        with PSClient([f"127.0.0.1:{servers[0].port}"]) as ps:
            ps.create_table("fresh", dim=4, optimizer=Adam(lr=0.01))
            ps.pull("fresh", np.arange(50))
            ps.save(str(tmp_path / "snap"))
    finally:
        servers[0].stop(grace=0)
    store = CachedStore(tmp_path / "data", policy=CachePolicy(cache_bytes=1 << 20))
    try:
        iteration, tables = read_for_shard(tmp_path / "snap", 0, 1)
        assert store.replace_all(iteration, tables, apply=False) == 50
        with store.env.begin() as txn:
            names = [key for key, _ in txn.cursor()]
        assert names == [b"meta"] and store.tables() == []
        assert store.replace_all(iteration, tables) == 50
        assert [t.name for t in store.tables()] == ["fresh"] and store.table("fresh").rows == 50
    finally:
        store.close()
