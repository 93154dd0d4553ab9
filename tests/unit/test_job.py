"""TrainingJob's byte accounting: what a row weighs per direction, step counts included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from heraldps.job import TrainingJob
from heraldps.modes import HET_MODE


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
