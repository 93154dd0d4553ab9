"""The Staged-PS store: push/commit semantics, write-back guard, memory cap, snapshots."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heraldps.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    StaleIteration,
    TableExists,
    UnknownTable,
    VersionConflict,
)
from heraldps.init import Normal
from heraldps.optim import SGD, AdaGrad, Adam
from heraldps.spec import TableSpec, UpdateMode
from ps_server import snapshot
from ps_server.store import StagedStore

DIM = 4


def make_store(optimizer: SGD | AdaGrad | Adam | None = None, **kw: object) -> StagedStore:
    store = StagedStore(**kw)  # type: ignore[arg-type]
    spec = TableSpec("emb", DIM, Normal(std=0.1, seed=1), optimizer or AdaGrad(lr=0.1))
    store.create_table(spec.canonical())
    return store


def everything(store: StagedStore) -> dict[str, tuple[np.ndarray, ...]]:
    out = {}
    for table in store.tables():
        b = table.snapshot()
        order = np.argsort(b.keys)
        out[table.name] = (b.keys[order], b.values[order], b.state[order], b.versions[order])
    return out


def assert_same(a: dict[str, tuple[np.ndarray, ...]], b: dict[str, tuple[np.ndarray, ...]]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        for x, y in zip(a[name], b[name], strict=True):
            assert np.array_equal(x, y), name


def test_pull_creates_rows_once_and_answers_duplicates() -> None:
    store = make_store()
    keys = np.array([9, 3, 9, -4], dtype=np.int64)
    block = store.pull("emb", keys, with_state=True)
    assert block.values.shape == (4, DIM) and np.array_equal(block.values[0], block.values[2])
    initializer = store.table("emb").spec.initializer
    assert np.array_equal(block.values, initializer.generate(keys, DIM))
    assert block.versions.tolist() == [0, 0, 0, 0]
    assert store.table("emb").rows == 3
    again = store.pull("emb", keys[::-1], with_state=False)
    assert np.array_equal(again.values, block.values[::-1])


@pytest.mark.parametrize(
    "opt", [SGD(lr=0.1), AdaGrad(lr=0.1, initial_accumulator=0.1), Adam(lr=0.01)]
)
@settings(max_examples=25, deadline=None)
@given(
    pushes=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=20), min_size=1, max_size=5)
)
def test_commit_applies_summed_gradient_once_per_key(
    opt: SGD | AdaGrad | Adam, pushes: list[list[int]]
) -> None:
    store = make_store(opt)
    rng = np.random.default_rng(len(pushes))
    all_keys = np.arange(13, dtype=np.int64)
    before = store.pull("emb", all_keys, with_state=True)
    summed = np.zeros((13, DIM), np.float32)
    touched = np.zeros(13, bool)
    for keys in pushes:
        k = np.array(keys, dtype=np.int64)
        g = rng.normal(size=(len(keys), DIM)).astype(np.float32)
        store.push("emb", 0, k, g)
        np.add.at(summed, k, g)
        touched[k] = True
    store.commit(0)
    after = store.pull("emb", all_keys, with_state=True)
    expect_v, expect_s = before.values.copy(), before.state.copy()
    sub_v, sub_s = expect_v[touched], expect_s[touched]
    opt.apply(sub_v, sub_s, summed[touched])
    expect_v[touched], expect_s[touched] = sub_v, sub_s
    np.testing.assert_allclose(after.values, expect_v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after.state, expect_s, rtol=1e-5, atol=1e-6)
    assert after.versions.tolist() == touched.astype(int).tolist()


def test_commit_is_idempotent_and_ordered() -> None:
    store = make_store()
    k = np.array([1, 2], dtype=np.int64)
    store.push("emb", 3, k, np.ones((2, DIM), np.float32))
    assert store.commit(3) == (2, False)
    snap = everything(store)
    assert store.commit(3) == (0, True)
    assert_same(snap, everything(store))
    with pytest.raises(StaleIteration):
        store.commit(2)
    with pytest.raises(StaleIteration):
        store.push("emb", 3, k, np.ones((2, DIM), np.float32))
    assert_same(snap, everything(store))


def test_commit_applies_each_pending_iteration_in_order() -> None:
    store = make_store(SGD(lr=1.0))
    k = np.array([5], dtype=np.int64)
    v0 = store.pull("emb", k, False).values
    store.push("emb", 1, k, np.ones((1, DIM), np.float32))
    store.push("emb", 2, k, np.ones((1, DIM), np.float32))
    store.commit(1)
    assert store.pull("emb", k, False).versions.tolist() == [1]
    store.commit(2)
    b = store.pull("emb", k, False)
    assert b.versions.tolist() == [2]
    np.testing.assert_allclose(b.values, v0 - 2, rtol=1e-6)


def test_immediate_mode_applies_on_arrival() -> None:
    store = StagedStore()
    store.create_table(
        TableSpec("async", DIM, optimizer=SGD(lr=0.5), update_mode=UpdateMode.IMMEDIATE)
    )
    k = np.array([1, 1, 2], dtype=np.int64)
    assert store.push("async", 0, k, np.ones((3, DIM), np.float32)) is True
    b = store.pull("async", np.array([1, 2]), False)
    np.testing.assert_allclose(b.values, [[-1.0] * DIM, [-0.5] * DIM])
    assert b.versions.tolist() == [1, 1]


def test_write_back_guard() -> None:
    store = make_store()
    k = np.array([1, 2], dtype=np.int64)
    base = store.pull("emb", k, True)
    new_v = np.full((2, DIM), 7, np.float32)
    new_s = np.full((2, DIM), 3, np.float32)
    store.write_back("emb", k, new_v, new_s, base.versions, base.versions + 2)
    b = store.pull("emb", k, True)
    assert np.all(b.values == 7) and np.all(b.state == 3) and b.versions.tolist() == [2, 2]
    snap = everything(store)
    with pytest.raises(VersionConflict, match="stored version 2"):
        store.write_back("emb", k, new_v + 1, new_s, np.array([2, 0]), np.array([3, 1]))
    with pytest.raises(InvalidArgument, match="distinct"):
        store.write_back("emb", np.array([1, 1]), new_v, new_s, np.array([2, 2]), np.array([3, 3]))
    with pytest.raises(InvalidArgument, match="forward"):
        store.write_back("emb", k, new_v, new_s, np.array([2, 2]), np.array([1, 3]))
    assert_same(snap, everything(store))
    # An unseen key has version 0 and can be written back.
    store.write_back("emb", np.array([77]), new_v[:1], new_s[:1], np.array([0]), np.array([1]))
    assert store.pull("emb", np.array([77]), False).versions.tolist() == [1]


def test_table_spec_rules() -> None:
    store = make_store()
    spec = store.table("emb").spec
    assert store.create_table(spec)[1] is False
    with pytest.raises(TableExists):
        store.create_table(TableSpec("emb", DIM + 1, optimizer=SGD()))
    with pytest.raises(UnknownTable, match="create it"):
        store.pull("nope", np.array([1]), False)
    with pytest.raises(InvalidArgument):
        TableSpec("emb", -3)
    with pytest.raises(InvalidArgument):
        TableSpec("bad name!", 3)


def test_memory_limit_rejects_without_changing_anything() -> None:
    store = make_store(AdaGrad(), memory_limit_bytes=2 * 2**20)
    row_bytes = store.table("emb").row_bytes
    store.pull("emb", np.arange(1000), False)
    snap = everything(store)
    used = store.budget.used_bytes
    too_many = np.arange(1000, 1000 + 3 * 2**20 // row_bytes)
    with pytest.raises(ResourceExhausted, match="memory limit"):
        store.pull("emb", too_many, False)
    with pytest.raises(ResourceExhausted):
        store.push("emb", 0, too_many, np.zeros((too_many.shape[0], DIM), np.float32))
    assert store.budget.used_bytes == used
    assert_same(snap, everything(store))
    store.push("emb", 0, np.arange(10), np.ones((10, DIM), np.float32))
    store.commit(0)


def test_concurrent_pushes_equal_serial() -> None:
    rng = np.random.default_rng(5)
    batches = [
        (rng.integers(0, 50, 200), rng.normal(size=(200, DIM)).astype(np.float32))
        for _ in range(16)
    ]
    serial, parallel = make_store(SGD(lr=0.25)), make_store(SGD(lr=0.25))
    for k, g in batches:
        serial.push("emb", 0, k, g)
    threads = [threading.Thread(target=parallel.push, args=("emb", 0, k, g)) for k, g in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    serial.commit(0)
    parallel.commit(0)
    a, b = everything(serial)["emb"], everything(parallel)["emb"]
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[3], b[3])
    np.testing.assert_allclose(a[1], b[1], rtol=1e-5, atol=1e-6)


def test_export_incremental() -> None:
    store = make_store(SGD(lr=0.1))
    store.pull("emb", np.arange(10), False)
    assert len(store.table("emb").export(-1)) == 10
    store.push("emb", 0, np.array([1, 2]), np.ones((2, DIM), np.float32))
    store.commit(0)
    store.push("emb", 1, np.array([2, 3]), np.ones((2, DIM), np.float32))
    store.commit(1)
    assert sorted(store.table("emb").export(0).keys.tolist()) == [2, 3]
    assert sorted(store.table("emb").export(-1).keys.tolist()) == list(range(10))
    block = store.table("emb").export(0)
    assert set(block.changed.tolist()) == {1}


@pytest.mark.parametrize("new_shards", [1, 3])
def test_snapshot_reshards(tmp_path: Path, new_shards: int) -> None:
    old = [make_store(Adam(), shard_index=i, num_shards=2) for i in range(2)]
    from heraldps.sharding import shard_of

    keys = np.arange(500, dtype=np.int64)
    owner = shard_of(keys, 2)
    for i, store in enumerate(old):
        mine = keys[owner == i]
        store.pull("emb", mine, False)
        store.push("emb", 0, mine[::2], np.ones((mine[::2].shape[0], DIM), np.float32))
        store.commit(0)
        iteration, tables = store.consistent_snapshot()
        snapshot.write_shard(tmp_path, i, 2, iteration, tables)
    new = [make_store(Adam(), shard_index=i, num_shards=new_shards) for i in range(new_shards)]
    for i, store in enumerate(new):
        iteration, tables = snapshot.read_for_shard(tmp_path, i, new_shards)
        store.replace_all(iteration, tables)
        assert store.committed_iteration == 0
        assert np.all(shard_of(store.table("emb").snapshot().keys, new_shards) == i)

    def merged(stores: list[StagedStore]) -> tuple[np.ndarray, ...]:
        parts = [everything(s)["emb"] for s in stores]
        cat = [np.concatenate([p[f] for p in parts]) for f in range(4)]
        order = np.argsort(cat[0])
        return tuple(c[order] for c in cat)

    for x, y in zip(merged(old), merged(new), strict=True):
        assert np.array_equal(x, y)


def test_snapshot_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="not a directory"):
        snapshot.read_for_shard(tmp_path / "missing", 0, 1)
    (tmp_path / "shard-00000-of-00002").mkdir()
    (tmp_path / "shard-00000-of-00002" / "meta.json").write_text('{"format": "other"}')
    with pytest.raises(InvalidArgument, match="heraldps-snapshot"):
        snapshot.read_for_shard(tmp_path, 0, 1)


def save_one(root: Path, keep_out: tuple[Path, ...] = ()) -> Path:
    """Write shard 0 of 1 of a small trained store under ``root``."""
    store = make_store()
    store.pull("emb", np.arange(10, dtype=np.int64), False)
    iteration, tables = store.consistent_snapshot()
    return snapshot.write_shard(root, 0, 1, iteration, tables, keep_out)


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*"))}  # fmt: skip


def lmdb_folder(at: Path) -> None:
    at.mkdir()
    for name in ("data.mdb", "lock.mdb", "heraldps.lock"):
        (at / name).write_bytes(b"durable")


def extra_file(at: Path) -> None:
    save_one(at.parent)
    (at / "data.mdb").write_bytes(b"durable")


def other_format(at: Path) -> None:
    at.mkdir()
    (at / "meta.json").write_text('{"format": "other"}')


def symlink_to_snapshot(at: Path) -> None:
    real = save_one(at.parent / "real")
    at.symlink_to(real)


@pytest.mark.parametrize(
    "make", [lmdb_folder, extra_file, other_format, symlink_to_snapshot, Path.touch]
)
def test_write_shard_replaces_only_a_snapshot_shard_directory(
    tmp_path: Path, make: Callable[[Path], object]
) -> None:
    target = tmp_path / "shard-00000-of-00001"
    make(target)
    before = tree(tmp_path)
    with pytest.raises(FailedPrecondition, match="empty directory or to a previous heraldps"):
        save_one(tmp_path)
    assert tree(tmp_path) == before  # untouched, and no temporary directory left behind


def test_write_shard_replaces_an_older_snapshot(tmp_path: Path) -> None:
    save_one(tmp_path)
    (tmp_path / "shard-00000-of-00001" / "gone.keys.npy").write_bytes(b"old table")
    shard_dir = save_one(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [shard_dir.name]
    assert not (shard_dir / "gone.keys.npy").exists()
    assert snapshot.read_for_shard(tmp_path, 0, 1)[1][0][1].keys.shape == (10,)


def test_write_shard_stays_out_of_kept_directories(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lmdb_folder(data)
    (tmp_path / "alias").symlink_to(data)
    before = tree(tmp_path)
    for root in (data, data / "sub" / "dir", tmp_path / "alias", data / ".." / "data"):
        with pytest.raises(FailedPrecondition, match="--data-dir"):
            save_one(root, keep_out=(data,))
    # A kept directory named like the shard folder: saving to its parent would replace it.
    with pytest.raises(FailedPrecondition, match="--data-dir"):
        save_one(tmp_path, keep_out=(tmp_path / "shard-00000-of-00001",))
    assert tree(tmp_path) == before
    assert save_one(tmp_path / "snap", keep_out=(data,)).is_dir()
    assert StagedStore().data_paths() == ()
