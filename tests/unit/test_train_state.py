"""``heraldps train``'s resume bookkeeping without a cluster: the launcher's state rewound
to a checkpoint, the schedule's rule replayed, the job fingerprint, and the scheduler's side
(a feeder's checkpoint request, the loss counters a checkpoint carries)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from heraldps import job_file
from heraldps.errors import FailedPrecondition
from heraldps.job_file import Schedule
from launcher.train import fingerprint
from launcher.train_state import Epoch, Plateau, TrainState
from scheduler_service.barrier import Barrier
from scheduler_service.batch import Batch
from scheduler_service.scheduler import make_scheduler

PER_EPOCH = 8


def _epoch(n: int, auc: float, lr: float) -> Epoch:
    return Epoch(n, PER_EPOCH, 0.5, auc, 0.4, lr, 1000.0, 1.0, improved=False)


def _state(aucs: list[float], schedule: Schedule) -> TrainState:
    """The state a live run leaves after epochs with these validation AUCs."""
    plateau, state = Plateau(schedule), TrainState("f")
    for n, auc in enumerate(aucs, start=1):
        e = _epoch(n, auc, 0.01 * plateau.scale)
        e.improved = plateau.observe(auc)
        state.epochs.append(e)
        state.loss_at_end.append((0.5 * n, 128 * PER_EPOCH * n))
        state.evals.append({"epoch": n, "iteration": (n - 1) * PER_EPOCH + 3, "valid_auc": auc,
                            "valid_logloss": 0.4})  # fmt: skip
    return state


def test_a_rewind_keeps_what_the_run_knew_at_the_checkpoint(tmp_path: Path) -> None:
    schedule = Schedule(patience=3, lr_decay=0.1, lr_patience=1)
    aucs = [0.70, 0.72, 0.71, 0.73, 0.725]
    state = _state(aucs, schedule)
    state.save(tmp_path)
    loaded = TrainState.load(tmp_path)
    assert loaded == state  # round trip, the loss counters' floats included
    # Checkpoint of iteration 26 (epoch 4, batch 3): epochs 1-3 and the validations up to 26.
    loaded.rewind(27, PER_EPOCH)
    assert [e.epoch for e in loaded.epochs] == [1, 2, 3] and len(loaded.loss_at_end) == 3
    assert [e["iteration"] for e in loaded.evals] == [3, 11, 19]  # not 27, 35
    # The replayed rule is the live one after epoch 3: best 0.72, one decay.
    replayed = loaded.replay(schedule, [e.valid_auc for e in loaded.epochs])
    live = Plateau(schedule)
    for auc in aucs[:3]:
        live.observe(auc)
    assert replayed == live and replayed.scale == 0.1 * 1.0 and replayed.best == 0.72
    assert loaded.best_epoch == 2
    # An epoch's last iteration keeps that epoch; nothing yet keeps nothing.
    state.rewind(2 * PER_EPOCH, PER_EPOCH)
    assert [e.epoch for e in state.epochs] == [1, 2]
    state.rewind(0, PER_EPOCH)
    assert state.epochs == [] and state.evals == [] and state.best_epoch == 0


def test_the_plateau_stops_after_patience_epochs_without_improvement() -> None:
    plateau = Plateau(Schedule(patience=2, lr_decay=0.5, lr_patience=1))
    assert plateau.observe(0.7) and not plateau.stopped
    assert not plateau.observe(float("nan")) and plateau.scale == 0.5
    assert not plateau.observe(0.69) and plateau.scale == 0.25 and plateau.stopped


def test_the_fingerprint_names_the_run_not_its_length(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("data: {train: bundled:criteo_head8k/train.tsv, format: criteo}\n")
    base = job_file.load(path)
    same = fingerprint(base, base.job)
    longer = job_file.load(path, {"schedule.max_epochs": 30, "schedule.checkpoint_every": 5})
    assert fingerprint(longer, longer.job) == same
    for key, value in (("schedule.seed", 1), ("schedule.shuffle", False),
                       ("cluster.mode", "naive"), ("cluster.shards", 3),
                       ("optimizer.lr", 0.5), ("schedule.lr_decay", 0.5)):  # fmt: skip
        other = job_file.load(path, {key: value})
        assert fingerprint(other, other.job) != same, key
    assert fingerprint(base, replace(base.job, cache_rows=7)) != same


def _batch(t: int, checkpoint: bool = False) -> Batch:
    offsets = np.arange(0, 9, 2)
    return Batch(t, offsets, np.arange(8) % 5, 2, checkpoint=checkpoint, flush=checkpoint)


def test_a_checkpoint_request_needs_a_checkpoint_dir_and_is_remembered_until_commit() -> None:
    barrier = Barrier(make_scheduler(2, 20, "naive"), lambda t: None)
    for w in range(2):
        barrier.register(w)
    with pytest.raises(FailedPrecondition, match="--checkpoint-dir"):
        barrier.submit(_batch(0, checkpoint=True))
    barrier.can_checkpoint = True
    barrier.submit(_batch(0, checkpoint=True))
    assert barrier.checkpoint_requested(0) and not barrier.checkpoint_requested(1)
    barrier.report_done(0, 0, loss_sum=1.25, samples=2)
    # What a checkpoint of 0 records while 0 is being committed: its loss included.
    assert barrier.loss_through(0) == (1.25, 2)
    barrier.report_done(1, 0, loss_sum=0.5, samples=2)
    assert not barrier.checkpoint_requested(0)
    assert (barrier.loss_sum_committed, barrier.loss_samples_committed) == (1.75, 4)
    # A resumed scheduler goes on from a checkpoint's counters.
    resumed = Barrier(make_scheduler(2, 20, "naive"), lambda t: None)
    resumed.resume_at(0, 4, 1.75, 4)
    assert (resumed.loss_sum_committed, resumed.loss_samples_committed) == (1.75, 4)
