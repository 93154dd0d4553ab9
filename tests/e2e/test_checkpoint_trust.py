"""Resuming only from a checkpoint whose parts agree, and falling back to an older one.

Real local clusters (``run_mode``: shard, scheduler and worker subprocesses) with
``--max-restarts``: once the run has written checkpoints 4 and 9, the scheduler is frozen
(SIGSTOP: nothing newer is written), the newest checkpoint is damaged or edited, and the
scheduler is killed. The restarted cluster must refuse checkpoint 9, say so in the
scheduler's log, resume from checkpoint 4, and end with the model of uninterrupted
training.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from heraldps import checkpoints
from heraldps.client import PSClient
from heraldps.optim import SGD
from launcher.cluster import ClusterError, ps_process, scheduler_process, start_servers, stop_all
from launcher.local import Recovery, run_mode
from tests.e2e.test_local_training import small_job
from tests.e2e.test_resume import Killer
from tests.integration.test_disk_full import grow, tiny_fs  # noqa: F401  (a fixture)
from tests.reference_model import assert_matches_reference as assert_model
from worker_client.reference import ReferenceTrainer

EVERY = 5
Tamper = Callable[[Path, Path], None]  # (newest checkpoint, the one before it)


def _edit_manifest(path: Path, **fields: object) -> None:
    raw = json.loads((path / checkpoints.MANIFEST).read_text())
    raw.update(fields)
    (path / checkpoints.MANIFEST).write_text(json.dumps(raw))


def _iteration_ahead(new: Path, old: Path) -> None:
    """The issue's case: a manifest claiming 3 more iterations than its snapshots hold."""
    iteration = json.loads((new / checkpoints.MANIFEST).read_text())["iteration"]
    _edit_manifest(new, iteration=iteration + 3)


def _iteration_and_position_ahead(new: Path, old: Path) -> None:
    """The same, with the data position edited to match: only the snapshots disagree."""
    iteration = json.loads((new / checkpoints.MANIFEST).read_text())["iteration"]
    _edit_manifest(new, iteration=iteration + 3, next_iteration=iteration + 4)


def _iteration_as_string(new: Path, old: Path) -> None:
    iteration = json.loads((new / checkpoints.MANIFEST).read_text())["iteration"]
    _edit_manifest(new, iteration=str(iteration))


def _one_shard_swapped(new: Path, old: Path) -> None:
    shutil.rmtree(new / "shard-00001-of-00002")
    shutil.copytree(old / "shard-00001-of-00002", new / "shard-00001-of-00002")


def _every_shard_swapped(new: Path, old: Path) -> None:
    for shard in ("shard-00000-of-00002", "shard-00001-of-00002"):
        shutil.rmtree(new / shard)
        shutil.copytree(old / shard, new / shard)


def _damaged_file(new: Path, old: Path) -> None:
    victim = new / "shard-00000-of-00002" / "emb.values.npy"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))


def _unreadable_manifest(new: Path, old: Path) -> None:
    (new / checkpoints.MANIFEST).write_text("{not json")


class FreezeTamperKill(Killer):
    """Once checkpoint ``2 * EVERY - 1`` is complete: SIGSTOP the scheduler (so no newer
    checkpoint appears), tamper with the newest checkpoint, SIGKILL the scheduler."""

    def __init__(self, workdir: Path, tamper: Tamper) -> None:
        self.tamper = tamper
        self.tampered: tuple[int, int] | None = None  # (newest, the one before) iterations
        super().__init__(workdir, [])

    def _run(self) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self._committed() >= 2 * EVERY:
                pid = int((self.workdir / "scheduler.pid").read_text())
                os.kill(pid, signal.SIGSTOP)
                found = checkpoints.complete(self.workdir / "checkpoints")
                (old, old_manifest), (new, new_manifest) = found[-2], found[-1]
                self.tamper(new, old)
                self.tampered = (new_manifest.iteration, old_manifest.iteration)
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.01)


