"""``heraldps local`` ends with every process it started, however it ends.

Real launchers in subprocesses: stopped by SIGTERM, SIGHUP or SIGKILL, or left
waiting by a frozen (SIGSTOPped) worker, shard or scheduler. Afterwards no
process of the run is alive (each one's PID is in ``WORKDIR/MODE/NAME.pid``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from launcher.local import Recovery, run_mode
from tests.e2e.test_local_training import small_job
from tests.reference_model import assert_matches_reference as assert_model
from worker_client.reference import ReferenceTrainer
from worker_client.worker import WorkerConfig, scheduler_options

MODE = "naive"
PROCESSES = ("ps-0", "scheduler", "worker-0", "worker-1")


def alive(pid: int) -> bool:
    """Running, stopped or sleeping; a zombie (dead, not yet reaped by init) is not alive."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def pids(workdir: Path) -> dict[str, int]:
    return {
        name: int((workdir / MODE / f"{name}.pid").read_text())
        for name in PROCESSES
        if (workdir / MODE / f"{name}.pid").exists()
    }


@contextlib.contextmanager
def local_run(workdir: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """A long ``heraldps local`` run (1 shard, 2 workers); whatever is left of it is
    killed at the end, so a failing test leaves no process behind either."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "local", "--modes", MODE, "--workers", "2",
         "--shards", "1", "--epochs", "60", "--workdir", str(workdir), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        for pid in pids(workdir).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def wait_training(workdir: Path, proc: subprocess.Popen[str], iterations: int = 3) -> None:
    """Block until the scheduler has committed ``iterations`` (every process is up)."""
    deadline = time.monotonic() + 120
    port_file = workdir / MODE / "scheduler.port"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        if port_file.exists() and port_file.read_text().split():
            address = f"127.0.0.1:{port_file.read_text().split()[0]}"
            with grpc.insecure_channel(address) as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                with contextlib.suppress(grpc.RpcError):
                    status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=5)
                    if status.committed_iteration + 1 >= iterations:
                        assert set(pids(workdir)) == set(PROCESSES)
                        return
        time.sleep(0.2)
    pytest.fail("the run did not start training in 120 s")


def wait_all_gone(started: dict[str, int], seconds: float) -> float:
    """Seconds until no process of ``started`` is alive; fails after ``seconds``."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if not any(alive(pid) for pid in started.values()):
            return time.monotonic() - began
        time.sleep(0.05)
    left = [name for name, pid in started.items() if alive(pid)]
    pytest.fail(f"still alive {seconds:g} s later: {left}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_every_process(tmp_path: Path, signum: int) -> None:
    with local_run(tmp_path) as proc:
        wait_training(tmp_path, proc)
        started = pids(tmp_path)
        sent = time.monotonic()
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=30)
        print(f"{signal.Signals(signum).name}: launcher and cluster gone in "
              f"{time.monotonic() - sent:.2f} s")  # fmt: skip
        # The launcher stops its processes before it exits: nothing is left at all.
        assert not [n for n, pid in started.items() if alive(pid)]
        assert proc.returncode == 128 + signum, output
        name = signal.Signals(signum).name
        assert f"interrupted; every process was stopped ({name})" in output


def test_sigkill_of_the_launcher_takes_every_process_with_it(tmp_path: Path) -> None:
    with local_run(tmp_path) as proc:
        wait_training(tmp_path, proc)
        started = pids(tmp_path)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        print(f"SIGKILL: cluster gone in {wait_all_gone(started, 5):.2f} s")  # PDEATHSIG


@pytest.mark.parametrize(
    ("frozen", "causes"),
    [
        ("worker-1", ["the scheduler aborted the run: worker 1 has not reported iteration"]),
        # The workers that had not pushed yet wait on the frozen shard (one or both: the
        # message names them), or the commit does.
        (
            "ps-0",
            [
                "the scheduler aborted the run: worker 0 has not reported iteration",
                "the scheduler aborted the run: worker 1 has not reported iteration",
                "the scheduler aborted the run: workers 0, 1 have not reported iteration",
                "the scheduler aborted the run: every worker reported iteration",
            ],
        ),
        ("scheduler", ["the scheduler has not answered for 3 s (--worker-timeout)"]),
    ],
)
def test_a_frozen_process_ends_the_run_naming_the_cause(
    tmp_path: Path, frozen: str, causes: list[str]
) -> None:
    timeout = 3.0
    with local_run(tmp_path, "--worker-timeout", str(timeout)) as proc:
        wait_training(tmp_path, proc)
        started = pids(tmp_path)
        stopped_at = time.monotonic()
        os.kill(started[frozen], signal.SIGSTOP)
        output, _ = proc.communicate(timeout=60)
        took = time.monotonic() - stopped_at
        print(f"{frozen} frozen: the launcher ended {took:.2f} s later:\n{output[-600:]}")
        assert proc.returncode == 1, output
        assert any(cause in output for cause in causes), output
        assert took < timeout + 10, took  # the abort, then the stop (SIGCONT + SIGTERM)
        assert not [n for n, pid in started.items() if alive(pid)]


def test_a_workers_plan_stream_fails_when_the_scheduler_freezes(tmp_path: Path) -> None:
    """Deployed, no launcher watches: the worker's keepalive pings find the frozen
    scheduler, while an idle stream to a live one stays open (the pings are allowed)."""
    port_file = tmp_path / "scheduler.port"
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "launcher", "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--workers", "1", "--cache-rows", "10", "--port-file", str(port_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().split()):
            assert time.monotonic() < deadline and scheduler.poll() is None
            time.sleep(0.1)
        address = f"127.0.0.1:{port_file.read_text().split()[0]}"
        config = WorkerConfig(job="", worker_id=0, scheduler=address, ps=(), timeout_seconds=4)
        with grpc.insecure_channel(address, options=scheduler_options(config)) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=0), timeout=10)
            ended: list[tuple[grpc.StatusCode, float]] = []

            def watch() -> None:
                try:
                    list(stub.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=0)))
                except grpc.RpcError as err:
                    ended.append((err.code(), time.monotonic()))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            # Seven pings to a live scheduler, on a stream that sends nothing: all answered.
            # (With gRPC's default server policy this stream ended after about 5 s with
            # GOAWAY "too_many_pings": heraldps.serving allows them.)
            time.sleep(7)
            assert watcher.is_alive(), ended
            frozen = time.monotonic()
            scheduler.send_signal(signal.SIGSTOP)
            watcher.join(timeout=15)
            assert ended and ended[0][0] == grpc.StatusCode.UNAVAILABLE, ended
            took = ended[0][1] - frozen
            print(f"frozen scheduler: the plan stream failed after {took:.2f} s")
            assert took < 4, took  # a ping interval and a ping timeout: 1 s + 1 s
    finally:
        scheduler.send_signal(signal.SIGKILL)
        scheduler.send_signal(signal.SIGCONT)
        scheduler.wait()


