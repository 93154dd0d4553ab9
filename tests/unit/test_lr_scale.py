"""The per-iteration learning-rate multiplier and the flush marker, piece by piece: the
optimizer scaling every place shares, the shards' commit, the plans and their wire form,
and the scheduler's flushed iteration (every dirty row written back, plans released at
once)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heraldps.errors import InvalidArgument
from heraldps.init import Normal
from heraldps.optim import SGD, Adam, lr_scale_of, optimizer_from_proto, scaled
from heraldps.plan import CommPlan, plan_from_proto, plan_to_proto
from heraldps.spec import TableSpec
from ps_server.cached_store import CachedStore
from ps_server.store import StagedStore
from scheduler_service.batch import Batch
from scheduler_service.scheduler import make_scheduler


def test_scaled_starts_from_the_float32_lr_so_a_shard_and_a_worker_agree() -> None:
    """A shard's optimizer came over the wire (float32 lr), a worker's from the job (double):
    the scaled lr is the same float32 for both."""
    job_side = Adam(lr=0.001)
    wire_side = optimizer_from_proto(job_side.to_proto())
    assert wire_side.lr != job_side.lr  # 0.0010000000474974513 against 0.001
    for scale in (0.1, 0.1 * 0.1, 0.5, 3.0):
        a, b = scaled(job_side, scale), scaled(wire_side, scale)
        assert np.float32(a.lr) == np.float32(b.lr), scale
    assert scaled(job_side, 1.0) is job_side
    assert lr_scale_of(0.0) == 1.0 and lr_scale_of(0.25) == 0.25
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="lr_scale"):
            lr_scale_of(bad)


@pytest.mark.parametrize("store_kind", ["staged", "cached"])
def test_a_commit_applies_its_lr_scale(store_kind: str, tmp_path: Path) -> None:
    opt = SGD(lr=0.5)
    spec = TableSpec("emb", 2, Normal(std=0.1, seed=1), opt).canonical()
    store = StagedStore() if store_kind == "staged" else CachedStore(tmp_path / "data")
    store.create_table(spec)
    keys = np.arange(3, dtype=np.int64)
    before = store.pull("emb", keys, with_state=True).values.copy()
    grads = np.ones((3, 2), np.float32)
    store.push("emb", 0, keys, grads)
    store.commit(0, lr_scale=0.1)
    after = store.pull("emb", keys, with_state=True).values
    expect = before.copy()
    scaled(spec.optimizer, 0.1).apply(expect, np.zeros((3, 0), np.float32), grads)
    assert np.array_equal(after, expect)
    assert not np.allclose(after, before - np.float32(0.5) * grads)  # not the full step


def test_plans_carry_the_scale_over_the_wire() -> None:
    plan = CommPlan(iteration=3, worker=1, lr_scale=0.01)
    assert plan_from_proto(plan_to_proto(plan, "emb")).lr_scale == 0.01
    assert plan_from_proto(plan_to_proto(CommPlan(0, 0), "emb")).lr_scale == 1.0


def _batch(t: int, keys: list[int], flush: bool = False, scale: float = 1.0) -> Batch:
    """Two workers, one sample each: worker 0 trains keys[0], worker 1 keys[1]."""
    offsets = np.array([0, 1, 2], np.int64)
    batch = Batch.from_arrays(t, offsets, np.array(keys, np.int64), 2)
    return Batch(batch.iteration, batch.offsets, batch.keys, 2, None, scale, flush)


@pytest.mark.parametrize("mode", ["herald", "naive", "herald_pipelined", "het"])
def test_a_flushed_batch_releases_its_plans_at_once_with_every_dirty_row(mode: str) -> None:
    scheduler = make_scheduler(2, 10, mode)
    assert scheduler.submit(_batch(0, [1, 2], scale=0.5)) == []  # plan 0 waits for batch 1
    released = scheduler.submit(_batch(1, [3, 4], flush=True, scale=0.25))
    assert [p.iteration for p in released] == [0, 0, 1, 1]
    assert [p.lr_scale for p in released] == [0.5, 0.5, 0.25, 0.25]
    flushed = released[2:]
    assert all(p.checkpoint for p in flushed) and not any(p.checkpoint for p in released[:2])
    if mode != "het":  # under on-demand sync keys 1..4 stay dirty: all go back at the flush
        written = np.sort(np.concatenate([p.write_back for p in released]))
        assert written.tolist() == [1, 2, 3, 4]
        assert scheduler.mirror.dirty_rows() == 0  # type: ignore[union-attr]
    # The next batch starts afresh: its plans wait for the one after, as usual.
    assert scheduler.submit(_batch(2, [1, 4])) == []
    assert [p.iteration for p in scheduler.finish()] == [2, 2]
