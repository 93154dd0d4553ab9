"""Processes of a local cluster: PS shards, the scheduler, workers.

Each is a real ``heraldps`` CLI subprocess with its own log file; servers
pick free ports and announce them through a port file, so any number of
clusters can run side by side. ``stop`` sends SIGTERM (the services drain
and exit 0) and kills what does not exit in time. A process runs on
127.0.0.1, or with ``namespace`` inside that network namespace
(``ip netns exec``, which execs, so the PID is still the process's own) at
``host``, its address on the emulated network (:mod:`launcher.netns`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TypedDict

from heraldps.cores import CORES
from heraldps.errors import HeraldError
from heraldps.modes import DEFAULT_MAX_BACKLOG, EARLY_WRITE_BACK_ALL
from launcher.lifeline import child_environment

START_TIMEOUT_SECONDS = 120.0
# Seconds a worker may stay silent (the scheduler's --worker-timeout), and the
# scheduler may leave the launcher unanswered, before the run is given up.
DEFAULT_WORKER_TIMEOUT = 60.0
LOOPBACK = "127.0.0.1"
# /metrics of our own processes, never through an HTTP proxy of the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ClusterError(HeraldError):
    """A process of the local cluster failed or did not start."""


class ProcessDied(ClusterError):
    """A process of the local cluster exited: which one (``process``) and its exit code
    (negative: the signal that killed it)."""

    def __init__(self, message: str, process: str, exit_code: int) -> None:
        super().__init__(message)
        self.process, self.exit_code = process, exit_code


class Placement(TypedDict, total=False):
    """Where a process runs, as keyword arguments of the ``*_process`` functions: its
    address and network namespace on an emulated network (both absent: 127.0.0.1)."""

    host: str
    namespace: str


class ManagedProcess:
    """One ``heraldps ...`` subprocess (``python -m launcher``), logging to ``workdir/name.log``."""

    def __init__(
        self,
        name: str,
        args: list[str],
        workdir: Path,
        port_file: bool,
        host: str = LOOPBACK,
        namespace: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.host = host  # where the launcher and the other processes reach it
        self.log_path = workdir / f"{name}.log"
        self.port_file = workdir / f"{name}.port" if port_file else None
        command = [sys.executable, "-m", "launcher", *args]
        if namespace is not None:
            command = ["ip", "netns", "exec", namespace, *command]
        if self.port_file is not None:
            self.port_file.unlink(missing_ok=True)  # an earlier run's: its ports are gone
            command += ["--port-file", str(self.port_file)]
        with open(self.log_path, "w") as log:
            # Own session: a signal to the launcher's group is the launcher's to pass on.
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**child_environment(), **(env or {})},
            )  # fmt: skip
        (workdir / f"{name}.pid").write_text(f"{self.proc.pid}\n")  # for operators and tests
        self.port = 0
        self.metrics_port = 0

    def wait_ready(self, deadline: float) -> None:
        """Block until the port file names the ports (servers only)."""
        assert self.port_file is not None
        while not self.port_file.exists() or len(self.port_file.read_text().split()) < 1:
            if self.proc.poll() is not None:
                raise ClusterError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name} did not start in time:\n{self.log_tail()}")
            time.sleep(0.05)
        ports = self.port_file.read_text().split()
        self.port = int(ports[0])
        self.metrics_port = int(ports[1]) if len(ports) > 1 else 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def metrics(self) -> str:
        """The process's Prometheus exposition text."""
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        with _NO_PROXY.open(url, timeout=10) as reply:
            text: str = reply.read().decode()
            return text

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal_stop(self) -> None:
        """SIGTERM, and SIGCONT so that a frozen (SIGSTOPped) process handles it too."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGCONT)

    def resume(self) -> None:
        """SIGCONT: a frozen process runs (and answers) again, without being asked to stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code (None if it had to be killed)."""
        self.signal_stop()
        return self.wait_stopped(time.monotonic() + timeout)

    def wait_stopped(self, deadline: float) -> int | None:
        """Wait for the exit until ``deadline``, then SIGKILL its group; the exit code
        (None if it had to be killed)."""
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None
        return self.proc.returncode


def stop_all(processes: list[ManagedProcess], timeout: float = 15.0) -> None:
    """Stop ``processes`` at once: SIGTERM to all, then SIGKILL to what still runs after
    ``timeout`` (one grace period for all, not one each)."""
    for process in processes:
        process.signal_stop()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.wait_stopped(deadline)


def stop_cluster(processes: list[ManagedProcess], timeout: float = 15.0) -> None:
    """Stop a cluster: the shards' clients first (workers, then the scheduler), then the
    shards, all within one ``timeout``. The scheduler's last call gives its claim on the
    shards back (``scheduler_service/claim.py``); stopped with the shards, it found them
    gone and waited out its 2 s release timeout on every run's exit. A frozen (SIGSTOPped)
    shard is woken first, so the clients' last calls do not wait on it either."""
    shards = [p for p in processes if p.name.startswith("ps-")]
    clients = [p for p in processes[::-1] if p not in shards]
    for shard in shards:
        shard.resume()
    deadline = time.monotonic() + timeout
    for group in (clients, shards):
        for process in group:
            process.signal_stop()
        for process in group:
            process.wait_stopped(deadline)


