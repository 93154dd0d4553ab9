"""The Cached-PS (LMDB + host cache) through real gRPC servers: same answers as the
Staged-PS, durable restarts, clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import lmdb
import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.client import PSClient, read_keyset
from heraldps.data import DataSpec, read_all
from heraldps.errors import FailedPrecondition, ResourceExhausted, StaleIteration
from heraldps.init import Normal
from heraldps.optim import AdaGrad, Adam
from ps_server.cached_store import CachedStore
from ps_server.cached_table import CachePolicy
from ps_server.server import PSConfig, PSServer
from tests.conftest import ClusterFactory

TRAIN, _ = bundled_data()


def train(ps: PSClient, steps: int, seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Pulls, pushes, commits and write-backs; returns what every pull answered."""
    rng = np.random.default_rng(seed)
    ps.create_table("emb", dim=8, optimizer=AdaGrad(lr=0.1, initial_accumulator=0.1),
                    initializer=Normal(std=0.1, seed=3))  # fmt: skip
    ps.create_table("other", dim=3, optimizer=Adam(lr=0.01))
    seen = []
    for t in range(steps):
        keys = np.unique(rng.integers(-3000, 3000, 700))
        values, versions, state = ps.pull_with_state("emb", keys)
        seen.append((values, versions, state))
        ps.push_gradients("emb", keys, rng.normal(0, 1, (keys.shape[0], 8)).astype(np.float32), t)
        ps.push_gradients("other", keys[:50], np.ones((50, 3), np.float32), t)
        ps.commit(t)
        mine = keys[:40] + 100_000  # rows only this "worker" updates
        v, ver, s = ps.pull_with_state("emb", mine)
        ps.write_back("emb", mine, v * 0.5, s, ver, ver + 1)
    return seen


def all_rows(ps: PSClient, table: str) -> tuple[np.ndarray, ...]:
    rows = ps.export_incremental(-1, table)[table]
    order = np.argsort(rows.keys)
    return (rows.keys[order], rows.values[order], rows.state[order], rows.versions[order],
            rows.changed_iterations[order])  # fmt: skip


def test_cached_store_answers_exactly_like_the_staged_store(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    _, staged = cluster(2)
    # A cache of ~200 rows per table: far smaller than the ~6,000 rows trained, so rows
    # are evicted and re-read from LMDB all the time.
    _, cached = cluster(2, store="cached", data_dir=str(tmp_path), cache_gb=200 * 88 / 2**30)
    for a, b in zip(train(staged, 12), train(cached, 12), strict=True):
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x, y)
    for table in ("emb", "other"):
        for x, y in zip(all_rows(staged, table), all_rows(cached, table), strict=True):
            assert np.array_equal(x, y)
        assert staged.describe_table(table).rows == cached.describe_table(table).rows
    since = {t: r.keys.shape[0] for t, r in cached.export_incremental(9).items()}
    assert since == {t: r.keys.shape[0] for t, r in staged.export_incremental(9).items()}


def start_cached(path: Path, shard: int = 0, shards: int = 1, **extra: object) -> PSServer:
    extra.setdefault("cache_gb", 0.01)  # the 1 GiB default is touched per table: see conftest
    server = PSServer(PSConfig(host="127.0.0.1", port=0, shard_index=shard, num_shards=shards,
                               grace_seconds=0.5, store="cached", data_dir=str(path),
                               **extra))  # type: ignore[arg-type]  # fmt: skip
    server.start()
    return server


