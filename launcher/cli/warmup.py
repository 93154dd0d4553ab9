"""``heraldps warmup``: compile every kernel into numba's cache ahead of time."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from launcher.cli.command import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No flags: where the kernels go is numba's cache, set by NUMBA_CACHE_DIR."""


def run(args: argparse.Namespace) -> int:
    from heraldps.errors import FailedPrecondition
    from heraldps.jit import CACHE_DIR

    if CACHE_DIR is None:
        raise FailedPrecondition("no writable folder for numba's cache: set NUMBA_CACHE_DIR to one")
    from launcher.warmup import warm

    started = time.perf_counter()
    for step in warm():  # each step's line as it ends: a cold warm-up takes a while
        print(f"{step.name}: {step.seconds:.1f} s", file=sys.stderr, flush=True)
    files = sum(1 for _ in Path(CACHE_DIR).rglob("*.nbi"))
    print(f"heraldps warmup: {files} compiled kernels in {CACHE_DIR} "
          f"({time.perf_counter() - started:.0f} s)")  # fmt: skip
    return 0


COMMAND = Command(
    name="warmup",
    help="compile every kernel into numba's cache now, so no process compiles at first use",
    description="Run every role's code once in this process (the data path, every "
    "scheduler mode, a small cluster per mode on 127.0.0.1) so each numba kernel is "
    "compiled for the argument types it gets and stored in numba's cache (NUMBA_CACHE_DIR, "
    "else ~/.cache/heraldps/numba). Later processes load the kernels instead of compiling "
    "them (10-13 s per process kind with a cold cache). The container image runs it at "
    "build time (docs/deployment.md#compiled-kernels).",
    add_arguments=add_arguments,
    run=run,
)
