"""``heraldps`` subcommands as real subprocesses for cluster tests: start one with its log
in the test's folder, read the port it bound from its port file, stop them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def heraldps(*args: str) -> list[str]:
    """The command line of ``heraldps ARGS`` from this checkout."""
    return [sys.executable, "-m", "launcher", *args]


def start(
    name: str, args: list[str], workdir: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``heraldps ARGS`` with stdout and stderr in ``workdir/NAME.log``."""
    log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(heraldps(*args), stdout=log, stderr=subprocess.STDOUT,
                            env=env if env is not None else dict(os.environ))  # fmt: skip


def port(path: Path, proc: subprocess.Popen[bytes], workdir: Path, name: str) -> int:
    """The port in ``path`` once the process wrote it; its log if it exits or takes 60 s."""
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((workdir / f"{name}.log").read_text())
        time.sleep(0.05)
    return int(path.read_text().split()[0])


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process still running, then wait up to 30 s for each; kill a laggard."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def deployed_cluster(
    workdir: Path, job: Path, workers: int = 2, scheduler_flags: tuple[str, ...] = ()
) -> tuple[list[subprocess.Popen[bytes]], str, str]:
    """A deployment's shape as processes: one shard, the scheduler and ``workers`` workers
    running ``job``; (processes, shard address, scheduler address). The caller feeds it
    and stops the processes (:func:`stop_all`)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        shard = start("ps", ["ps", "--port", "0", "--port-file", str(workdir / "ps.port")],
                      workdir)  # fmt: skip
        procs.append(shard)
        ps = f"127.0.0.1:{port(workdir / 'ps.port', shard, workdir, 'ps')}"
        scheduler_proc = start("scheduler", [
            "scheduler", "--workers", str(workers), "--cache-rows", "2000", "--ps", ps,
            "--port", "0", "--port-file", str(workdir / "scheduler.port"), *scheduler_flags,
        ], workdir)  # fmt: skip
        procs.append(scheduler_proc)
        bound = port(workdir / "scheduler.port", scheduler_proc, workdir, "scheduler")
        scheduler = f"127.0.0.1:{bound}"
        for w in range(workers):
            procs.append(start(f"worker{w}", [
                "worker", "--job", str(job), "--worker-id", str(w), "--scheduler", scheduler,
                "--ps", ps, "--timeout-seconds", "60"], workdir))  # fmt: skip
    except BaseException:
        stop_all(procs)
        raise
    return procs, ps, scheduler
