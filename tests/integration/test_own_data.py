"""A user's own CSV trains with its numeric columns (issue 22, section 3).

The file is ``examples/make_clicklog.py``'s: 7 categorical columns, an ``age`` of
18-80 and a ``price`` of about 1-1000 with empty cells, a label that depends on both.
Read raw, such columns stopped the model from learning (AUC 0.517); standardized from
the first pass's statistics (the csv default) they must help. Trained with the
single-process reference, which every cluster mode equals (tests/e2e/test_local_training).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from heraldps.data import read_all, scan
from heraldps.job import TrainingJob
from worker_client.evaluation import auc
from worker_client.minibatch import select
from worker_client.reference import ReferenceTrainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "make_clicklog.py"
ROWS, TRAIN_ROWS = 20_000, 16_000


def _clicklog() -> object:
    spec = importlib.util.spec_from_file_location("make_clicklog", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def clicks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("own") / "clicks.csv"
    _clicklog().write_clicklog(path, ROWS)  # type: ignore[attr-defined]
    return path


def held_out_auc(path: Path, dense: tuple[str, ...] | None, transform: str | None) -> float:
    """Train 3 epochs on the first 16k rows, AUC on the last 4k."""
    job = TrainingJob(
        data=str(path), format="csv",
        sparse_columns=("user", "item", "category", "city", "device", "hour", "weekday"),
        label_column="clicked", dense_columns=dense, max_rows=TRAIN_ROWS, workers=4,
        batch_size_per_worker=128, epochs=3, embedding_dim=8,
    )  # fmt: skip
    if dense and transform is not None:
        job = replace(job, dense_transforms=tuple(transform for _ in dense))
    profile = scan(job.data_spec())  # the first pass: statistics the transforms use
    job = replace(job, dense_stats=tuple(s.to_dict() for s in profile.dense_stats) or None)
    reference = ReferenceTrainer(job)
    reference.train(job.read())
    test = read_all(job.data_spec(str(path), start_row=TRAIN_ROWS))
    mb = select(test)
    values, _, _ = reference.rows_of(mb.keys)
    weights = reference.dense_param.from_rows(reference.dense_rows)
    return auc(mb.labels, reference.model.predict(weights, values, mb.field_rows, mb.dense))


@pytest.fixture(scope="module")
def without(clicks: Path) -> float:
    """The held-out AUC of the categorical columns alone: the bar the numeric ones must clear."""
    return held_out_auc(clicks, None, None)


def test_numeric_columns_help_with_the_default_transform(clicks: Path, without: float) -> None:
    with_numeric = held_out_auc(clicks, ("age", "price"), None)  # csv default: standardize
    assert without > 0.6, without
    assert with_numeric >= without + 0.02, (with_numeric, without)


@pytest.mark.parametrize("transform", ["minmax", "log1p"])
def test_other_transforms_train_too(clicks: Path, transform: str, without: float) -> None:
    assert held_out_auc(clicks, ("age", "price"), transform) >= without