def test_a_restarted_shard_serves_the_last_commit(tmp_path: Path) -> None:
    server = start_cached(tmp_path, cache_gb=0.001)
    ps = PSClient([f"127.0.0.1:{server.port}"])
    train(ps, 5)
    before = all_rows(ps, "emb")
    ps.push_gradients("emb", np.arange(10), np.ones((10, 8), np.float32), 5)  # never committed
    ps.close()
    server.stop(grace=0)
    server = start_cached(tmp_path)
    ps = PSClient([f"127.0.0.1:{server.port}"])
    try:
        assert sorted(ps.list_tables()) == ["emb", "other"]
        after = all_rows(ps, "emb")
        for x, y in zip(before, after, strict=True):
            assert np.array_equal(x, y)
        with pytest.raises(StaleIteration) as err:  # iteration 4 is durable
            ps.commit(3)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.reason == "STALE_ITERATION"
        ps.commit(5)  # the uncommitted push of iteration 5 died with the process
        for x, y in zip(before[1:4], all_rows(ps, "emb")[1:4], strict=True):
            assert np.array_equal(x, y)
    finally:
        ps.close()
        server.stop(grace=0)


def test_one_row_read_from_disk_needs_no_kernel_of_its_own(tmp_path: Path) -> None:
    """A single row found on disk is copied without the compiled kernel: numpy calls its
    one-row field view C-contiguous, a signature the image's warmed kernels lack."""
    from ps_server.kernels import copy_rows

    server = start_cached(tmp_path)
    ps = PSClient([f"127.0.0.1:{server.port}"])
    try:
        train(ps, 2)
        stored = np.arange(-3000, 3000)
        stored = stored[ps.versions("emb", stored) > 0][:2]  # rows on disk
        assert stored.shape[0] == 2
        want = ps.pull_with_state("emb", stored)
        server.stop(grace=0)
        server = start_cached(tmp_path)  # a cold cache: every row comes from disk
        ps.close()
        ps = PSClient([f"127.0.0.1:{server.port}"])
        for at, key in enumerate(stored):
            got = ps.pull_with_state("emb", np.array([key]))
            for x, y in zip(want, got, strict=True):
                assert np.array_equal(x[at : at + 1], y)
        readonly_c = [
            s for s in copy_rows.signatures if s[2].layout == "C" and s[2].mutable is False
        ]
        assert not readonly_c, readonly_c
    finally:
        ps.close()
        server.stop(grace=0)


def test_wrong_directory_and_concurrent_use_are_refused(tmp_path: Path) -> None:
    store = CachedStore(tmp_path, 0, 2, CachePolicy(1 << 20))
    with pytest.raises(FailedPrecondition, match="in use by another"):
        CachedStore(tmp_path, 0, 2)
    store.close()
    # A shard directory copied to another shard's place is refused, not mixed in.
    (tmp_path / "shard-00000-of-00002").rename(tmp_path / "shard-00001-of-00003")
    with pytest.raises(FailedPrecondition, match="belongs to"):
        CachedStore(tmp_path, 1, 3)
    foreign = tmp_path / "foreign"
    (foreign / "shard-00000-of-00001").mkdir(parents=True)
    env = lmdb.open(str(foreign / "shard-00000-of-00001"), max_dbs=2)
    with env.begin(write=True) as txn:
        txn.put(b"something", b"else")
    env.close()
    with pytest.raises(FailedPrecondition, match="not written by heraldps"):
        CachedStore(foreign, 0, 1)
    junk = tmp_path / "junk" / "shard-00000-of-00001"
    junk.mkdir(parents=True)
    (junk / "data.mdb").write_bytes(b"not an lmdb file" * 1000)
    with pytest.raises(FailedPrecondition, match="cannot open"):
        CachedStore(tmp_path / "junk", 0, 1)


def test_disk_full_is_resource_exhausted_and_changes_nothing(tmp_path: Path) -> None:
    server = start_cached(tmp_path, max_disk_gb=2 / 1024)  # a 2 MiB map
    ps = PSClient([f"127.0.0.1:{server.port}"])
    try:
        ps.create_table("emb", dim=64, optimizer=AdaGrad(lr=0.1))
        keys = np.arange(20_000)
        ps.push_gradients("emb", keys, np.ones((20_000, 64), np.float32), 0)
        with pytest.raises(ResourceExhausted) as err:
            ps.commit(0)
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.value.reason == "RESOURCE_EXHAUSTED"
        assert "max-disk-gb" in err.value.message
        assert ps.describe_table("emb").rows == 0
        assert PSClient([f"127.0.0.1:{server.port}"]).versions("emb", keys[:5]).tolist() == [0] * 5
    finally:
        ps.close()
        server.stop(grace=0)


