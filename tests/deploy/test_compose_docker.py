"""deploy/ run for real on a Docker engine: the image built from deploy/Dockerfile, the
compose cluster started by deploy/run-job.sh, the model checked against ``heraldps local``.

1. A clean run of deploy/job.json exits 0 and leaves on its shards what ``heraldps local``
   computes for the same job (the same committed iteration, every row, optimizer state and
   version, the dense layers, the logloss on the bundled test set). Meanwhile Prometheus,
   inside the compose network, scrapes every heraldps container by its service name, and
   every query of the Grafana dashboard returns series.
2. A run whose Staged shard is SIGKILLed fails with a non-zero exit (the scheduler aborts it),
   and the same command run again resumes from the newest checkpoint and ends with the same
   model.
3. In both, no container compiles a numba kernel: each loads the ones the image compiled at
   build time (docs/deployment.md#compiled-kernels).

Skipped without a Docker engine (CI runs tools/docker_ready.sh first, so there it fails).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.client import PSClient
from heraldps.job import TrainingJob
from launcher.local import ModeResult, evaluate, read_model, run_mode
from tests.deploy.docker import (
    DEPLOY,
    ComposeProject,
    build_image,
    ci_override,
    engine_or_skip,
    image_kernels,
    project,
)
from tests.deploy.observability import dashboard_expressions, prometheus_api, scrape_targets

# Compose publishes fixed host ports (7001, 7002, 7100, 9090, 3000): these tests run on one
# pytest-xdist process, one after another, with the other tests that bind such ports.
pytestmark = pytest.mark.xdist_group("host-ports")

JOB = DEPLOY / "job.json"
SHARDS = ["127.0.0.1:7001", "127.0.0.1:7002"]  # ps-0 and ps-1 as compose publishes them
PROMETHEUS = "http://127.0.0.1:9090"
RUN_SECONDS = 300


@pytest.fixture(scope="module")
def image() -> None:
    engine_or_skip()
    build_image()


@pytest.fixture(scope="module")
def local_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainingJob, ModeResult, Any]:
    """``heraldps local``'s run of deploy/job.json (run_mode, what it runs per mode), in herald
    mode as the compose scheduler runs it, on the bundled train set; evaluated on its test set.
    Two shards, as compose has (the store kind does not change the model)."""
    job = TrainingJob.load(JOB)
    _, test_path = bundled_data()
    eval_data = job.read(str(test_path))
    workdir = tmp_path_factory.mktemp("local")
    result = run_mode(job, "herald", 2, job.read(), eval_data, workdir, keep_model=True)
    return job, result, eval_data


def committed(ps: PSClient | None) -> tuple[PSClient | None, int | None]:
    """The shards' committed iteration, or None while they are not reachable yet."""
    try:
        ps = ps or PSClient(SHARDS)
        return ps, ps.committed_iteration()
    except Exception:  # not published yet, or starting: ask again
        return ps, None


def run_until(
    compose: ComposeProject,
    at: int,
    action: Callable[[], Any],
    *options: str,
    prepare: Callable[[], Any] = lambda: None,
) -> subprocess.Popen[str]:
    """Start run-job.sh; call ``prepare()`` once the shards answer and ``action()`` once
    iteration ``at`` is committed (an iteration takes well under a second here)."""
    job = compose.run_job(*options)
    deadline = time.monotonic() + RUN_SECONDS
    ps: PSClient | None = None
    prepared = False
    try:
        while job.poll() is None and time.monotonic() < deadline:
            ps, iteration = committed(ps)
            if iteration is not None and not prepared:
                prepare()
                prepared = True
            if iteration is not None and iteration >= at:
                action()
                break
            time.sleep(0.02)
    finally:
        if ps is not None:
            ps.close()
    return job