TAMPERS = {
    "iteration_ahead": _iteration_ahead,
    "iteration_and_position_ahead": _iteration_and_position_ahead,
    "iteration_as_string": _iteration_as_string,
    "one_shard_swapped": _one_shard_swapped,
    "every_shard_swapped": _every_shard_swapped,
    "damaged_file": _damaged_file,
    "unreadable_manifest": _unreadable_manifest,
}


# Under heraldps local (about 17 s each), the cases. The other tampers take the same
# checks: the position edited too runs cheaper in test_a_deployed_scheduler_refuses_..., an
# unreadable manifest in tests/integration/test_scheduler_resume.py, and every shard swapped
# fails the check one shard swapped does (each snapshot's committed iteration).
LOCAL_CASES = ("damaged_file", "iteration_ahead", "iteration_as_string", "one_shard_swapped")


@pytest.mark.parametrize("case", LOCAL_CASES)
def test_a_checkpoint_that_does_not_verify_falls_back_to_an_older_one(
    case: str, tmp_path: Path
) -> None:
    job = replace(small_job("adagrad"), iterations=24)
    train = job.read()
    killer = FreezeTamperKill(tmp_path, TAMPERS[case])
    recovery = Recovery(checkpoint_every=EVERY, keep=4, max_restarts=1)
    result = run_mode(job, "herald", 2, train, None, tmp_path, keep_model=True, recovery=recovery)
    killer.thread.join(timeout=5)
    assert killer.tampered is not None
    newest, previous = killer.tampered
    assert [r.resumed_at for r in result.restarts] == [previous + 1], (killer.tampered, result)
    log = (tmp_path / "scheduler.log").read_text()
    assert f"checkpoint {newest} skipped" in log, log[-3000:]
    assert f"falling back to checkpoint {previous}" in log, log[-3000:]
    assert "Traceback" not in log
    reference = ReferenceTrainer(job)
    reference.train(train)
    assert_model(result.model, reference, f"resumed after {case}")


def test_the_run_fails_only_when_no_checkpoint_verifies(tmp_path: Path) -> None:
    """Every checkpoint damaged: the restart fails, naming each one and why."""
    job = replace(small_job("sgd"), iterations=24)

    def damage_all(new: Path, old: Path) -> None:
        for path in (new, old):
            _damaged_file(path, path)

    killer = FreezeTamperKill(tmp_path, damage_all)
    with pytest.raises(ClusterError) as failed:
        run_mode(job, "herald", 2, job.read(), None, tmp_path,
                 recovery=Recovery(checkpoint_every=EVERY, keep=2, max_restarts=1))  # fmt: skip
    killer.thread.join(timeout=5)
    assert killer.tampered is not None
    log = (tmp_path / "scheduler.log").read_text()
    assert "no checkpoint under" in log and "verifies" in log, log[-3000:]
    assert "sha256" in str(failed.value) or "sha256" in log
    assert "Traceback" not in log


def test_a_dead_scheduler_is_named_with_its_exit_code(tmp_path: Path) -> None:
    """SIGKILL of the scheduler: the failure names the scheduler and its exit code, not the
    feeder's connection error; the restart record says the same."""
    endless = replace(small_job("sgd"), iterations=None, epochs=50)  # the feeder is busy
    (tmp_path / "once").mkdir()
    Killer(tmp_path / "once", [("scheduler", 6)])
    with pytest.raises(ClusterError) as failed:
        run_mode(endless, "herald", 2, endless.read(), None, tmp_path / "once",
                 recovery=Recovery(checkpoint_every=EVERY))  # fmt: skip
    message = str(failed.value)
    assert "scheduler exited with code -9" in message, message
    assert "feeding batches failed" not in message, message

    job = replace(small_job("sgd"), iterations=24)
    (tmp_path / "restarted").mkdir()
    killer = Killer(tmp_path / "restarted", [("scheduler", 6)])
    result = run_mode(job, "herald", 2, job.read(), None, tmp_path / "restarted",
                      recovery=Recovery(checkpoint_every=EVERY, max_restarts=1))  # fmt: skip
    killer.thread.join(timeout=5)
    (restart,) = result.restarts
    assert (restart.process, restart.exit_code) == ("scheduler", -9), restart
    assert "scheduler exited with code -9" in restart.failure, restart


