"""``heraldps train --job FILE`` as a user runs it: real CLI, real cluster processes.

A validation split whose labels are the training rows' labels flipped gets worse as the
model learns the training rows, so after the first epoch the monitored AUC does not
improve: the learning rate decays and training stops early, and the report must follow
the schedule's rule exactly. The same job and seed run twice give the same model file for
file (with validations within epochs or without); ``heraldps predict`` on the exported best
model gives the report's test figures; and the same job file drives ``heraldps feed``
against a deployed-shape cluster to the model ``heraldps train`` trains.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from heraldps.bundled import bundled_data
from heraldps.client import PSClient
from heraldps.job_file import training_job
from heraldps.model_export import read_model
from launcher.export import export_from_ps
from launcher.train_state import better
from tests.processes import deployed_cluster, heraldps, start, stop_all

TRAIN, TEST = bundled_data()


def _rows(lines: list[str], flip: bool = False) -> str:
    if not flip:
        return "".join(lines)
    return "".join(("0" if line[0] == "1" else "1") + line[1:] for line in lines)


def _job(tmp_path: Path, **sections: dict[str, Any]) -> Path:
    """A small job on the bundled sample's first 1,024 rows, written as YAML."""
    lines = TRAIN.read_text().splitlines(keepends=True)
    (tmp_path / "train.tsv").write_text(_rows(lines[:1024]))
    (tmp_path / "flipped.tsv").write_text(_rows(lines[:512], flip=True))
    job: dict[str, Any] = {
        "data": {"train": "train.tsv", "valid": "flipped.tsv", "test": str(TEST),
                 "format": "criteo"},
        "model": {"embedding_dim": 4, "hidden_layers": [8], "activation": "relu"},
        "optimizer": {"name": "adam", "lr": 0.01},
        "schedule": {"max_epochs": 6, "monitor": "auc", "patience": 2, "lr_decay": 0.1,
                     "lr_patience": 1, "seed": 7},
        "cluster": {"mode": "herald", "workers": 2, "batch_size_per_worker": 64, "shards": 1,
                    "dense_sync": "ps"},
    }  # fmt: skip
    for name, body in sections.items():
        job[name] = {**job.get(name, {}), **body}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _train(job: Path, out: Path, *flags: str) -> dict[str, Any]:
    done = subprocess.run(heraldps("train", "--job", str(job), "--out", str(out), *flags),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    report["stdout"] = done.stdout
    return report


def test_lr_decays_and_training_stops_early_by_the_rule_and_runs_repeat(tmp_path: Path) -> None:
    job = _job(tmp_path)
    first = _train(job, tmp_path / "a")
    epochs = first["epochs"]
    # The flipped validation split: the first epoch is the best, then it gets worse.
    assert first["best_epoch"] == 1 and [e["improved"] for e in epochs] == [True, False, False]
    assert len(epochs) == 3 < 6  # stopped early: patience 2 after the best epoch
    # The rule, replayed from the recorded metrics: decay after each epoch without a better
    # validation AUC (lr_patience 1), stop after two in a row.
    best, lr = None, 0.01
    for e in epochs:
        assert np.isclose(e["lr"], lr), (e, lr)
        improved = better("auc", e["valid_auc"], best)
        assert e["improved"] == improved
        if improved:
            best = e["valid_auc"]
        else:
            lr *= 0.1
    assert "early stop: 2 epochs without a better validation auc" in first["stdout"]
    assert (tmp_path / "a" / "curves.png").stat().st_size > 10_000
    # The best model serves the report's test figures (heraldps predict, another process).
    scores = tmp_path / "scores.txt"
    done = subprocess.run(heraldps("predict", "--model", str(tmp_path / "a" / "best"),
                                   "--data", str(TEST), "--out", str(scores)),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"AUC {first['test_auc']:.6f}, logloss {first['test_logloss']:.6f}" in done.stdout
    # The same job and seed again: the same model, file for file, also when the validation
    # split is evaluated every 3 iterations as well (each time after a flush, which moves
    # rows but changes none).
    second = _train(_job(tmp_path, schedule={"eval_every": 3}), tmp_path / "b",
                    "--metrics-port", "0")  # fmt: skip
    assert "metrics: http://127.0.0.1:" in second["stdout"]
    assert [e["iteration"] for e in second["evals_within_epochs"]][:2] == [2, 5]
    sums = [json.loads((tmp_path / d / "best" / "manifest.json").read_text())["sha256"]
            for d in ("a", "b")]  # fmt: skip
    assert sums[0] == sums[1]
    assert [e["valid_auc"] for e in second["epochs"]] == [e["valid_auc"] for e in epochs]


@pytest.mark.parametrize(
    ("schedule", "train_mode"),
    [({"max_epochs": 1, "shuffle": False}, "naive"),
     ({"max_epochs": 2, "shuffle_buffer_rows": 300}, "het")],
    ids=["file-order", "streaming-shuffle"],
)  # fmt: skip
def test_one_job_file_drives_train_and_feed_to_the_same_model(
    tmp_path: Path, schedule: dict[str, Any], train_mode: str
) -> None:
    """File order for one epoch, or the streaming shuffle for two (1,024 rows in 4 buckets
    of 256): ``heraldps train`` and a deployed cluster in mode naive (shard, scheduler, two
    workers, ``heraldps feed``, each a process reading the same YAML) end with bit-identical
    rows and dense parameters. With the shuffle, ``heraldps train`` runs mode HET (s=0), so
    the same shuffled batches give the same model in two modes as well; and the spill files
    are gone after the run. (With a buffer of the whole split the streaming order is the
    in-memory one: tests/unit/test_shuffle.py.)"""
    job = _job(tmp_path, data={"valid": None}, schedule=schedule,
               cluster={"mode": "naive"})  # fmt: skip
    report = _train(job, tmp_path / "out", "--mode", train_mode)
    assert [e["iterations"] for e in report["epochs"]] == [8] * schedule["max_epochs"]
    if schedule.get("shuffle_buffer_rows"):
        assert "streaming shuffle (buffer 300 rows, 4 buckets" in report["stdout"]
        assert not list((tmp_path / "out" / "cluster").glob("shuffle-*"))
    trained = read_model(report["best_model"])
    procs, ps, scheduler = deployed_cluster(tmp_path, job, scheduler_flags=("--mode", "naive"))
    try:
        feed = start("feed", ["feed", "--job", str(job), "--scheduler", scheduler, "--ps", ps,
                              "--timeout-seconds", "60"], tmp_path)  # fmt: skip
        assert feed.wait(timeout=180) == 0, (tmp_path / "feed.log").read_text()
        for w in range(2):
            assert procs[2 + w].wait(timeout=60) == 0, (tmp_path / f"worker{w}.log").read_text()
        with PSClient([ps]) as client:
            export_from_ps(training_job(job), client, tmp_path / "fed", {})
    finally:
        stop_all(procs)
    fed = read_model(tmp_path / "fed")
    assert np.array_equal(fed.dense, trained.dense)
    for name, table in trained.tables.items():
        assert np.array_equal(fed.tables[name].keys, table.keys)
        assert np.array_equal(fed.tables[name].values, table.values)
