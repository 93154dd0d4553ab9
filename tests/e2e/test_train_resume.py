"""``heraldps train`` survives a dead process and a killed launcher (real CLI, real cluster
processes, SIGKILL).

The job is test_train's: a validation split that gets worse, so the learning rate decays
after epoch 2 and training stops early after epoch 3 (3 x 8 iterations), plus a
validation every 4 iterations within epochs and a checkpoint every 3 iterations (and at
every epoch's end). Killing a worker and then the scheduler mid-epoch with
``--max-restarts 2``, or killing the launcher and running the same command again, must end
with the uninterrupted run's report, figure for figure (every epoch's train loss,
validation AUC and logloss, learning rate; the validations within epochs; the test
figures) and its best model, file for file.
The validation logloss of every epoch is a function of that epoch's whole model, so equal
figures after the resumed epochs mean the resumed training reached the same model.

Mode naive: its plans depend on the batches only, so a resumed run repeats every sum in
the same order, bit for bit. In herald the restarted workers' caches start cold, the
location-aware partition sends some samples to other workers than before, and the
resumed run equals the uninterrupted one up to float32 summation order (measured on this
job: train loss and validation logloss within 3e-9 relative), as the modes equal each
other (docs/architecture.md); test_resume.py checks herald's resume against the
single-process model.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.e2e.test_resume import Killer
from tests.e2e.test_train import _job, _train
from tests.processes import heraldps

EXACT = ("epoch", "iterations", "train_loss", "valid_auc", "valid_logloss", "lr", "improved")


def _same_run(got: dict[str, Any], want: dict[str, Any], out: Path, base: Path) -> None:
    assert [{k: e[k] for k in EXACT} for e in got["epochs"]] == [
        {k: e[k] for k in EXACT} for e in want["epochs"]
    ]
    assert got["evals_within_epochs"] == want["evals_within_epochs"]
    for key in ("best_epoch", "test_auc", "test_logloss"):
        assert got[key] == want[key], key
    sums = [json.loads((d / "best" / "manifest.json").read_text())["sha256"] for d in (out, base)]
    assert sums[0] == sums[1]


def test_a_killed_worker_and_a_killed_launcher_resume_to_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    job = _job(tmp_path, schedule={"eval_every": 4, "checkpoint_every": 3},
               cluster={"mode": "naive"})  # fmt: skip
    plain = _train(job, tmp_path / "plain")
    assert len(plain["epochs"]) == 3 and plain["restarts"] == [] and plain["resumed_from"] is None
    lrs = [e["lr"] for e in plain["epochs"]]
    assert lrs[0] == lrs[1] > lrs[2]  # decayed after epoch 2: the schedule's state matters

    # A worker dies in epoch 2, the scheduler in epoch 3; each time the cluster restarts
    # from the newest checkpoint.
    (tmp_path / "killed" / "cluster").mkdir(parents=True)
    killer = Killer(tmp_path / "killed" / "cluster", [("worker-1", 10), ("scheduler", 19)])
    killed = _train(job, tmp_path / "killed", "--max-restarts", "2")
    killer.thread.join(timeout=5)
    assert [k[0] for k in killer.killed] == ["worker-1", "scheduler"]
    restarts = killed["restarts"]
    assert [(r["process"], r["exit_code"]) for r in restarts] == [("worker-1", -9),
                                                                  ("scheduler", -9)]  # fmt: skip
    # Checkpoints every 3 (2, 5, 8, 11, ...) and at epoch ends (7, 15): resumed mid-epoch 2
    # at 9 or 12 (the kill may land one commit after the look), mid-epoch 3 at 18 or 21.
    assert [r["resumed_at"] for r in restarts] in ([9, 18], [9, 21], [12, 18], [12, 21])
    assert "restart 2 of at most 2" in killed["stdout"]
    _same_run(killed, plain, tmp_path / "killed", tmp_path / "plain")

    # The launcher dies in epoch 3 (its processes die with it); the same command resumes.
    out = tmp_path / "launcher"
    (out / "cluster").mkdir(parents=True)
    with open(tmp_path / "launcher.log", "w") as log:
        launcher = subprocess.Popen(heraldps("train", "--job", str(job), "--out", str(out)),
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    (out / "cluster" / "launcher.pid").write_text(str(launcher.pid))
    killer = Killer(out / "cluster", [("launcher", 19)])
    assert launcher.wait(timeout=240) == -9, (tmp_path / "launcher.log").read_text()
    assert killer.killed and not (out / "report.json").exists()
    # Another job (another seed) is refused on that directory, and changes nothing there.
    other = subprocess.run(heraldps("train", "--job", str(job), "--out", str(out), "--seed", "8"),
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert other.returncode != 0 and "holds the checkpoints of another job" in other.stderr
    again = _train(job, out)
    assert "resuming: " in again["stdout"]
    # The newest checkpoint at or before the kill: 17 (every 3) or 20 (the kill may land
    # one commit later than it looked).
    assert again["resumed_from"] in (18, 21), again["resumed_from"]
    _same_run(again, plain, out, tmp_path / "plain")


def test_a_streaming_shuffled_run_resumes_mid_epoch_to_the_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """``shuffle_buffer_rows: 300`` (4 buckets): a worker killed in epoch 2 and the cluster
    restarted from a mid-epoch checkpoint; the resumed epoch scatters again, skips the
    committed batches and ends with the uninterrupted run's report and model."""
    job = _job(tmp_path, schedule={"eval_every": 4, "checkpoint_every": 3,
                                   "shuffle_buffer_rows": 300},
               cluster={"mode": "naive"})  # fmt: skip
    plain = _train(job, tmp_path / "plain")
    (tmp_path / "killed" / "cluster").mkdir(parents=True)
    killer = Killer(tmp_path / "killed" / "cluster", [("worker-1", 10)])
    killed = _train(job, tmp_path / "killed", "--max-restarts", "1")
    killer.thread.join(timeout=5)
    assert [k[0] for k in killer.killed] == ["worker-1"]
    assert [r["resumed_at"] % 8 for r in killed["restarts"]] in ([1], [4])  # mid-epoch 2
    _same_run(killed, plain, tmp_path / "killed", tmp_path / "plain")
