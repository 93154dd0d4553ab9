"""The compose deployment, run for real without Docker: deploy/docker-compose.yml's heraldps
services as subprocesses on 127.0.0.1 (see ``tests/deploy/compose.py``), training
deploy/job.json to the single-process reference model.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from heraldps.client import PSClient
from heraldps.job import TrainingJob
from launcher.local import read_model
from tests.deploy.compose import DEPLOY, ComposeRun, heraldps_services, load_compose
from worker_client.reference import ReferenceTrainer


def test_compose_services_train_the_reference_model(tmp_path: Path) -> None:
    compose = load_compose()
    job = TrainingJob.load(DEPLOY / "job.json")
    run = ComposeRun(compose, tmp_path)
    deadline = time.monotonic() + 120
    try:
        for name in heraldps_services(compose):  # each after its depends_on conditions
            run.start(name, deadline)
        feed = run.services["feed"]
        code = feed.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert code == 0, feed.log()
        assert "every iteration of" in feed.log()
        for w in range(job.workers):
            worker = run.services[f"worker-{w}"]
            assert worker.proc.wait(timeout=30) == 0, worker.log()

        # The same training set and order as every process of the run, model included.
        train = job.read()
        reference = ReferenceTrainer(job)
        reference.train(train)
        addresses = [run.services["ps-0"].address, run.services["ps-1"].address]
        with PSClient(addresses) as ps:
            model = read_model(job, ps, np.unique(train.keys), job.model().dense_size)
            assert ps.committed_iteration() == len(reference.losses) - 1
        values, state, versions = reference.rows_of(model["keys"])
        np.testing.assert_allclose(model["values"], values, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(model["state"], state, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(
            model["dense_values"], reference.dense_rows, rtol=1e-4, atol=1e-6
        )
        np.testing.assert_allclose(
            model["dense_state"], reference.dense_state, rtol=1e-4, atol=1e-6
        )
        assert np.array_equal(model["versions"], versions)

        # ps-1 is the Cached shard: its rows are in LMDB on the named volume.
        volume = Path(run.local(compose["services"]["ps-1"]["environment"]["HERALDPS_DATA_DIR"]))
        (lmdb_file,) = volume.glob("shard-*/data.mdb")
        assert lmdb_file.stat().st_size > 0

        # A restarted feed container finds the run committed and exits 0 at once.
        again = subprocess.run(
            [sys.executable, "-m", "launcher", *compose["services"]["feed"]["command"]],
            env=run.environment(compose["services"]["feed"]),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 0, again.stderr
    finally:
        run.stop()
