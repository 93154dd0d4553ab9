"""``heraldps local --link-mbit``: a cluster on the emulated network, and that nothing of
the network outlives a run: not a normal end, not a crashed worker, not SIGTERM, not
a SIGKILL of the launcher itself (its reaper removes it).

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and tbf; skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from launcher.cluster import link_rates
from launcher.local import run_mode
from launcher.netns import ClusterNetwork, running
from launcher.report import ps_agrees
from tests.e2e.test_local_training import small_job
from tests.network import leftovers, require_network
from tests.reference_model import assert_matches_reference
from worker_client.reference import ReferenceTrainer


@pytest.fixture(scope="module", autouse=True)
def network_here() -> None:
    require_network()


def heraldps_local(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", "local", *args]


def test_a_run_on_50_mbit_links_reports_them_and_leaves_nothing(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        heraldps_local("--modes", "herald", "--iterations", "3", "--workers", "2",
                       "--link-mbit", "50", "--ps-link-mbit", "100", "--json", str(report),
                       "--workdir", str(tmp_path / "work")),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "links 50 Mbit/s per process, PS 100 (no latency emulation)" in " ".join(out.split())
    # /metrics of every shard read through the bridge: the shards' counters match.
    assert "PS agrees: the shards' counters equal the workers' counts in every mode" in out
    config = json.loads(report.read_text())["config"]
    assert (config["link_mbit"], config["ps_link_mbit"]) == (50.0, 100.0)
    # Every process served on, and was reached at, its own address on the bridge.
    log = (tmp_path / "work" / "herald" / "scheduler.log").read_text()
    assert "scheduler serving on 10.213." in log and "'ps': ('10.213." in log
    assert not leftovers(proc.pid)


@pytest.mark.parametrize("mode", ["herald", "het"])
def test_modes_on_slow_links_train_the_single_process_model(mode: str, tmp_path: Path) -> None:
    """Slow links change timing, never the model (het: staleness 0)."""
    job = small_job("adagrad")
    train = job.read()
    reference = ReferenceTrainer(job)
    reference.train(train)
    with ClusterNetwork(link_rates(2, job.workers, 20.0, 40.0)) as network:
        result = run_mode(job, mode, 2, train, None, tmp_path, keep_model=True, network=network)
    assert_matches_reference(result.model, reference, mode, dense_state=False)
    assert ps_agrees(result)
    assert not leftovers(os.getpid())


def test_without_the_capabilities_one_line_before_anything_starts(tmp_path: Path) -> None:
    """Root without CAP_SYS_ADMIN (dropped from the bounding set by ``setpriv``, really,
    not simulated): exit 2, one line, no process and no work directory."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) not found")
    done = subprocess.run(
        [setpriv, "--inh-caps=-all", "--bounding-set=-sys_admin",
         *heraldps_local("--link-mbit", "10", "--workdir", str(tmp_path / "work"))],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "heraldps local: --link-mbit creates network namespaces and needs root (CAP_NET_ADMIN "
        "and CAP_SYS_ADMIN): run as root (sudo heraldps local ...), or without --link-mbit "
        "(loopback)"
    ]
    assert not (tmp_path / "work").exists()


LongRun = Callable[[Path], "subprocess.Popen[str]"]


@pytest.fixture
def start_long_run() -> Iterator[LongRun]:
    """Start runs far longer than the test, each returned once every worker started; any
    still running at the end is killed (its reaper then removes the network)."""
    started: list[subprocess.Popen[str]] = []

    def start(workdir: Path) -> subprocess.Popen[str]:
        log = open(workdir.parent / "launcher.log", "w")  # noqa: SIM115 (the child writes it)
        proc = subprocess.Popen(
            heraldps_local("--modes", "naive", "--epochs", "200", "--link-mbit", "50",
                           "--workdir", str(workdir)),
            stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        log.close()
        started.append(proc)
        last_worker = workdir / "naive" / "worker-3.pid"
        deadline = time.monotonic() + 120
        while not last_worker.exists():
            assert proc.poll() is None, (workdir.parent / "launcher.log").read_text()
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        time.sleep(2)
        assert leftovers(proc.pid)  # the network is there while it runs
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            wait_removed(proc.pid, [])


def cluster_pids(workdir: Path) -> list[int]:
    return [int(p.read_text()) for p in (workdir / "naive").glob("*.pid")]


def wait_removed(owner: int, pids: list[int], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while (leftovers(owner) or any(running(p) for p in pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not leftovers(owner)
    assert not [p for p in pids if running(p)]


def test_sigkill_of_the_launcher_leaves_nothing(tmp_path: Path, start_long_run: LongRun) -> None:
    proc = start_long_run(tmp_path / "work")
    pids = cluster_pids(tmp_path / "work")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    wait_removed(proc.pid, pids)  # the reaper's work: no new start needed
    # The reaper says so after the removal is complete: the line may land a moment later.
    log = tmp_path / "launcher.log"
    deadline = time.monotonic() + 10
    while "heraldps reaper: launcher" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "heraldps reaper: launcher" in log.read_text()


def test_sigterm_of_the_launcher_stops_the_cluster_and_removes_the_network(
    tmp_path: Path, start_long_run: LongRun
) -> None:
    proc = start_long_run(tmp_path / "work")
    pids = cluster_pids(tmp_path / "work")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    log = (tmp_path / "launcher.log").read_text()
    assert "interrupted; every process was stopped (SIGTERM)" in log
    assert not leftovers(proc.pid)
    wait_removed(proc.pid, pids, seconds=5)


def test_sigkill_of_a_worker_fails_the_run_and_removes_the_network(
    tmp_path: Path, start_long_run: LongRun
) -> None:
    proc = start_long_run(tmp_path / "work")
    pids = cluster_pids(tmp_path / "work")
    worker = int((tmp_path / "work" / "naive" / "worker-1.pid").read_text())
    os.kill(worker, signal.SIGKILL)
    assert proc.wait(timeout=60) == 1
    out = (tmp_path / "launcher.log").read_text()
    assert "naive: worker-1 exited with code -9; its log" in out
    assert not leftovers(proc.pid)
    wait_removed(proc.pid, pids, seconds=5)
