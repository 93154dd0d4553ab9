"""Real local clusters (shard, scheduler and worker subprocesses) training the CTR model.

The invariant that matters most: with staleness 0, every mode ends with the
model single-process training produces (embeddings, optimizer state,
versions, dense parameters), up to float32 summation order, and modes that
give each worker the same samples end bit-identical; and the
traffic the workers count from their RPCs is what ``heraldps simulate``
predicts for the same batches, row for row.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.job import TrainingJob
from heraldps.modes import (
    ALL_MODES,
    EARLY_WRITE_BACK_ALL,
    HERALD_MODES,
    HET_MODE,
    MODES,
    PIPELINED_MODE,
)
from launcher.cluster import ClusterError
from launcher.divergence import model_difference
from launcher.local import run_mode
from launcher.report import ps_agrees
from scheduler_service.simulate import SimulationConfig, cache_rows_for, simulate
from tests.reference_model import assert_matches_reference
from worker_client.reference import ReferenceTrainer

TRAIN, TEST = bundled_data()
ITERATIONS = 20


# One mode per way a worker steps (on_demand and location_aware train bit-identically to
# naive and herald: test_every_mode_trains_the_single_process_model checks it), to keep CI lean.
STEP_FLOWS = ("naive", "herald", PIPELINED_MODE, "het")


def small_job(optimizer: str) -> TrainingJob:
    job = TrainingJob(
        data=str(TRAIN), workers=4, batch_size_per_worker=32, iterations=ITERATIONS,
        optimizer=optimizer, embedding_dim=4, hidden=(16,),
    )  # fmt: skip
    # A cache of 3% of the file's keys: evictions (and eviction write-backs) happen.
    return replace(job, cache_rows=cache_rows_for(job.read(), 0.03))


# Adam (two state columns) in every mode; SGD (no state) in one mode of each partitioner and
# HET (CI time); AdaGrad, the default optimizer, trains the single-process model in most other
# e2e tests (resume, divergence, reproducibility, l2).
@pytest.mark.parametrize(
    ("optimizer", "modes"), [("sgd", ("naive", "herald", HET_MODE)), ("adam", ALL_MODES)]
)
def test_every_mode_trains_the_single_process_model(
    optimizer: str, modes: tuple[str, ...], tmp_path: Path
) -> None:
    job = small_job(optimizer)
    train = job.read()
    reference = ReferenceTrainer(job)
    reference.train(train)
    predicted = simulate(train, SimulationConfig(str(TRAIN), "criteo", 4, 32, 0.03, ITERATIONS))[
        "modes"
    ]
    models = {}
    for mode in modes:
        result = run_mode(job, mode, 2, train, None, tmp_path / mode, keep_model=True)
        model = models[mode] = result.model
        versions = assert_matches_reference(model, reference, mode)
        if mode in HERALD_MODES:  # HET writes no rows back, so its clocks count commits only
            assert np.array_equal(model["versions"], versions), mode
        assert ps_agrees(result), (mode, result.traffic, result.ps_counted)
        if mode in HERALD_MODES:
            live, expected = result.traffic, predicted[mode]
            assert live["pulls"] == expected["pulls"], mode
            assert live["state_pulls"] == expected["state_pulls"] < expected["pulls"], mode
            assert live["grad_pushes"] + live["write_backs"] == expected["pushes"], mode
            assert live["final_flush"] == expected["final_flush"], mode
        if mode == PIPELINED_MODE:  # herald's rows, some fetched while the previous trained
            assert predicted[mode]["pulls"] == predicted["herald"]["pulls"]
            assert 0 < live["early_pulls"] <= predicted[mode]["early_pulls"]
    # Modes that give each worker the same samples add the same terms in the same order:
    # naive, on_demand and het; location_aware, herald and herald_pipelined.
    first_of: dict[str, str] = {}
    for mode in modes:
        first = first_of.setdefault(MODES[mode].partitioner, mode)
        same = model_difference(models[mode], models[first])
        assert same.bit_identical, (first, mode, same)


def test_a_deeper_mlp_with_dropout_trains_the_single_process_model(tmp_path: Path) -> None:
    """Hidden layers, activation and dropout reach every worker process through the job
    file; each sample drops the units its global index draws, whichever worker trains it."""
    job = replace(small_job("adam"), iterations=10, hidden=(12, 8, 8), activation="sigmoid",
                  dropout=0.3)  # fmt: skip
    train = job.read()
    reference = ReferenceTrainer(job)
    reference.train(train)
    plain = ReferenceTrainer(replace(job, dropout=0.0))
    plain.train(train)
    assert not np.allclose(plain.dense_rows, reference.dense_rows)  # dropout changed training
    for mode in STEP_FLOWS:
        model = run_mode(job, mode, 2, train, None, tmp_path / mode, keep_model=True).model
        assert_matches_reference(model, reference, mode, dense_state=False)


def test_cached_ps_shards_train_the_same_model(tmp_path: Path) -> None:
    """--store cached, with a PS cache far smaller than the table (evictions on the shards);
    dense parameters through the PS (the other tests all-reduce them among the workers)."""
    job = replace(small_job("adagrad"), dense_sync="ps")
    train = job.read()
    reference = ReferenceTrainer(job)
    reference.train(train)
    for mode in ("herald", "herald_pipelined", "het"):
        result = run_mode(job, mode, 2, train, None, tmp_path / mode, keep_model=True,
                          store="cached", cache_gb=500 * 56 / 2**30)  # fmt: skip
        model = result.model
        assert_matches_reference(model, reference, mode, dense_state=False)
        assert ps_agrees(result), mode


@pytest.mark.parametrize(
    ("dense_sync", "modes"), [("allreduce", STEP_FLOWS), ("ps", ("naive", "herald", "het"))]
)
def test_every_mode_trains_the_single_process_model_with_l2(
    dense_sync: str, modes: tuple[str, ...], tmp_path: Path
) -> None:
    """Embedding L2 and dense weight decay on (Adam, as BARS trains Frappe): the workers'
    caches, the PS and the all-reduce replicas apply them as the single process does."""
    job = replace(small_job("adam"), embedding_l2=0.05, weight_decay=0.01, dense_sync=dense_sync)
    train = job.read()
    reference = ReferenceTrainer(job)
    reference.train(train)
    plain = ReferenceTrainer(replace(job, embedding_l2=0.0, weight_decay=0.0))
    plain.train(train)
    assert not np.allclose(plain.values, reference.values, rtol=1e-3, atol=1e-5)
    assert not np.allclose(plain.dense_rows, reference.dense_rows, rtol=1e-3, atol=1e-5)
    for mode in modes:
        result = run_mode(job, mode, 2, train, None, tmp_path / mode, keep_model=True)
        model = result.model
        assert_matches_reference(model, reference, mode)
        assert ps_agrees(result), mode


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["herald", "herald_pipelined", "het"])
def test_gpu_workers_train_the_single_process_model(mode: str, tmp_path: Path) -> None:
    """The CuPy cache and model path: the same model as NumPy single-process training
    (herald_pipelined holding 2 plans ahead, --prefetch-plans 2; the others ignore it)."""
    job = replace(small_job("adam"), device="gpu", prefetch_plans=2)
    train = job.read()
    reference = ReferenceTrainer(job)
    reference.train(train)
    model = run_mode(job, mode, 2, train, None, tmp_path, keep_model=True).model
    assert_matches_reference(model, reference, mode, dense_state=False)


def test_het_with_staleness_moves_fewer_rows_at_equal_quality(tmp_path: Path) -> None:
    job = replace(small_job("adagrad"), iterations=None, batch_size_per_worker=128)
    job = replace(job, cache_rows=cache_rows_for(job.read(), 0.1))
    train, test = job.read(), job.read(str(TEST))
    exact = run_mode(job, "het", 2, train, test, tmp_path / "s0")
    stale = run_mode(replace(job, staleness=2), "het", 2, train, test, tmp_path / "s2")
    moved = {r.mode + str(i): r.traffic["pulls"] + r.traffic["grad_pushes"]
             for i, r in enumerate((exact, stale))}  # fmt: skip
    assert moved["het1"] < moved["het0"]
    assert abs(stale.auc - exact.auc) <= 0.01, (stale.auc, exact.auc)


def _kill_when(workdir: Path, name: str, sig: int, after: float) -> threading.Thread:
    def kill() -> None:
        deadline = time.monotonic() + 120
        pid_file = workdir / f"{name}.pid"
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(after)
        os.kill(int(pid_file.read_text()), sig)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("victim", ["worker-2", "ps-1"])
def test_a_dead_worker_or_shard_fails_the_run_with_a_message(victim: str, tmp_path: Path) -> None:
    job = replace(small_job("sgd"), iterations=None, epochs=50)
    killer = _kill_when(tmp_path, victim, signal.SIGKILL, after=4.0)
    started = time.monotonic()
    with pytest.raises(ClusterError, match=victim.split("-")[0]):
        run_mode(job, "herald", 2, job.read(), None, tmp_path)
    killer.join()
    assert time.monotonic() - started < 120


# One stateful optimizer: a write-back copies the row and its state whatever the update rule
# (the plans are the same for every optimizer; tests/unit/test_scheduler.py checks them).
@pytest.mark.parametrize("optimizer", ["adam"])
def test_early_write_backs_train_the_same_model(optimizer: str, tmp_path: Path) -> None:
    """With early write-backs (a cache large enough for dirty rows to pile up) the final
    flush of every on-demand mode shrinks to what the last batches dirtied, and a live
    herald_pipelined run, its scheduler looking 3 batches ahead and its plans flowing 2
    iterations ahead (--prefetch-plans 2), ends with the single-process model and
    simulate's counts for that look-ahead (the prefetch depth moves no row)."""
    job = small_job(optimizer)
    train = job.read()
    job = replace(job, cache_rows=cache_rows_for(train, 0.3), early_write_back=EARLY_WRITE_BACK_ALL,
                  look_ahead=3, prefetch_plans=2)  # fmt: skip
    reference = ReferenceTrainer(job)
    reference.train(train)
    config = SimulationConfig(str(TRAIN), "criteo", 4, 32, 0.3, ITERATIONS, early_write_back=0)
    without = simulate(train, config)["modes"]
    predicted = simulate(train, replace(config, early_write_back=job.early_write_back))["modes"]
    ahead = simulate(train, replace(config, early_write_back=job.early_write_back,
                                    look_ahead=(job.look_ahead,)))["modes"]  # fmt: skip
    for mode in ("on_demand", "herald", PIPELINED_MODE):
        assert predicted[mode]["final_flush"] <= 0.2 * without[mode]["final_flush"], mode
    # Live: the pipelined mode (Herald's plans, early pulls and idle-link write-backs); every
    # mode runs with early write-backs, the default, in the tests above at a 3% cache.
    mode = PIPELINED_MODE
    result = run_mode(job, mode, 2, train, None, tmp_path / mode, keep_model=True)
    versions = assert_matches_reference(result.model, reference, mode)
    assert np.array_equal(result.model["versions"], versions)
    assert ps_agrees(result), (result.traffic, result.ps_counted)
    live, expected = result.traffic, ahead[mode]
    assert live["pulls"] == expected["pulls"]
    assert live["grad_pushes"] + live["write_backs"] == expected["pushes"]
    assert live["final_flush"] == expected["final_flush"]
    assert 0 < live["early_pulls"] <= expected["early_pulls"]
