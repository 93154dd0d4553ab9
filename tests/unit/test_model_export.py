"""An exported model scores as the model that was trained: the single-process reference
trains on the bundled sample, its rows and dense vector are written as ``heraldps export``
writes them, and ``Predictor`` must reproduce the reference's held-out scores bit for bit.
Damaged or missing model files are refused with one line; unseen keys behave as documented
(docs/serving.md)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.data import scan, stream
from heraldps.errors import FailedPrecondition
from heraldps.job import EMBEDDING_TABLE, TrainingJob
from heraldps.model_export import ExportedModel, ModelError, read_model, touched, write_model
from launcher.cli import main
from worker_client.evaluation import auc, logloss
from worker_client.minibatch import select
from worker_client.predictor import EVAL_CHUNK_ROWS, Predictor, rows_of
from worker_client.reference import ReferenceTrainer

TRAIN, TEST = (str(p) for p in bundled_data())


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReferenceTrainer, Path]:
    """12 iterations of the reference on the bundled sample, dense columns standardized
    with the training data's statistics (so the export must carry them), exported."""
    job = TrainingJob(data=TRAIN, workers=2, batch_size_per_worker=64, iterations=12,
                      optimizer="adam", embedding_dim=4, hidden=(16, 8),
                      dense_transforms=("standardize",) * 13)  # fmt: skip
    stats = scan(job.data_spec()).dense_stats
    job = replace(job, dense_stats=tuple(s.to_dict() for s in stats))
    reference = ReferenceTrainer(job)
    data = job.read()
    reference.train(data)
    # Every key of the data: those the 12 iterations did not reach have version 0.
    keys = np.unique(data.keys)
    values, _, versions = reference.rows_of(keys)
    table = touched(EMBEDDING_TABLE, keys, values, versions, job.make_initializer())
    dense = reference.dense_param.from_rows(reference.dense_rows)
    model = ExportedModel(job.to_json(), {EMBEDDING_TABLE: table}, dense, {})
    out = write_model(tmp_path_factory.mktemp("model") / "m", model)
    return reference, out


def reference_scores(reference: ReferenceTrainer) -> tuple[np.ndarray, np.ndarray]:
    """The held-out scores as ``heraldps local`` evaluates: 65,536-row chunks, every key's
    row pulled (an unseen key created with its initial value, as a shard does)."""
    dense = reference.dense_param.from_rows(reference.dense_rows)
    scores, labels = [], []
    for chunk in stream(reference.job.data_spec(TEST), EVAL_CHUNK_ROWS):
        mb = select(chunk)
        values, _, _ = reference.rows_of(mb.keys)
        scores.append(reference.model.predict(dense, values, mb.field_rows, mb.dense))
        labels.append(mb.labels)
    return np.concatenate(scores), np.concatenate(labels)


def test_predict_reproduces_the_trained_models_scores_bit_for_bit(
    trained: tuple[ReferenceTrainer, Path], tmp_path: Path
) -> None:
    reference, model_dir = trained
    expected, labels = reference_scores(reference)
    scores, got_labels = Predictor.load(model_dir).score_file(TEST)
    assert scores.dtype == np.float32 and scores.shape == expected.shape
    assert np.array_equal(scores.view(np.int32), expected.view(np.int32))
    assert np.array_equal(got_labels, labels)
    out = tmp_path / "scores.txt"
    assert main(["predict", "--model", str(model_dir), "--data", TEST, "--out", str(out)]) == 0
    written = np.loadtxt(out, dtype=np.float64).astype(np.float32)
    assert np.array_equal(written, expected)  # %.9g reads back to the same float32
    assert auc(labels, written) == auc(labels, expected)
    assert logloss(labels, written) == logloss(labels, expected)


def test_no_label_data_scores_the_same(
    trained: tuple[ReferenceTrainer, Path], tmp_path: Path
) -> None:
    """``--no-label``: the criteo layout keeps its label field, its cells unread."""
    blank = tmp_path / "no-label.tsv"
    lines = Path(TEST).read_text().splitlines()
    blank.write_text("".join("\t" + line.split("\t", 1)[1] + "\n" for line in lines))
    out = tmp_path / "scores.txt"
    args = ["predict", "--model", str(trained[1]), "--data", str(blank), "--out", str(out)]
    assert main([*args, "--no-label"]) == 0
    expected, _ = Predictor.load(trained[1]).score_file(TEST)
    assert np.array_equal(np.loadtxt(out).astype(np.float32), expected)


def test_the_export_holds_exactly_the_rows_training_updated(
    trained: tuple[ReferenceTrainer, Path],
) -> None:
    reference, model_dir = trained
    model = read_model(model_dir)
    table = model.tables[EMBEDDING_TABLE]
    keys = np.unique(reference.job.read().keys)  # sorted
    values, _, versions = reference.rows_of(keys)
    assert np.array_equal(table.keys, keys[versions > 0])
    assert np.array_equal(table.values, values[versions > 0])
    assert 0 < table.keys.size < keys.size  # rows the 12 iterations never reached: left out
    assert model.job_json == reference.job.to_json()