def finish(compose: ComposeProject, job: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = job.communicate(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
        raise AssertionError(f"run-job.sh did not end:\n{out}\n{compose.logs()}") from None
    return job.returncode, out


def assert_local_model(job: TrainingJob, result: ModeResult, eval_data: Any) -> None:
    """The model on the compose shards equals ``heraldps local``'s."""
    with PSClient(SHARDS) as ps:
        assert ps.committed_iteration() == result.iterations - 1
        model = read_model(job, ps, result.model["keys"], job.model().dense_size)
        _, logloss = evaluate(job, eval_data, ps)
    expected = result.model
    assert np.array_equal(model["versions"], expected["versions"])
    for name in ("values", "state", "dense_values", "dense_state"):
        np.testing.assert_allclose(model[name], expected[name], rtol=1e-5, atol=1e-7, err_msg=name)
    assert logloss == pytest.approx(result.logloss, abs=1e-6)


def prometheus(path: str, **params: str) -> Any:
    return prometheus_api(PROMETHEUS, path, **params)


@pytest.fixture
def clean_run(image: None, tmp_path: Path) -> Iterator[ComposeProject]:
    yield from project(ci_override(tmp_path))


@pytest.fixture
def faulty_run(image: None, tmp_path: Path) -> Iterator[ComposeProject]:
    # Checkpoints every 5 iterations, so the kill lands after one; a dead shard is noticed
    # within --worker-timeout (60 s in the compose file; 15 s here to keep CI short). The
    # recreated containers of the resumed run load their kernels from the image's compiled
    # ones (checked below): with an empty numba cache, compiling them in the first iteration
    # once took longer than 10 s in CI.
    env = {"HERALDPS_CHECKPOINT_EVERY": "5", "HERALDPS_WORKER_TIMEOUT": "15"}
    yield from project(ci_override(tmp_path, {"scheduler": env}))


def assert_nothing_compiled(compose: ComposeProject) -> None:
    """Every heraldps container's numba cache holds the image's compiled kernels and nothing
    else: no role compiled a kernel (a compile adds a file or rewrites an index)."""
    shipped = image_kernels()
    assert any(name.endswith(".nbi") for name in shipped), "the image carries no kernels"
    for service in ("ps-0", "ps-1", "scheduler", "worker-0", "worker-1", "feed"):
        cache = compose.kernel_cache(service)
        compiled = sorted(n for n in cache if cache[n] != shipped.get(n))
        assert not compiled, f"{service} compiled kernels: {compiled}"


def test_compose_job_trains_what_local_trains(
    clean_run: ComposeProject, local_result: tuple[TrainingJob, ModeResult, Any]
) -> None:
    moments: list[float] = []  # when iteration 20 was committed: everything runs then
    job = run_until(clean_run, 20, lambda: moments.append(time.time()))
    code, report = finish(clean_run, job)
    assert code == 0, f"{report}\n{clean_run.logs()}"
    assert "feed exited 0" in report and "worker-1 exited 0" in report, report
    assert "every iteration of /etc/heraldps/job.json committed" in clean_run.logs("feed")
    assert_local_model(*local_result)
    assert_nothing_compiled(clean_run)

    # Prometheus, in the compose network, scraped every heraldps container by service name.
    assert moments, "iteration 20 was never seen committed"
    at = str(moments[0])
    series = prometheus("query", query="up", time=at)["result"]
    up = {r["metric"]["instance"]: r["value"][1] for r in series}
    assert {target: up.get(target) for target in scrape_targets()} == dict.fromkeys(
        scrape_targets(), "1"
    ), up
    empty = [
        e.where for e in dashboard_expressions()
        if not prometheus("query", query=e.promql, time=at)["result"]
    ]  # fmt: skip
    assert not empty, f"dashboard queries with no series during the run: {empty}"


def test_killed_shard_fails_the_run_and_the_rerun_resumes(
    faulty_run: ComposeProject, local_result: tuple[TrainingJob, ModeResult, Any]
) -> None:
    ps0: list[str] = []  # its container, found while the shards start (a kill is then quick)

    def kill_ps0() -> None:
        subprocess.run(["docker", "kill", "-s", "KILL", *ps0], check=True, capture_output=True)

    job = run_until(
        faulty_run, 6, kill_ps0, "--stop", prepare=lambda: ps0.append(faulty_run.container("ps-0"))
    )
    code, report = finish(faulty_run, job)
    assert code != 0, report
    assert "stopping the cluster (volumes kept)" in report, report
    assert faulty_run.state("ps-0")["ExitCode"] == 137
    assert "run aborted" in faulty_run.logs("scheduler")
    assert not faulty_run.state("ps-1")["Running"]  # --stop stopped it, the volume stays:
    kept = faulty_run.volume_files("ps-1-data")
    assert "lmdb/shard-00001-of-00002/data.mdb" in kept, kept
    manifests = [f for f in faulty_run.volume_files("snapshots") if f.endswith("/manifest.json")]
    assert manifests, "no checkpoint on the snapshots volume"

    again = faulty_run.run_job()
    code, report = finish(faulty_run, again)
    assert code == 0, f"{report}\n{faulty_run.logs()}"
    resumed = faulty_run.logs("scheduler")
    assert "resumed from /snapshots/checkpoints/ckpt-" in resumed, resumed
    assert_local_model(*local_result)
    assert_nothing_compiled(faulty_run)  # the recreated containers of the resumed run
