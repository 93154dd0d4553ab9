"""The pieces of ``heraldps train``'s epoch loop that need no cluster: the improvement
rule, the per-epoch order of the rows, the Prometheus gauges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prometheus_client import generate_latest

from launcher.cli.train import final_line
from launcher.train import TrainMetrics, epoch_order
from launcher.train_state import Epoch, better


def test_better_follows_the_monitored_metric_and_never_takes_nan() -> None:
    assert better("auc", 0.7, None) and better("auc", 0.71, 0.7) and not better("auc", 0.7, 0.7)
    assert better("logloss", 0.4, 0.5) and not better("logloss", 0.5, 0.4)
    assert not better("auc", float("nan"), None)


def test_each_epoch_has_its_own_order_the_same_in_every_run() -> None:
    a, b = epoch_order(1000, 7, 1, True), epoch_order(1000, 7, 2, True)
    assert np.array_equal(np.sort(a), np.arange(1000)) and not np.array_equal(a, b)
    assert np.array_equal(a, epoch_order(1000, 7, 1, True))
    assert not np.array_equal(a, epoch_order(1000, 8, 1, True))
    assert np.array_equal(epoch_order(5, 7, 3, False), np.arange(5))


def test_the_gauges_show_the_last_epoch() -> None:
    metrics = TrainMetrics()
    metrics.observe(Epoch(3, 10, 0.45, 0.72, 0.46, 1e-4, 1234.0, 2.5, False), best=2)
    text = generate_latest(metrics.registry).decode()
    for line in ("heraldps_train_epoch 3.0", "heraldps_train_valid_auc 0.72",
                 "heraldps_train_lr 0.0001", "heraldps_train_samples_per_second 1234.0",
                 "heraldps_train_best_epoch 2.0", "heraldps_train_loss 0.45"):  # fmt: skip
        assert line in text, line


def test_the_last_line_names_the_test_scores_or_why_there_are_none(tmp_path: Path) -> None:
    scored = {"best_epoch": 3, "test_auc": 0.98125, "test_logloss": 0.2}
    assert "test AUC 0.981250" in final_line(scored, tmp_path)
    unscored = {"best_epoch": 3, "test_auc": float("nan"), "test_logloss": float("nan")}
    line = final_line(unscored, tmp_path)
    assert "nan" not in line and "no test split" in line
