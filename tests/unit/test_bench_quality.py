"""benchmarks/bench_quality.py: reading a run's report.json and comparing two exported models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heraldps.init import Normal
from heraldps.model_export import ExportedModel, ModelTable, write_model
from tests.benchmarks import load_benchmark

bq = load_benchmark("bench_quality")

REPORT = {
    "mode": "herald",
    "seed": 1,
    "workers": 4,
    "cluster": {"shards": 2},
    "epochs": [
        {"epoch": 1, "valid_auc": 0.95, "samples_per_second": 1000.0},
        {"epoch": 2, "valid_auc": 0.97, "samples_per_second": 1100.0},
        {"epoch": 3, "valid_auc": 0.96, "samples_per_second": 1050.0},
    ],
    "best_epoch": 2,
    "test": {"auc": 0.97, "logloss": 0.2},
    "seconds": 12.5,
    "samples_per_second": 1050.0,
    "traffic": {"moved": 1234, "bytes_moved_with_flush": 99999},
    "export_dir": "model",
}


def test_read_report_takes_every_figure_the_table_prints(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps(REPORT))
    run = bq.read_report(tmp_path / "report.json")
    assert (run.mode, run.seed, run.workers, run.shards) == ("herald", 1, 4, 2)
    assert (run.test_auc, run.test_logloss, run.best_epoch, run.epochs) == (0.97, 0.2, 2, 3)
    assert (run.seconds, run.samples_per_second) == (12.5, 1050.0)
    assert (run.rows_moved, run.bytes_moved) == (1234, 99999)
    assert run.export_dir == str(tmp_path / "model")
    naive = bq.TrainRun(**{**run.__dict__, "mode": "naive", "rows_moved": 2468})
    table = "\n".join(bq.quality_table([run], naive, bars=True))
    assert "0.98395" in table and "| 0.50 |" in table and "herald, 1 seeds, mean" in table


def test_read_report_names_the_missing_figure(tmp_path: Path) -> None:
    report = {k: v for k, v in REPORT.items() if k != "test"}
    (tmp_path / "report.json").write_text(json.dumps(report))
    with pytest.raises(KeyError, match=r"test\.auc"):
        bq.read_report(tmp_path / "report.json")


def test_train_command_passes_the_overrides() -> None:
    cmd = bq.train_command(Path("job.yaml"), Path("out"), "naive", 2, 7, 3)
    assert " ".join(cmd[1:]) == (
        "-m launcher train --job job.yaml --mode naive --workers 2 --seed 7 --out out "
        "--max-epochs 3"
    )


def test_job_with_shards_keeps_the_job_and_sets_the_shards(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model:\n  embedding_dim: 10\ncluster:\n  workers: 4\n  shards: 2\n")
    copy = json.loads(bq.job_with_shards(job, 1, tmp_path).read_text())
    assert copy == {"model": {"embedding_dim": 10}, "cluster": {"workers": 4, "shards": 1}}


def _model(path: Path, keys: list[int], shift: float) -> str:
    values = np.arange(len(keys) * 2, dtype=np.float32).reshape(-1, 2) + np.float32(shift)
    table = ModelTable("emb", np.array(keys, np.int64), values, Normal(seed=0))
    dense = np.array([1.0, 2.0], np.float32)
    write_model(path, ExportedModel("{}", {"emb": table}, dense, {}))
    return str(path)


def test_exported_difference_is_the_largest_row_or_dense_difference(tmp_path: Path) -> None:
    a = _model(tmp_path / "a", [1, 5, 9], 0.0)
    b = _model(tmp_path / "b", [1, 5, 9], 0.25)
    assert bq.exported_difference(a, b) == 0.25
    assert bq.exported_difference(a, a) == 0.0
    other = _model(tmp_path / "c", [1, 5, 10], 0.0)
    assert bq.exported_difference(a, other) == float("inf")