def start_servers(processes: list[ManagedProcess]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    for process in processes:
        process.wait_ready(deadline)


def ps_process(
    index: int,
    shards: int,
    workdir: Path,
    store_args: tuple[str, ...] = (),
    host: str = LOOPBACK,
    namespace: str | None = None,
) -> ManagedProcess:
    """A shard; ``store_args`` are extra ``heraldps ps`` flags (e.g. the cached store's)."""
    args = ["ps", "--host", host, "--port", "0", "--metrics-port", "0",
            "--shard-index", str(index), "--num-shards", str(shards),
            "--grace-seconds", "5", *store_args]  # fmt: skip
    return ManagedProcess(f"ps-{index}", args, workdir, port_file=True, host=host,
                          namespace=namespace)  # fmt: skip


def scheduler_process(
    workers: int,
    cache_rows: int,
    mode: str,
    ps: list[str],
    workdir: Path,
    host: str = LOOPBACK,
    namespace: str | None = None,
    compress_plans: bool = False,
    extra: tuple[str, ...] = (),
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT,
    expected_keys: int = 0,
    early_write_back: int = EARLY_WRITE_BACK_ALL,
    look_ahead: int = 1,
    prefetch_plans: int = 1,
) -> ManagedProcess:
    """The scheduler; ``compress_plans`` gzips its plan streams (on slow emulated links);
    ``extra``: more ``heraldps scheduler`` flags (checkpoints, resume); ``worker_timeout``:
    its ``--worker-timeout``; ``prefetch_plans`` also raises ``--max-backlog`` to what
    it needs."""
    args = ["scheduler", "--host", host, "--port", "0", "--metrics-port", "0",
            "--workers", str(workers), "--cache-rows", str(cache_rows), "--mode", mode,
            "--ps", ",".join(ps), "--grace-seconds", "5",
            "--threads", str(2 * workers + 8), "--worker-timeout", str(worker_timeout),
            "--expected-keys", str(expected_keys),
            "--early-write-back", str(early_write_back),
            "--look-ahead", str(look_ahead), "--prefetch-plans", str(prefetch_plans),
            "--max-backlog", str(max(DEFAULT_MAX_BACKLOG, prefetch_plans + 1))]  # fmt: skip
    if compress_plans:
        args.append("--compress-plans")
    args += extra
    return ManagedProcess("scheduler", args, workdir, port_file=True, host=host,
                          namespace=namespace)  # fmt: skip


def worker_process(
    worker: int,
    job: Path,
    scheduler: str,
    ps: list[str],
    workdir: Path,
    metrics_port: int | None = None,
    host: str | None = None,
    namespace: str | None = None,
    workers_here: int = 1,
) -> ManagedProcess:
    """A worker; with ``metrics_port`` it serves its Prometheus /metrics there. ``host``:
    the address other workers reach it at (``--advertise-host``; default 127.0.0.1).
    ``workers_here``: the workers this machine runs, which share its cores (see
    :func:`blas_threads`)."""
    args = ["worker", "--job", str(job), "--worker-id", str(worker), "--scheduler", scheduler,
            "--ps", ",".join(ps), "--report", str(workdir / f"worker-{worker}.json")]  # fmt: skip
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port)]
    if host is not None:
        args += ["--advertise-host", host]
    process = ManagedProcess(f"worker-{worker}", args, workdir, port_file=False,
                             host=host or LOOPBACK, namespace=namespace,
                             env=blas_threads(workers_here))  # fmt: skip
    process.metrics_port = metrics_port or 0
    return process


def blas_threads(workers_here: int) -> dict[str, str]:
    """``OPENBLAS_NUM_THREADS`` for a worker: this machine's cores over the workers it runs.

    Each worker's matrix products would otherwise start one BLAS thread per core, so N
    workers on C cores run N x C threads that preempt each other between the batch-norm
    and all-reduce barriers: 4 workers on our 2 cores trained Frappe at about half the
    samples/s. Our sgemm shapes give the same bits on 1, 2 or 4 threads (OpenBLAS splits
    rows and columns, never the summed dimension), so the model does not change. A value
    the user set is kept."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return {}
    return {"OPENBLAS_NUM_THREADS": str(max(1, CORES // max(1, workers_here)))}


def link_rates(
    shards: int, workers: int, mbit: float, ps_mbit: float | None = None
) -> dict[str, float]:
    """Each process's link rate in Mbit/s, by process name: PS shards at ``ps_mbit``
    (default ``mbit``), the scheduler and the workers at ``mbit``."""
    rates = {f"ps-{i}": ps_mbit or mbit for i in range(shards)}
    rates["scheduler"] = mbit
    rates.update({f"worker-{w}": mbit for w in range(workers)})
    return rates