def test_unseen_keys_get_the_initializer_value_or_zero(
    trained: tuple[ReferenceTrainer, Path],
) -> None:
    _, model_dir = trained
    table = read_model(model_dir).tables[EMBEDDING_TABLE]
    unseen = np.setdiff1d(np.arange(1, 200, dtype=np.int64) * 7919, table.keys)[:5]
    keys = np.concatenate([table.keys[:3], unseen])
    initial = rows_of(table, keys, "initializer")
    zero = rows_of(table, keys, "zero")
    assert np.array_equal(initial[:3], table.values[:3]) and np.array_equal(zero[:3], initial[:3])
    assert np.array_equal(initial[3:], table.initializer.generate(unseen, table.values.shape[1]))
    assert np.abs(initial[3:]).max() > 0
    assert not zero[3:].any()
    # Whole rows: a row whose keys are all unseen scores from the dense part and the
    # initial rows alone; with zeros its FM term vanishes, so the two differ.
    predictor = Predictor.load(model_dir)
    chunk = next(stream(predictor.data_spec(TEST), 4))
    fresh = replace(chunk, keys=chunk.keys + np.int64(1 << 60))
    assert not np.isin(fresh.keys, table.keys).any()
    with_init = predictor.score(fresh)
    with_zero = Predictor.load(model_dir, unseen="zero").score(fresh)
    assert np.all(np.isfinite(with_init)) and not np.array_equal(with_init, with_zero)


def damage(model_dir: Path, copy_to: Path, name: str) -> Path:
    """A copy of the model with one byte of ``name`` flipped."""
    copy_to.mkdir()
    for f in model_dir.iterdir():
        (copy_to / f.name).write_bytes(f.read_bytes())
    data = bytearray((copy_to / name).read_bytes())
    data[-1] ^= 0x01
    (copy_to / name).write_bytes(bytes(data))
    return copy_to


@pytest.mark.parametrize("name", ["emb.values.npy", "emb.keys.npy", "dense.npy", "job.json"])
def test_a_damaged_file_is_refused(
    trained: tuple[ReferenceTrainer, Path], tmp_path: Path, name: str
) -> None:
    bad = damage(trained[1], tmp_path / "bad", name)
    with pytest.raises(ModelError, match=f"{re.escape(name)} differs from the checksum"):
        read_model(bad)


def test_a_missing_file_and_a_foreign_manifest_are_refused(
    trained: tuple[ReferenceTrainer, Path], tmp_path: Path
) -> None:
    bad = damage(trained[1], tmp_path / "bad", "job.json")
    (bad / "job.json").unlink()
    with pytest.raises(ModelError, match=r"job\.json is missing"):
        read_model(bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    other_keys = {**manifest["key_function"], "test_vector": {"column_index": 0,
                  "value": "68fd1e64", "key": 1}}  # fmt: skip
    (bad / "manifest.json").write_text(json.dumps({**manifest, "key_function": other_keys}))
    with pytest.raises(ModelError, match="its key_function is not this heraldps's"):
        read_model(bad)
    (bad / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(ModelError, match="format_version 99"):
        read_model(bad)
    (bad / "manifest.json").unlink()
    with pytest.raises(ModelError, match=r"no manifest\.json"):
        read_model(bad)


@pytest.mark.parametrize("case", ["missing", "empty", "damaged"])
def test_predict_says_what_is_wrong_in_one_line(
    trained: tuple[ReferenceTrainer, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    model = {
        "missing": tmp_path / "nowhere",
        "empty": tmp_path,
        "damaged": tmp_path / "bad",
    }[case]
    if case == "damaged":
        damage(trained[1], model, "emb.values.npy")
    out = tmp_path / "scores.txt"
    code = main(["predict", "--model", str(model), "--data", TEST, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("heraldps predict: model ") and not out.exists()


def test_an_export_never_overwrites(trained: tuple[ReferenceTrainer, Path]) -> None:
    model = read_model(trained[1])
    with pytest.raises(FailedPrecondition, match="already exists"):
        write_model(trained[1], model)


def test_local_refuses_an_existing_export_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "herald").mkdir()
    assert main(["local", "--modes", "herald", "--export", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and len(err.strip().splitlines()) == 1, err


def test_export_without_a_checkpoint_says_so(
    trained: tuple[ReferenceTrainer, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = str(trained[1] / "job.json")
    out = tmp_path / "m"
    code = main(["export", "--job", job, "--checkpoint", str(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "no complete checkpoint there" in err and not out.exists(), err
