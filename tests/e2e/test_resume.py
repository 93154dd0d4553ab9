"""Checkpoints and exact resume on real local clusters (shard, scheduler and worker
subprocesses), compared with single-process training on the same batches.

A checkpoint of iteration t must be the model after t, including the rows only a
worker's cache held (on-demand sync keeps them dirty there) and the dense replica the
workers all-reduce; a run whose processes are killed with SIGKILL and resumed from its
checkpoints must end with the model of a run never interrupted.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps import checkpoints
from heraldps.job import DENSE_TABLE, EMBEDDING_TABLE
from heraldps.modes import HERALD_MODES
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from launcher.cluster import ClusterError
from launcher.local import Recovery, run_mode
from ps_server.snapshot import read_for_shard
from tests.e2e.test_local_training import small_job
from tests.reference_model import assert_matches_reference
from worker_client.reference import ReferenceTrainer


def _snapshot_model(path: Path) -> dict[str, np.ndarray]:
    """Every row of a checkpoint's snapshot, as ``read_model`` lays a live model out."""
    _, tables = read_for_shard(path, 0, 1)
    blocks = {spec.name: block for spec, block in tables}
    emb, dense = blocks[EMBEDDING_TABLE], blocks[DENSE_TABLE]
    order = np.argsort(dense.keys)
    return {
        "keys": emb.keys,
        "values": emb.values,
        "state": emb.state,
        "versions": emb.versions,
        "dense_values": dense.values[order],
        "dense_state": dense.state[order],
    }


@pytest.mark.parametrize("mode", ["herald", "herald_pipelined", "het"])
def test_a_checkpoint_is_the_model_after_its_iteration(mode: str, tmp_path: Path) -> None:
    """Under on-demand sync rows stay dirty in worker caches for many iterations; the
    checkpoint's plans write them back, and the dense replica reaches the PS, so the
    snapshot after iteration t equals single-process training of batches 0..t."""
    job = small_job("adagrad")
    train = job.read()
    result = run_mode(job, mode, 2, train, None, tmp_path, keep_model=True,
                      recovery=Recovery(checkpoint_every=5, keep=4))  # fmt: skip
    found = checkpoints.complete(tmp_path / "checkpoints")
    assert [m.iteration for _, m in found] == [4, 9, 14, 19]
    for path, manifest in found[:2]:
        assert manifest.next_iteration == manifest.iteration + 1
        assert manifest.samples_seen == (manifest.iteration + 1) * job.global_batch
        assert manifest.num_shards == 2 and manifest.mode == mode
        reference = ReferenceTrainer(replace(job, iterations=manifest.iteration + 1))
        reference.train(train)
        snapshot = _snapshot_model(path)
        assert_matches_reference(snapshot, reference, f"{mode} checkpoint {manifest.iteration}")
        if mode in HERALD_MODES:
            _, _, versions = reference.rows_of(snapshot["keys"])
            assert np.array_equal(snapshot["versions"], versions)
    # Writing checkpoints changes the traffic, never the model.
    reference = ReferenceTrainer(job)
    reference.train(train)
    assert_matches_reference(result.model, reference, f"{mode} final")


class Killer:
    """Kills ``victims`` (process names: worker-1, ps-0, scheduler) with SIGKILL, one after
    another, each once the run has committed its iteration (the scheduler's GetStatus,
    read through its port file, so a restarted scheduler is followed)."""

    def __init__(self, workdir: Path, victims: list[tuple[str, int]]) -> None:
        self.workdir, self.victims = workdir, victims
        self.killed: list[tuple[str, int, int]] = []  # name, iteration seen, pid
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _committed(self) -> int:
        port_file = self.workdir / "scheduler.port"
        try:
            port = port_file.read_text().split()[0]
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=1)
                return int(status.committed_iteration)
        except (OSError, IndexError, grpc.RpcError):
            return -1

    def _port(self) -> str:
        try:
            return (self.workdir / "scheduler.port").read_text()
        except OSError:
            return ""

    def _run(self) -> None:
        deadline = time.monotonic() + 240
        killed_under = ""  # the scheduler (port file) of the last kill: wait for a new one
        for name, iteration in self.victims:
            while time.monotonic() < deadline:
                port = self._port()
                committed = self._committed() if port and port != killed_under else -1
                if committed >= iteration:
                    killed_under = port
                    pid = int((self.workdir / f"{name}.pid").read_text())
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append((name, committed, pid))
                    time.sleep(1.0)  # the launcher notices, stops the rest, restarts
                    break
                time.sleep(0.02)