def test_snapshots_move_between_staged_and_cached(cluster: ClusterFactory, tmp_path: Path) -> None:
    _, staged = cluster(2)
    train(staged, 4)
    staged.save(str(tmp_path / "snap"))
    _, cached = cluster(3, store="cached", data_dir=str(tmp_path / "cached"))
    cached.load(str(tmp_path / "snap"))
    for x, y in zip(all_rows(staged, "emb"), all_rows(cached, "emb"), strict=True):
        assert np.array_equal(x, y)
    cached.save(str(tmp_path / "back"))
    _, again = cluster(1)
    again.load(str(tmp_path / "back"))
    for x, y in zip(all_rows(staged, "other"), all_rows(again, "other"), strict=True):
        assert np.array_equal(x, y)


def test_keyset_prefetch_fills_the_cache_before_the_pass(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    keyset = tmp_path / "pass0.keyset"
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "keyset", "--data", str(TRAIN), "--out",
         str(keyset)], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    keys = read_keyset(str(keyset))
    assert keyset.stat().st_size == 8 * keys.shape[0]
    assert np.array_equal(keys, np.unique(read_all(DataSpec(str(TRAIN))).keys))
    servers, cached = cluster(2, store="cached", data_dir=str(tmp_path / "d"), cache_gb=0.01)
    cached.create_table("emb", dim=8, optimizer=AdaGrad(lr=0.1))
    cached.push_gradients("emb", keys[:1000], np.ones((1000, 8), np.float32), 0)
    cached.commit(0)
    assert cached.prefetch_keyset("emb", str(keyset)) == keys.shape[0]
    caches = [server.store.table("emb").cache for server in servers]  # type: ignore[union-attr]
    before = sum(c.hits for c in caches)
    cached.pull("emb", keys)
    assert sum(c.hits for c in caches) - before == keys.shape[0]  # every row was a hit
    _, staged = cluster(1)
    staged.create_table("emb", dim=8, optimizer=AdaGrad(lr=0.1))
    staged.pull("emb", keys[:10])
    assert staged.prefetch("emb", keys[:20]) == 10  # a Staged-PS holds rows already


@pytest.mark.parametrize("store", ["staged", "cached"])
def test_restore_loads_a_snapshot_at_start(
    store: str, cluster: ClusterFactory, tmp_path: Path
) -> None:
    _, source = cluster(2)
    train(source, 3)
    source.save(str(tmp_path / "snap"))
    extra = {"store": store, "data_dir": str(tmp_path / "d")} if store == "cached" else {}
    server = PSServer(PSConfig(host="127.0.0.1", port=0, grace_seconds=0.5,
                               restore=str(tmp_path / "snap"), **extra))  # type: ignore[arg-type]  # fmt: skip
    server.start()
    restored = PSClient([f"127.0.0.1:{server.port}"])
    try:
        assert restored.committed_iteration() == 2
        for x, y in zip(all_rows(source, "emb"), all_rows(restored, "emb"), strict=True):
            assert np.array_equal(x, y)
    finally:
        restored.close()
        server.stop(grace=0)


