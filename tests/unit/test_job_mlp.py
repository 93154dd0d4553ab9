"""The job's MLP fields (hidden layers, activation, dropout): checked, carried to every
process in the job JSON, part of the job's fingerprint, and the model they build."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from heraldps import checkpoints
from heraldps.bundled import bundled_data
from heraldps.errors import InvalidArgument
from heraldps.job import TrainingJob

TRAIN, _ = bundled_data()
DEEP = {"hidden": (400, 400, 400), "activation": "leaky_relu", "dropout": 0.2}


def test_the_mlp_fields_travel_in_the_job_json() -> None:
    job = TrainingJob(data=str(TRAIN), **DEEP)  # type: ignore[arg-type]
    assert TrainingJob.from_json(job.to_json()) == job
    plain = TrainingJob(data=str(TRAIN))
    assert (plain.hidden, plain.activation, plain.dropout) == ((64, 32), "relu", 0.0)
    variants = (plain, job, replace(plain, hidden=(64,)), replace(plain, activation="tanh"),
                replace(plain, dropout=0.1))  # fmt: skip
    prints = {checkpoints.fingerprint(j.to_json(), "herald") for j in variants}
    assert len(prints) == 5  # a checkpoint of one MLP is never resumed as another


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
    ],
)
def test_bad_mlp_fields_name_the_flag(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument) as error:
        TrainingJob(data="x", **fields)  # type: ignore[arg-type]
    assert message in str(error.value)
