"""Two runs of one job give the same bits (issue #14, section 5).

The PS sums an iteration's pushed gradients per worker and adds the workers'
sums in worker order (``ps_server/grad_buffer.py``), so the order the pushes
arrive in, which differs from run to run, no longer reaches the model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from heraldps.bundled import bundled_data
from heraldps.job import TrainingJob
from launcher.local import run_mode
from scheduler_service.simulate import cache_rows_for

TRAIN, _ = bundled_data()


def job() -> TrainingJob:
    small = TrainingJob(
        data=str(TRAIN), workers=4, batch_size_per_worker=64, iterations=30,
        optimizer="adagrad", embedding_dim=4, hidden=(16,),
    )  # fmt: skip
    return replace(small, cache_rows=cache_rows_for(small.read(), 0.03))


def by_key(model: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = np.argsort(model["keys"], kind="stable")
    rows = {f: model[f][order] for f in ("keys", "values", "state", "versions")}
    rows.update({f: model[f] for f in ("dense_values", "dense_state")})
    return rows


def test_two_runs_give_the_same_bits(tmp_path: Path) -> None:
    """Four workers push the hot keys every iteration, in whatever order the network
    delivers; every row, optimizer state, clock and dense parameter is equal bit for bit.
    Mode naive pushes the most gradients; every mode sums them in the same buffer."""
    mode = "naive"
    the_job = job()
    train = the_job.read()
    runs = [
        by_key(run_mode(the_job, mode, 2, train, None, tmp_path / f"run{i}", keep_model=True).model)
        for i in range(2)
    ]
    for field, first in runs[0].items():
        assert np.array_equal(first, runs[1][field]), (mode, field)
