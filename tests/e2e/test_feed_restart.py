"""The feeder is a process kind too: ``heraldps feed`` killed with SIGKILL mid-run, twice,
and started again, resumes at the scheduler's next batch, and the run ends with the model
single-process training produces (issue #14, section 2).

``heraldps local`` feeds from a thread of the launcher (killing it is killing the launcher,
``test_local_lifecycle.py``); a deployment runs the feed as its own one-shot process, so
this test runs the deployed shape: a shard, the scheduler, two workers and the feed, each a
real ``heraldps`` subprocess.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import numpy as np

from heraldps.client import PSClient
from heraldps.job import TrainingJob
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from launcher.local import read_model
from tests.processes import deployed_cluster, start, stop_all
from tests.reference_model import assert_matches_reference
from worker_client.reference import ReferenceTrainer

ITERATIONS = 24
KILL_AFTER = (4, 12)  # committed iterations at which the running feed is killed
JOB = TrainingJob(
    data="bundled:criteo_head8k", workers=2, batch_size_per_worker=32, iterations=ITERATIONS,
    embedding_dim=4, hidden=(8,), cache_rows=2000, dense_sync="ps",
)  # fmt: skip


def _committed(stub: scheduler_pb2_grpc.SchedulerStub) -> int:
    status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=10)
    return int(status.committed_iteration)


def test_a_killed_feed_restarts_and_the_model_is_exact(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(JOB.to_json())
    procs, ps, scheduler = deployed_cluster(tmp_path, job)
    try:
        feed_args = ["feed", "--job", str(job), "--scheduler", scheduler, "--ps", ps,
                     "--timeout-seconds", "60"]  # fmt: skip
        channel = grpc.insecure_channel(scheduler)
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        killed_at = []
        for n, after in enumerate(KILL_AFTER):
            feed = start(f"feed{n}", feed_args, tmp_path)
            deadline = time.monotonic() + 120
            while _committed(stub) < after:
                assert feed.poll() is None, (tmp_path / f"feed{n}.log").read_text()
                assert time.monotonic() < deadline, "the run made no progress"
                time.sleep(0.02)
            feed.send_signal(signal.SIGKILL)
            feed.wait(timeout=10)
            killed_at.append(_committed(stub))
        last = start("feed-last", feed_args, tmp_path)
        assert last.wait(timeout=180) == 0, (tmp_path / "feed-last.log").read_text()
        channel.close()
        assert all(it < ITERATIONS - 1 for it in killed_at), killed_at  # killed mid-run
        for w in range(2):
            assert procs[2 + w].wait(timeout=60) == 0, (tmp_path / f"worker{w}.log").read_text()

        reference = ReferenceTrainer(JOB)
        train = JOB.read()
        reference.train(train)
        with PSClient([ps]) as client:
            assert client.committed_iteration() == ITERATIONS - 1
            model = read_model(JOB, client, np.unique(train.keys), reference.dense_param.size)
        assert_matches_reference(model, reference, "restarted feed", dense_state=False)
    finally:
        stop_all(procs)