def test_one_commit_applies_several_buffered_iterations_like_the_staged_store(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    _, staged = cluster(1)
    _, cached = cluster(1, store="cached", data_dir=str(tmp_path), cache_gb=20 * 88 / 2**30)
    rng = np.random.default_rng(4)
    pushes = [(t, np.unique(rng.integers(0, 300, 120))) for t in (0, 1, 1, 3)]
    updated = []
    for ps in (staged, cached):
        ps.create_table("emb", dim=8, optimizer=AdaGrad(lr=0.1, initial_accumulator=0.1))
        for t, keys in pushes:  # overlapping keys across iterations 0, 1 and 3
            ps.push_gradients("emb", keys, np.full((keys.shape[0], 8), t + 1.0, np.float32), t)
        updated.append(ps.commit(3))
    per_iteration = {
        t: np.unique(np.concatenate([k for i, k in pushes if i == t])) for t in (0, 1, 3)
    }
    assert updated == [sum(k.shape[0] for k in per_iteration.values())] * 2
    for x, y in zip(all_rows(staged, "emb"), all_rows(cached, "emb"), strict=True):
        assert np.array_equal(x, y)


def committed_on(cluster: ClusterFactory, data: Path) -> tuple[list[PSServer], PSClient]:
    """Two Cached-PS shards on ``data`` with table 'emb': keys 0..199 committed at iteration 0."""
    servers, ps = cluster(2, store="cached", data_dir=str(data))
    ps.create_table("emb", dim=4, optimizer=AdaGrad(lr=0.1))
    ps.push_gradients("emb", np.arange(200), np.ones((200, 4), np.float32), 0)
    assert ps.commit(0) == 200
    return servers, ps


def restarted(cluster: ClusterFactory, servers: list[PSServer], data: Path) -> PSClient:
    """Stop ``servers`` and start two shards again from the same data directory."""
    for server in servers:
        server.stop(grace=0)
    return cluster(2, store="cached", data_dir=str(data))[1]


def files_under(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root``, hidden ones too: bytes for files, None for directories."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


def refused_save(ps: PSClient, path: Path | str) -> str:
    """Save to ``path``, expect FAILED_PRECONDITION, return the message."""
    with pytest.raises(FailedPrecondition) as err:
        ps.save(str(path))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.reason == "FAILED_PRECONDITION"
    return err.value.message


def test_save_into_the_data_dir_is_refused_and_every_commit_survives(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    servers, ps = committed_on(cluster, data)
    lmdb_files = sorted(files_under(data))
    (tmp_path / "alias").symlink_to(data)
    for path in (data, tmp_path / "alias", f"{data}/../data"):
        message = refused_save(ps, path)
        assert str(data) in message and "outside" in message
    assert sorted(files_under(data)) == lmdb_files  # no snapshot file, no temp directory
    # The shards keep working: the next commit is acknowledged and durable.
    ps.push_gradients("emb", np.arange(50), np.ones((50, 4), np.float32), 1)
    assert ps.commit(1) == 50
    before = all_rows(ps, "emb")
    ps = restarted(cluster, servers, data)
    assert list(ps.list_tables()) == ["emb"]
    assert ps.shard_committed_iterations() == [1, 1]
    after = all_rows(ps, "emb")
    assert after[0].tolist() == list(range(200))
    assert after[3].tolist() == [2] * 50 + [1] * 150  # versions: two commits, then one
    for x, y in zip(before, after, strict=True):
        assert np.array_equal(x, y)


def test_save_inside_or_over_a_shards_lmdb_folder_is_refused(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    _, ps = committed_on(cluster, data)
    inside = data / "shard-00000-of-00002" / "snap"
    assert str(data) in refused_save(ps, inside)
    assert not inside.exists()
    # A --data-dir named like a snapshot shard folder: saving to its parent would replace it.
    lone = tmp_path / "shard-00000-of-00001"
    _, one = cluster(1, store="cached", data_dir=str(lone))
    one.create_table("emb", dim=4, optimizer=AdaGrad(lr=0.1))
    assert str(lone) in refused_save(one, tmp_path)
    assert sorted(p.name for p in lone.iterdir()) == ["shard-00000-of-00001"]
    assert ps.save(str(tmp_path / "elsewhere")) == 200  # a fresh directory still works


def test_save_over_a_folder_that_is_not_a_snapshot_is_refused_and_left_alone(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    stopped = tmp_path / "stopped"  # another, stopped, Cached-PS data directory
    servers, ps = committed_on(cluster, stopped)
    for server in servers:
        server.stop(grace=0)
    user = tmp_path / "user"
    (user / "shard-00000-of-00002").mkdir(parents=True)
    (user / "shard-00000-of-00002" / "notes.txt").write_text("mine")
    (user / "shard-00001-of-00002").write_text("a file, not a folder")
    _, ps = committed_on(cluster, tmp_path / "data")
    for target in (stopped, user):
        before = files_under(target)
        message = refused_save(ps, target)
        assert "shard-0000" in message and "not a heraldps-snapshot shard directory" in message
        assert files_under(target) == before
    assert restarted(cluster, [], stopped).shard_committed_iterations() == [0, 0]


def test_save_over_an_older_snapshot_replaces_it(cluster: ClusterFactory, tmp_path: Path) -> None:
    _, ps = committed_on(cluster, tmp_path / "data")
    snap = tmp_path / "snap"
    assert ps.save(str(snap)) == 200
    ps.push_gradients("emb", np.arange(50), np.ones((50, 4), np.float32), 1)
    ps.commit(1)
    assert ps.save(str(snap)) == 200
    assert sorted(files_under(snap)) == sorted(
        f"shard-0000{i}-of-00002{suffix}"
        for i in range(2)
        for suffix in ["", "/meta.json"]
        + [f"/emb.{f}.npy" for f in ("changed", "keys", "state", "values", "versions")]
    )  # no temporary or replaced directory left behind
    _, staged = cluster(3)
    assert staged.load(str(snap)) == 200
    assert staged.shard_committed_iterations() == [1, 1, 1]
    for x, y in zip(all_rows(ps, "emb"), all_rows(staged, "emb"), strict=True):
        assert np.array_equal(x, y)


def test_no_save_writes_into_another_stores_data_or_inside_a_snapshot(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    """Issue #14: beyond its own --data-dir, a save stays out of any Cached-PS data folder
    (another shard's, stopped, of another shard count) and out of a snapshot's shard folders."""
    stopped = tmp_path / "stopped"
    servers, two = cluster(2, store="cached", data_dir=str(stopped), cache_gb=0.001)
    two.create_table("emb", dim=4, optimizer=AdaGrad(lr=0.1))
    two.push_gradients("emb", np.arange(200), np.ones((200, 4), np.float32), 0)
    two.commit(0)
    snap = tmp_path / "snap"
    assert two.save(str(snap)) == 200
    for server in servers:
        server.stop(grace=0)
    _, one = cluster(1)  # a Staged-PS shard: no --data-dir of its own to keep out
    one.create_table("emb", dim=4, optimizer=AdaGrad(lr=0.1))
    (tmp_path / "a-file").write_text("not a folder")
    before = files_under(tmp_path)
    for target, why in (
        (stopped, "holds 'shard-00000-of-00002', a Cached-PS data folder"),
        (stopped / "shard-00001-of-00002" / "inside", "is a Cached-PS data folder"),
        (snap / "shard-00000-of-00002", "is a shard directory of a snapshot"),
        (snap / "shard-00001-of-00002" / "deeper", "is a shard directory of a snapshot"),
        (tmp_path / "a-file", "a-file"),
    ):
        assert why in refused_save(one, target), target
    assert files_under(tmp_path) == before
    _, again = cluster(2, store="cached", data_dir=str(tmp_path / "fresh"), cache_gb=0.001)
    assert again.load(str(snap)) == 200
    _, back = cluster(2, store="cached", data_dir=str(stopped), cache_gb=0.001)
    assert back.shard_committed_iterations() == [0, 0] and back.list_tables()["emb"].rows == 200
