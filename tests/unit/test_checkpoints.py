"""Checkpoint bookkeeping (heraldps.checkpoints) and the scheduler's checkpoint flush."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heraldps import checkpoints
from heraldps.checkpoints import Manifest
from heraldps.errors import FailedPrecondition
from scheduler_service.batch import Batch
from scheduler_service.scheduler import Scheduler

WORKERS = 3


def _write(root: Path, iteration: int, complete: bool = True) -> Path:
    target = checkpoints.begin(root, iteration)
    (target / "shard-00000-of-00001").mkdir()
    if complete:
        checkpoints.publish(target, Manifest(iteration, 1, "herald", WORKERS))
    return target


def test_resume_takes_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    assert checkpoints.resolve(tmp_path / "none-yet") is None
    _write(tmp_path, 3)
    newest = _write(tmp_path, 7)
    partial = _write(tmp_path, 11, complete=False)  # died while it was written
    path, manifest = checkpoints.resolve(tmp_path) or (None, None)
    assert path == newest and manifest is not None and manifest.next_iteration == 8
    assert checkpoints.resolve(newest) == (newest, manifest)  # named directly
    with pytest.raises(FailedPrecondition, match="incomplete"):
        checkpoints.resolve(partial)


def test_prune_keeps_the_newest_and_drops_older_partial_ones(tmp_path: Path) -> None:
    for t in (1, 3, 5):
        _write(tmp_path, t)
    _write(tmp_path, 4, complete=False)  # older than the newest complete: garbage
    _write(tmp_path, 9, complete=False)  # newer: maybe being written now, kept
    checkpoints.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000000003", "ckpt-000000000005", "ckpt-000000000009",
    ]  # fmt: skip


def test_a_manifest_of_another_format_is_no_checkpoint(tmp_path: Path) -> None:
    target = _write(tmp_path, 2)
    (target / checkpoints.MANIFEST).write_text('{"format": "something-else"}')
    assert checkpoints.resolve(tmp_path) is None


def _batches(count: int) -> list[Batch]:
    rng = np.random.default_rng(5)
    out = []
    for t in range(count):
        lens = rng.integers(1, 5, WORKERS * 6)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        keys = rng.integers(0, 60, int(offsets[-1]))
        out.append(Batch.from_arrays(t, offsets, keys, WORKERS))
    return out


@pytest.mark.parametrize("mode", ["on_demand", "herald", "herald_pipelined", "naive"])
def test_a_checkpoint_plan_writes_back_every_dirty_row(mode: str) -> None:
    """After the plans of a checkpoint iteration no row is dirty anywhere, and the plans
    differ from a run without checkpoints only in their write-back lists."""
    plain, checked = Scheduler(WORKERS, 40, mode), Scheduler(WORKERS, 40, mode, checkpoint_every=3)
    released_plain, released_checked = [], []
    for batch in _batches(12):
        released_plain += plain.submit(batch)
        m = checked.mirror
        owners = m.dirty_owners()
        dirty_keys = m.key_of[: m.index.rows][owners >= 0]
        released = checked.submit(batch)
        released_checked += released
        if released and released[0].checkpoint:
            assert dirty_keys.shape[0] > 0 or mode == "naive"
            for owner, key in zip(owners[owners >= 0], dirty_keys, strict=True):
                assert key in released[owner].write_back, (batch.iteration, owner, key)
    released_plain += plain.finish()
    released_checked += checked.finish()
    assert [p.iteration for p in released_checked if p.checkpoint and p.worker == 0] == [
        2,
        5,
        8,
        11,
    ]
    lists = ("samples", "evict", "pull", "update_local", "push_grads")
    for a, b in zip(released_plain, released_checked, strict=True):
        assert all(np.array_equal(getattr(a, n), getattr(b, n)) for n in lists)
    written = sum(p.write_back.shape[0] for p in released_checked)
    assert written >= sum(p.write_back.shape[0] for p in released_plain)
    if mode == "naive":  # nothing stays dirty under naive sync: the checkpoint adds nothing
        assert written == sum(p.write_back.shape[0] for p in released_plain)


def test_checkpoint_paths_must_be_absolute() -> None:
    """The scheduler writes the manifest and each shard its snapshot, each resolving the path
    on its own: a relative path would split a checkpoint between directories."""
    from scheduler_service.checkpointer import CheckpointConfig

    for kwargs in ({"every": 5, "directory": "ckpts"}, {"resume_from": "./ckpts"}):
        with pytest.raises(ValueError, match="must be an absolute path"):
            CheckpointConfig(**kwargs)  # type: ignore[arg-type]
    CheckpointConfig(
        every=5, directory="/snapshots/checkpoints", resume_from="/snapshots/checkpoints"
    )


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("iteration", "14", "iteration is '14'"),
        ("iteration", True, "iteration is True"),
        ("iteration", -3, "iteration is -3"),
        ("num_shards", 0, "num_shards is 0"),
        ("tables", [{"name": "emb", "dim": "4", "rows": 1}], "tables is"),
        ("samples_seen", 1.5, "samples_seen is 1.5"),
        ("next_iteration", 99, "next_iteration 99"),
        ("extra", 1, "unknown fields ['extra']"),
    ],
)
def test_a_manifest_field_of_the_wrong_type_is_named(
    tmp_path: Path, field: str, value: object, said: str
) -> None:
    """Checked on reading, before anything uses it: a string iteration once crashed the
    scheduler after the shards were loaded."""
    target = _write(tmp_path, 14)
    raw = json.loads((target / checkpoints.MANIFEST).read_text())
    raw[field] = value
    (target / checkpoints.MANIFEST).write_text(json.dumps(raw))
    (candidate,) = checkpoints.candidates(tmp_path)
    assert candidate.manifest is None and said in candidate.problem, candidate.problem
    assert checkpoints.resolve(tmp_path) is None


def test_remove_partial_drops_every_checkpoint_without_a_manifest(tmp_path: Path) -> None:
    _write(tmp_path, 3)
    _write(tmp_path, 9, complete=False)
    assert [p.name for p in checkpoints.remove_partial(tmp_path)] == ["ckpt-000000000009"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-000000000003"]


def test_make_room_never_removes_the_newest_good_checkpoint(tmp_path: Path) -> None:
    paths = [_write(tmp_path, t) for t in (1, 3, 5, 7)]
    removed = checkpoints.make_room(tmp_path, 1 << 62, paths[2])  # never enough room
    assert removed == [paths[0], paths[1]]  # 7 is newer than the newest good one: not judged
    assert sorted(p.name for p in tmp_path.iterdir()) == [paths[2].name, paths[3].name]