def _freeze_when_committed(workdir: Path, name: str, iteration: int, frozen: list[int]) -> None:
    """SIGSTOP process ``name`` once the scheduler (found through its port file) has
    committed ``iteration``; its PID goes into ``frozen``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, IndexError, grpc.RpcError):
            port = (workdir / "scheduler.port").read_text().split()[0]
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=1)
            if status.committed_iteration >= iteration:
                pid = int((workdir / f"{name}.pid").read_text())
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
                return
        time.sleep(0.02)


def test_a_frozen_worker_with_restarts_resumes_to_the_uninterrupted_model(
    tmp_path: Path,
) -> None:
    """With --max-restarts, the abort after --worker-timeout restarts the cluster from the
    newest checkpoint (the frozen worker is stopped with the rest), and the run ends with
    the model of uninterrupted single-process training."""
    job = replace(small_job("adam"), iterations=20)
    train = job.read()
    frozen: list[int] = []
    freezer = threading.Thread(
        target=_freeze_when_committed, args=(tmp_path, "worker-1", 6, frozen), daemon=True
    )
    freezer.start()
    try:
        result = run_mode(job, "herald", 2, train, None, tmp_path, keep_model=True,
                          recovery=Recovery(checkpoint_every=4, max_restarts=1,
                                            worker_timeout=3))  # fmt: skip
    finally:
        for pid in frozen:  # the launcher stopped it; a failing test must not leave it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert frozen and not alive(frozen[0])
    assert len(result.restarts) == 1, result.restarts
    restart = result.restarts[0]
    # The job all-reduces its dense gradients: the others usually wait inside the iteration
    # for worker 1, and are named with it.
    assert re.search(r"aborted the run: workers? [\d, ]*\b1\b[\d, ]* ha(s|ve) not reported",
                     restart.failure), restart.failure  # fmt: skip
    assert restart.resumed_at in (4, 8), restart  # after the newest checkpoint (iteration 3 or 7)
    reference = ReferenceTrainer(job)
    reference.train(train)
    assert_model(result.model, reference, "resumed after a frozen worker")
