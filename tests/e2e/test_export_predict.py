"""The model leaves the cluster: ``heraldps local --export`` after a real run (shard,
scheduler and worker processes), ``heraldps export`` from its checkpoint and from live
shards, and ``heraldps predict`` scoring the held-out data with the AUC the run reported."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.data import DataSpec, read_all
from heraldps.errors import FailedPrecondition
from heraldps.job import EMBEDDING_TABLE, TrainingJob
from heraldps.model_export import read_model
from launcher.cli import main
from launcher.export import export_from_checkpoint
from tests.conftest import ClusterFactory
from worker_client.evaluation import auc, logloss
from worker_client.predictor import Predictor

MODES = ("herald", "het")
ITERATIONS, WORKERS, BATCH = 10, 2, 128
TEST = str(bundled_data()[1])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short run per mode, checkpointed at iterations 4 and 9, models exported."""
    root = tmp_path_factory.mktemp("export")
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "local", "--modes", ",".join(MODES),
         "--iterations", str(ITERATIONS), "--workers", str(WORKERS), "--batch-size-per-worker",
         str(BATCH), "--checkpoint-every", "5", "--workdir", str(root / "work"),
         "--export", str(root / "models"), "--json", str(root / "report.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"models: {root / 'models' / 'herald'}" in done.stdout
    return root


@pytest.mark.parametrize("mode", MODES)
def test_predict_reports_the_auc_the_run_reported(run: Path, mode: str) -> None:
    reported = json.loads((run / "report.json").read_text())["modes"][mode]
    scores, labels = Predictor.load(run / "models" / mode).score_file(TEST)
    assert auc(labels, scores) == reported["auc"]
    assert logloss(labels, scores) == reported["logloss"]
    out = run / f"{mode}.txt"
    assert main(["predict", "--model", str(run / "models" / mode), "--data", TEST,
                 "--out", str(out)]) == 0  # fmt: skip
    assert np.array_equal(np.loadtxt(out).astype(np.float32), scores)


@pytest.mark.parametrize("mode", MODES)
def test_the_export_holds_the_trained_keys_only(run: Path, mode: str) -> None:
    """The keys of the 10 global batches trained, not the held-out keys evaluation pulled."""
    model = read_model(run / "models" / mode)
    job = TrainingJob.from_json(model.job_json)
    trained = read_all(DataSpec.from_dict({**job.data_spec().to_dict(),
                                           "stop_row": ITERATIONS * WORKERS * BATCH}))  # fmt: skip
    assert np.array_equal(model.tables[EMBEDDING_TABLE].keys, np.unique(trained.keys))
    held_out_only = np.setdiff1d(read_all(job.data_spec(TEST)).keys, trained.keys)
    assert held_out_only.size > 0
    assert not np.isin(held_out_only, model.tables[EMBEDDING_TABLE].keys).any()
    assert model.source["mode"] == mode and model.source["iterations"] == ITERATIONS


def same_model(a: Path, b: Path) -> None:
    left, right = read_model(a), read_model(b)
    assert left.job_json == right.job_json
    assert np.array_equal(left.dense, right.dense)
    for name, table in left.tables.items():
        assert np.array_equal(table.keys, right.tables[name].keys)
        assert np.array_equal(table.values, right.tables[name].values)


@pytest.mark.parametrize("mode", MODES)
def test_the_last_checkpoint_exports_the_final_model(run: Path, mode: str) -> None:
    work = run / "work" / mode
    out = run / f"from-checkpoint-{mode}"
    assert main(["export", "--job", str(work / "job.json"), "--checkpoint",
                 str(work / "checkpoints"), "--out", str(out)]) == 0  # fmt: skip
    same_model(out, run / "models" / mode)
    assert read_model(out).source["iteration"] == ITERATIONS - 1


def test_a_checkpoint_of_another_job_is_refused(run: Path, tmp_path: Path) -> None:
    work = run / "work" / "herald"
    other = replace(TrainingJob.load(work / "job.json"), lr=0.5)
    with pytest.raises(FailedPrecondition, match="written by another job"):
        export_from_checkpoint(other, work / "checkpoints", tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_live_shards_export_the_model_they_hold(
    run: Path, cluster: ClusterFactory, tmp_path: Path
) -> None:
    """Fresh shards load the final checkpoint; ``heraldps export --ps`` reads it back out,
    and so does an export of the snapshot they save."""
    work = run / "work" / "herald"
    _, ps = cluster(3)
    ps.load(str(work / "checkpoints" / f"ckpt-{ITERATIONS - 1:012d}"))
    out = tmp_path / "live"
    assert main(["export", "--job", str(work / "job.json"), "--ps", ",".join(ps.addresses),
                 "--out", str(out)]) == 0  # fmt: skip
    same_model(out, run / "models" / "herald")
    ps.save(str(tmp_path / "snapshot"))
    assert main(["export", "--job", str(work / "job.json"), "--checkpoint",
                 str(tmp_path / "snapshot"), "--out", str(tmp_path / "saved")]) == 0  # fmt: skip
    same_model(tmp_path / "saved", run / "models" / "herald")
    assert read_model(tmp_path / "saved").source["iteration"] == ITERATIONS - 1