def test_killed_processes_resume_to_the_uninterrupted_model(tmp_path: Path) -> None:
    """A worker, a shard and the scheduler die by SIGKILL at random iterations of one run
    (seeded); every failure restarts the cluster from the newest checkpoint, and the run
    ends with the model of uninterrupted single-process training."""
    job = replace(small_job("adam"), iterations=30)
    train = job.read()
    rng = random.Random(14)
    kinds = [f"worker-{rng.randrange(job.workers)}", f"ps-{rng.randrange(2)}", "scheduler"]
    at = sorted(rng.sample(range(5, job.iterations - 3), len(kinds)))
    victims = list(zip(kinds, at, strict=True))
    killer = Killer(tmp_path, victims)
    result = run_mode(job, "herald", 2, train, None, tmp_path, keep_model=True,
                      recovery=Recovery(checkpoint_every=4, max_restarts=len(kinds)))  # fmt: skip
    killer.thread.join(timeout=5)
    assert [k[0] for k in killer.killed] == kinds, (killer.killed, result.restarts)
    assert len(result.restarts) == len(kinds), result.restarts
    for restart, (_, seen, _) in zip(result.restarts, killer.killed, strict=True):
        # Resumed at the batch after the newest checkpoint at or before the kill (one more
        # iteration may commit between the test's look and its kill).
        assert (seen + 1) // 4 * 4 <= restart.resumed_at <= (seen + 2) // 4 * 4, (restart, seen)
        assert restart.seconds_to_resume > 0
    reference = ReferenceTrainer(job)
    reference.train(train)
    assert_matches_reference(result.model, reference, "resumed")


def test_restarts_are_bounded(tmp_path: Path) -> None:
    """With --max-restarts 0 a killed worker still fails the run, with its message."""
    job = replace(small_job("sgd"), iterations=None, epochs=50)
    Killer(tmp_path, [("worker-1", 3)])
    with pytest.raises(ClusterError, match="worker-1"):
        run_mode(job, "herald", 2, job.read(), None, tmp_path,
                 recovery=Recovery(checkpoint_every=2, max_restarts=0))  # fmt: skip


def test_a_resumed_naive_run_is_bitwise_the_uninterrupted_one(tmp_path: Path) -> None:
    """Naive's plans depend on the batches only (sequential partition, every update written
    back), and the shards sum pushes in worker order: a run resumed from a checkpoint after a
    shard's SIGKILL ends with the same bits, in every row and the dense parameters."""
    job = small_job("adagrad")
    train = job.read()
    plain = run_mode(job, "naive", 2, train, None, tmp_path / "plain", keep_model=True)
    (tmp_path / "killed").mkdir()
    killer = Killer(tmp_path / "killed", [("ps-1", 11)])
    resumed = run_mode(job, "naive", 2, train, None, tmp_path / "killed", keep_model=True,
                       recovery=Recovery(checkpoint_every=5, max_restarts=1))  # fmt: skip
    killer.thread.join(timeout=5)
    assert [r.resumed_at for r in resumed.restarts] in ([10], [15]), resumed.restarts
    for name, values in plain.model.items():
        assert np.array_equal(resumed.model[name], values), name


def test_a_batch_norm_model_resumes_with_its_running_statistics(tmp_path: Path) -> None:
    """Batch normalization's running mean and variance live in the dense vector: the
    checkpoint must hold the all-reduced replica's values, so a run whose worker is killed
    and resumed from it ends where uninterrupted single-process training does, the running
    statistics (and dropout, by the sample's global index) included."""
    job = replace(small_job("adam"), workers=2, batch_size_per_worker=64, iterations=12,
                  hidden=(12, 8), batch_norm=True, dropout=0.2, dense_sync="allreduce")  # fmt: skip
    train = job.read()
    killer = Killer(tmp_path, [("worker-1", 6)])
    result = run_mode(job, "herald", 1, train, None, tmp_path, keep_model=True,
                      recovery=Recovery(checkpoint_every=4, max_restarts=1))  # fmt: skip
    killer.thread.join(timeout=5)
    [restart] = result.restarts
    assert restart.process == "worker-1" and restart.resumed_at in (4, 8), result.restarts
    reference = ReferenceTrainer(job)
    reference.train(train)
    model = job.model()
    running = model.running_index
    dense = reference.dense_param.from_rows(reference.dense_rows)
    assert not np.allclose(dense[running], model.init_dense()[running])  # they moved
    assert_matches_reference(result.model, reference, "batch norm resumed", dense_state=False)
