"""``heraldps warmup``: compile every kernel into numba's cache ahead of time."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from launcher.cli.command import Command

PACKAGES = ("heraldps", "ps_server", "scheduler_service", "worker_client", "launcher")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No flags: where the kernels go is numba's cache, set by NUMBA_CACHE_DIR."""


def kernel_folders() -> set[Path]:
    """The cache folders of the compiled functions this process holds: heraldps's kernels
    and the helpers of numba's typed List (``heraldps.jit`` caches both)."""
    from numba.core.registry import CPUDispatcher

    folders = set()
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in PACKAGES or name == "numba.typed.typedlist":
            for value in vars(module).values():
                cache: Any = getattr(value, "_cache", None)
                if isinstance(value, CPUDispatcher) and hasattr(cache, "cache_path"):
                    folders.add(Path(cache.cache_path))
    return folders


def run(args: argparse.Namespace) -> int:
    from heraldps.errors import FailedPrecondition
    from heraldps.jit import CACHE_DIR

    if CACHE_DIR is None:
        raise FailedPrecondition("no writable folder for numba's cache: set NUMBA_CACHE_DIR")
    from launcher.warmup import warm

    started = time.perf_counter()
    before = {p: p.stat().st_mtime_ns for p in Path(CACHE_DIR).rglob("*.nbi")}
    for step in warm():  # each step's line as it ends: a cold warm-up takes a while
        print(f"{step.name}: {step.seconds:.1f} s", file=sys.stderr, flush=True)
    indexes = [p for folder in kernel_folders() for p in folder.glob("*.nbi")]  # one a kernel
    written = [p for p in indexes if before.get(p) != p.stat().st_mtime_ns]
    print(f"heraldps warmup: {len(indexes)} kernels in {CACHE_DIR}, {len(written)} of them "
          f"compiled now ({time.perf_counter() - started:.0f} s)")  # fmt: skip
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
