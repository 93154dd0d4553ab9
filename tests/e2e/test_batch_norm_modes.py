"""Batch normalization through real worker processes: every mode trains one model.

Each worker normalizes its share of a global batch with the statistics of the whole
batch, summed over the workers' collective, so naive, herald and HET end where
single-process training on the whole batch does. The group rule still holds (naive =
HET, bit for bit), and herald differs from naive
by no more than naive does from itself with each batch's samples shuffled among the
workers (the divergence control of test_mode_divergence.py). herald_pipelined is left
out to keep CI short: it trains with PlanStep's code, as herald, and its early pulls
overlap nothing batch norm reduces (tests/integration/test_dense_allreduce.py checks that
the statistics' rounds and the dense gradient's never meet).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from heraldps.data.global_batches import InMemoryBatches
from launcher.divergence import ShuffledBatches, model_difference
from launcher.local import run_mode
from tests.e2e.test_local_training import small_job
from tests.e2e.test_mode_divergence import SPREAD
from tests.reference_model import assert_matches_reference
from worker_client.reference import ReferenceTrainer


def test_every_step_flow_trains_the_single_process_model_with_batch_norm(
    tmp_path: Path,
) -> None:
    # Two workers x 64 (the same global batch as small_job's 4 x 32) and one shard: fewer
    # processes for CI.
    job = replace(small_job("adam"), workers=2, batch_size_per_worker=64, iterations=8,
                  hidden=(12, 8), batch_norm=True, dropout=0.2, weight_decay=0.01,
                  dense_sync="allreduce")  # fmt: skip
    train = job.read()
    reference = ReferenceTrainer(job)
    reference.train(train)
    model = job.model()
    running = model.running_index
    dense = reference.dense_param.from_rows(reference.dense_rows)
    initial = model.init_dense()
    assert not np.allclose(dense[running], initial[running])  # the running stats moved
    batches = InMemoryBatches(train, job.global_batch, job.iterations)
    models = {}
    for mode in ("naive", "het", "herald"):
        result = run_mode(job, mode, 1, batches, None, tmp_path / mode, keep_model=True)
        models[mode] = got = result.model
        assert_matches_reference(got, reference, mode, dense_state=False)
    assert model_difference(models["het"], models["naive"]).bit_identical
    shuffled = ShuffledBatches(train, job.global_batch, job.iterations, seed=0)
    control = run_mode(job, "naive", 1, shuffled, None, tmp_path / "shuffled", keep_model=True)
    chance = model_difference(control.model, models["naive"]).largest
    herald = model_difference(models["herald"], models["naive"]).largest
    assert chance > 0 and herald <= SPREAD * chance, (herald, chance)
