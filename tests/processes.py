"""``heraldps`` subcommands as real subprocesses for cluster tests: start one with its log
in the test's folder, read the port it bound from its port file."""

from __future__ import annotations

import os
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
