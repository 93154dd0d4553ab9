"""The job's MLP fields (hidden layers, activation, dropout, batch norm): checked, carried to every
process in the job JSON, part of the job's fingerprint, and the model they build."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from heraldps import checkpoints
from heraldps.bundled import bundled_data
from heraldps.errors import InvalidArgument
from heraldps.job import TrainingJob

TRAIN, _ = bundled_data()
DEEP = {"hidden": (400, 400, 400), "activation": "leaky_relu", "dropout": 0.2, "batch_norm": True}


def test_the_mlp_fields_travel_in_the_job_json() -> None:
    job = TrainingJob(data=str(TRAIN), **DEEP)  # type: ignore[arg-type]
    assert TrainingJob.from_json(job.to_json()) == job
    plain = TrainingJob(data=str(TRAIN))
    assert (plain.hidden, plain.activation, plain.dropout) == ((64, 32), "relu", 0.0)
    assert not plain.batch_norm
    variants = (plain, job, replace(plain, hidden=(64,)), replace(plain, activation="tanh"),
                replace(plain, dropout=0.1), replace(plain, batch_norm=True))  # fmt: skip
    prints = {checkpoints.fingerprint(j.to_json(), "herald") for j in variants}
    assert len(prints) == 6  # a checkpoint of one MLP is never resumed as another


def test_a_job_written_before_batch_norm_loads_without_it() -> None:
    """Exports and checkpoints made before the field existed: batch_norm absent is off."""
    raw = json.loads(TrainingJob(data=str(TRAIN)).to_json())
    del raw["batch_norm"]
    old = TrainingJob.from_json(json.dumps(raw))
    assert not old.batch_norm and not old.model().config.batch_norm


def test_batch_norm_extends_the_dense_layout() -> None:
    plain = TrainingJob(data=str(TRAIN), hidden=(400, 400, 400))
    normed = replace(plain, batch_norm=True)
    assert normed.model().config.batch_norm
    assert normed.model().dense_size == plain.model().dense_size + 4 * 1200


def test_the_dense_layout_follows_the_layers() -> None:
    job = TrainingJob(data=str(TRAIN), hidden=(400, 400, 400))
    in0 = job.num_fields * job.embedding_dim + job.num_dense
    widths = [in0, 400, 400, 400, 1]
    layers = sum(a * b + b for a, b in itertools.pairwise(widths))
    assert job.model().dense_size == layers + job.num_dense + 1
    assert job.model().config.activation == "relu"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hidden": (64, 0)}, "--hidden-layers widths must be >= 1, got 64,0"),
        ({"activation": "gelu"}, "--activation must be one of relu, leaky_relu, tanh, sigmoid"),
        ({"dropout": 1.0}, "--dropout must be in [0, 1), got 1.0"),
        ({"batch_norm": True, "dense_sync": "ps"}, "use --dense-sync allreduce (or auto)"),
    ],
)
def test_bad_mlp_fields_name_the_flag(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        TrainingJob(data="x", **fields)  # type: ignore[arg-type]
    assert message in str(error.value)