def test_a_full_checkpoint_disk_makes_room_and_leaves_no_partial_checkpoint(
    tiny_fs: Path,  # noqa: F811  (the imported fixture)
    tmp_path: Path,
) -> None:
    """Checkpoints of 0.3 to 1.3 MB with --keep-checkpoints 4 on a 3 MiB disk: older ones
    are removed before a write when the disk is short, so every later checkpoint is still
    written, the newest good one is never removed, and no partial folder stays."""
    job = replace(small_job("adagrad"), iterations=24)
    grow(tiny_fs, "3m")  # room for about three of the run's checkpoints
    root = tiny_fs / "checkpoints"
    recovery = Recovery(checkpoint_every=4, keep=4, checkpoint_dir=root)
    run_mode(job, "herald", 2, job.read(), None, tmp_path / "run", recovery=recovery)
    found = checkpoints.complete(root)
    assert found and found[-1][1].iteration == 23, [m.iteration for _, m in found]
    leftovers = [p.name for p in root.iterdir() if not (p / checkpoints.MANIFEST).exists()]
    assert leftovers == [], leftovers
    log = (tmp_path / "run" / "scheduler.log").read_text()
    assert "before writing the next" in log, log[-3000:]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"iteration": 17}, "iteration 17 and next_iteration 15 (the data position) disagree"),
        ({"iteration": 17, "next_iteration": 18}, "says iteration 17, its folder ckpt-00000000001"),
        ({"iteration": "14"}, "iteration is '14', expected an integer >= 0"),
        ({"num_shards": 3}, "the manifest says 3 shards"),
        ({"tables": [{"name": "emb", "dim": 4, "rows": 7}]}, "the manifest lists tables emb"),
        ({"mode": "naive"}, "it was written in mode naive"),
    ],
)
def test_a_deployed_scheduler_refuses_a_disagreeing_checkpoint_before_loading_anything(
    tmp_path: Path, fields: dict[str, object], said: str
) -> None:
    """``heraldps scheduler --resume-from`` against real shard processes: the only checkpoint
    disagrees with its snapshot or the run, so the scheduler exits 2 with one line saying
    what disagrees (no traceback), and the shards still hold what they held."""
    shards = [ps_process(i, 2, tmp_path) for i in range(2)]
    try:
        start_servers(shards)
        ps = PSClient([s.address for s in shards])
        ps.wait_ready()
        ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
        keys = np.arange(40, dtype=np.int64)
        ps.pull("emb", keys)
        ps.commit(14)
        root = tmp_path / "checkpoints"
        target = checkpoints.begin(root, 14)
        ps.save(str(target))
        tables = [{"name": "emb", "dim": 4, "rows": 40}]
        checkpoints.publish(target, checkpoints.Manifest(14, 2, "herald", 2, tables=tables))
        _edit_manifest(target, **fields)
        ps.push_gradients("emb", keys, np.ones((40, 4), np.float32), iteration=15)
        ps.commit(15)  # the shards moved on: a load would take them back to 14
        scheduler = scheduler_process(2, 100, "herald", ps.addresses, tmp_path,
                                      extra=("--resume-from", str(root)))  # fmt: skip
        with pytest.raises(ClusterError, match="exited during start-up"):
            start_servers([scheduler])
        assert scheduler.proc.wait(timeout=30) == 2
        log = scheduler.log_path.read_text()
        assert said in log and "verifies" in log, log
        assert "Traceback" not in log, log
        assert ps.shard_committed_iterations() == [15, 15]  # nothing was loaded
        values, _ = ps.pull("emb", keys)
        assert np.allclose(values, -0.1)
        ps.close()
    finally:
        stop_all(shards)
