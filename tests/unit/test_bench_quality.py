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

REPORT = {  # the fields of launcher/train.py's report that the bench reads
    "job": {"seed": 1, "workers": 4, "batch_size_per_worker": 1024},
    "cluster": {"mode": "herald", "shards": 2},
    "epochs": [
        {"epoch": 1, "valid_auc": 0.95, "samples_per_second": 1000.0, "seconds": 10.0},
        {"epoch": 2, "valid_auc": 0.97, "samples_per_second": 2000.0, "seconds": 5.0},
        {"epoch": 3, "valid_auc": 0.96, "samples_per_second": 2000.0, "seconds": 5.0},
    ],
    "best_epoch": 2,
    "best_model": "/runs/x/best",
    "test_auc": 0.97,
    "test_logloss": 0.2,
    "seconds": 30.5,
    "traffic": {"pulls": 1000, "grad_pushes": 200, "write_backs": 30, "final_flush": 4,
                "version_checks": 99, "sample_bytes": 12345},
}  # fmt: skip


def test_read_report_takes_every_figure_the_table_prints(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps(REPORT))
    run = bq.read_report(tmp_path / "report.json")
    assert (run.mode, run.seed, run.workers, run.shards) == ("herald", 1, 4, 2)
    assert run.global_batch == 4096
    assert (run.test_auc, run.test_logloss, run.best_epoch, run.epochs) == (0.97, 0.2, 2, 3)
    assert run.seconds == 30.5
    assert run.samples_per_second == 30000 / 20  # samples over the epochs' training seconds
    assert run.rows_moved == 1234  # rows only: pulls, pushes, write-backs, the final flush
    assert run.export_dir == "/runs/x/best"
    naive = bq.TrainRun(**{**run.__dict__, "mode": "naive", "rows_moved": 2468})
    table = "\n".join(bq.quality_table([run], naive, bars=True))
    assert "0.98395" in table and "| 0.50 |" in table and "herald, 1 seeds, mean" in table


def test_read_report_names_the_missing_figure(tmp_path: Path) -> None:
    report = {k: v for k, v in REPORT.items() if k != "test_auc"}
    (tmp_path / "report.json").write_text(json.dumps(report))
    with pytest.raises(KeyError, match="test_auc"):
        bq.read_report(tmp_path / "report.json")


def test_train_command_passes_the_overrides() -> None:
    cmd = bq.train_command(Path("job.yaml"), Path("out"), "naive", 2, 1, 7, 2048, 3)
    assert " ".join(cmd[1:]) == (
        "-m launcher train --job job.yaml --mode naive --workers 2 --shards 1 --seed 7 "
        "--out out --batch-size-per-worker 2048 --max-epochs 3"
    )


def _model(path: Path, keys: list[int], shift: float, dense_shift: float = 0.0) -> str:
    values = np.arange(len(keys) * 2, dtype=np.float32).reshape(-1, 2) + np.float32(shift)
    table = ModelTable("emb", np.array(keys, np.int64), values, Normal(seed=0))
    dense = np.array([1.0, 2.0], np.float32) + np.float32(dense_shift)
    write_model(path, ExportedModel("{}", {"emb": table}, dense, {}))
    return str(path)


def test_exported_difference_is_the_largest_row_and_dense_difference(tmp_path: Path) -> None:
    a = _model(tmp_path / "a", [1, 5, 9], 0.0)
    b = _model(tmp_path / "b", [1, 5, 9], 0.25, 0.5)
    assert bq.exported_difference(a, b) == {"embeddings": 0.25, "dense": 0.5}
    assert bq.exported_difference(a, a) == {"embeddings": 0.0, "dense": 0.0}
    other = _model(tmp_path / "c", [1, 5, 10], 0.0)
    assert bq.exported_difference(a, other)["embeddings"] == float("inf")
