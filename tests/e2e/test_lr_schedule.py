"""A learning rate that changes during a run (a plateau decay): every mode still trains
the single-process model, through real shard, scheduler and worker processes.

The feeder gives each iteration its ``lr_scale``; the scheduler hands it to the workers in
the iteration's plans (cache rows, dense all-reduce replicas) and to the shards in the
iteration's commit (pushed rows, the PS dense table). A scale that changes mid-run shows
whether every place applies it at the same iteration: one place off by one iteration
trains a visibly different model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from launcher.divergence import model_difference
from launcher.local import run_mode
from tests.e2e.test_local_training import small_job
from tests.reference_model import assert_matches_reference
from worker_client.reference import ReferenceTrainer

ITERATIONS = 9
# Decayed twice, as a plateau schedule with factor 0.1 would: 1, 0.1, 0.1 x 0.1.
SCALES = [1.0] * 3 + [0.1] * 3 + [0.1 * 0.1] * 3


# HET and naive give each worker the same samples; herald moves the dense rows through
# the PS here (the commit's scale on the dense table), the others all-reduce them.
# herald_pipelined looks 3 batches ahead: its pass-through gradients may go with the next
# plan only where that iteration's lr is the same (without that check it fails here).
RUNS = (("naive", "allreduce", 1), ("het", "allreduce", 1), ("herald", "ps", 1),
        ("herald_pipelined", "allreduce", 3))  # fmt: skip


def test_a_decayed_lr_trains_the_single_process_model_in_every_mode(tmp_path: Path) -> None:
    job = replace(small_job("adam"), iterations=ITERATIONS, workers=2)  # 2 x 32 samples
    train = job.read()
    reference = ReferenceTrainer(job)
    reference.train(train, SCALES)
    constant = ReferenceTrainer(job)
    constant.train(train)
    assert not np.allclose(constant.dense_rows, reference.dense_rows, rtol=1e-3, atol=1e-6)
    models = {}
    for mode, dense_sync, look_ahead in RUNS:
        run = replace(job, dense_sync=dense_sync, look_ahead=look_ahead)
        result = run_mode(run, mode, 1, train, None, tmp_path / mode, keep_model=True,
                          lr_scales=SCALES)  # fmt: skip
        model = models[mode] = result.model
        assert_matches_reference(model, reference, mode)
    same = model_difference(models["het"], models["naive"])
    assert same.bit_identical, same
