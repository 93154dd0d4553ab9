"""TrainingJob's byte accounting (what a row weighs per direction, step counts included)
and the optimizer it builds from a name."""

from __future__ import annotations

from dataclasses import replace

import pytest

from heraldps.errors import InvalidArgument
from heraldps.job import TrainingJob
from heraldps.modes import HET_MODE
from heraldps.optim import SGD, AdaGrad, Adam, Optimizer


@pytest.mark.parametrize(
    ("optimizer", "staleness", "mode", "steps_bytes"),
    [
        ("adam", 2, HET_MODE, 4),  # pushes carry each row's int32 step count
        ("adagrad", 1, HET_MODE, 4),
        ("sgd", 2, HET_MODE, 0),  # SGD's update does not depend on the steps: none sent
        ("adam", 0, HET_MODE, 0),  # s = 0: every gradient is one step
        ("adam", 2, "herald", 0),  # plans push plain gradients
    ],
)
def test_grad_push_bytes_count_the_step_counts_sent(
    optimizer: str, staleness: int, mode: str, steps_bytes: int
) -> None:
    job = replace(TrainingJob(data="x"), optimizer=optimizer, staleness=staleness)
    sizes = job.row_bytes(mode)
    assert sizes["grad_push"] == 8 + 4 * job.embedding_dim + steps_bytes
    assert job.pushes_steps == (staleness > 0 and optimizer != "sgd")
    if mode == HET_MODE:
        assert sizes["final_flush"] == sizes["grad_push"]


@pytest.mark.parametrize(
    ("optimizer", "lr", "expected"),
    [
        ("sgd", None, SGD(lr=0.05)),
        ("adagrad", None, AdaGrad(lr=0.05, initial_accumulator=0.1, eps=1e-8)),
        ("adam", None, Adam(lr=0.001, eps=1e-6)),
        ("adam", 0.01, Adam(lr=0.01, eps=1e-6)),
        ("adagrad", 0.2, AdaGrad(lr=0.2, initial_accumulator=0.1, eps=1e-8)),
    ],
)
def test_a_named_optimizer_gets_the_job_defaults(
    optimizer: str, lr: float | None, expected: Optimizer
) -> None:
    """The registry's job defaults are the values the job used before the registry."""
    assert TrainingJob(data="x", optimizer=optimizer, lr=lr).make_optimizer() == expected


def test_an_unknown_optimizer_lists_the_registered_ones() -> None:
    with pytest.raises(InvalidArgument, match="--optimizer must be one of sgd, adagrad, adam"):
        TrainingJob(data="x", optimizer="rmsprop")


def test_embedding_l2_and_weight_decay_go_to_their_tables_optimizers() -> None:
    job = TrainingJob(data="x", optimizer="adam", embedding_l2=0.05, weight_decay=0.01)
    assert job.make_optimizer() == Adam(lr=0.001, eps=1e-6, l2=0.05)
    assert job.dense_optimizer() == Adam(lr=0.001, eps=1e-6, l2=0.01)
    assert TrainingJob.from_json(job.to_json()) == job
    plain = TrainingJob(data="x", optimizer="adam")  # defaults: no L2 anywhere
    assert plain.make_optimizer() == plain.dense_optimizer() == Adam(lr=0.001, eps=1e-6)
    # With L2 every SGD step decays the row again, so HET pushes carry the step counts.
    assert replace(job, optimizer="sgd", staleness=2).pushes_steps
    assert not replace(job, optimizer="sgd", staleness=2, embedding_l2=0.0).pushes_steps


@pytest.mark.parametrize("field", ["embedding_l2", "weight_decay"])
def test_negative_l2_is_refused_with_its_flag(field: str) -> None:
    flag = "--" + field.replace("_", "-")
    with pytest.raises(InvalidArgument, match=flag):
        TrainingJob(data="x", **{field: -0.1})
