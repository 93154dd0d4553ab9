"""``heraldps warmup`` compiles every kernel the roles use, and a warmed cache given as
``HERALDPS_KERNEL_SEED`` (read-only, as the container image has it) spares a fresh cache
every compile: ``simulate`` and a ``local`` cluster in the modes with worker steps of their
own then compile nothing (docs/deployment.md#compiled-kernels)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from heraldps import jit


def heraldps(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "launcher", *args], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def kernel_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*.nb[ic]")}


def read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def test_a_seeded_cache_loads_every_kernel_and_compiles_none(tmp_path: Path) -> None:
    seed, cache, run = tmp_path / "seed", tmp_path / "cache", tmp_path / "run"
    base = {k: v for k, v in os.environ.items() if k != jit.SEED_ENV}
    out = heraldps("warmup", env={**base, "NUMBA_CACHE_DIR": str(seed)})
    warmed = kernel_files(seed)
    indexes = len([f for f in warmed if f.endswith(".nbi")])  # one per kernel
    assert f"heraldps warmup: {indexes} kernels in {seed}" in out, out
    assert f"{indexes} of them compiled now" in out, out
    read_only(seed)
    # NUMBA_DEBUG_CACHE: numba prints each kernel it loads from the cache, and each one it
    # saves there after compiling it (each local process into its log).
    env = {**base, "NUMBA_CACHE_DIR": str(cache), jit.SEED_ENV: str(seed), "NUMBA_DEBUG_CACHE": "1"}
    printed = heraldps("simulate", env=env)
    # The pipelined and HET worker steps; the plain one (naive, herald) runs in every
    # container of tests/deploy/test_compose_docker.py, which checks the same there.
    heraldps("local", "--modes", "herald_pipelined,het", "--iterations", "3",
             "--workers", "2", "--workdir", str(run), env=env)  # fmt: skip
    logs = {p.name: p.read_text() for p in run.rglob("*.log")}
    assert {"ps-0.log", "scheduler.log", "worker-1.log"} <= set(logs), sorted(logs)
    for name, text in [("simulate", printed), *logs.items()]:
        assert "data loaded from" in text, name
        assert "saved to" not in text, f"{name} compiled a kernel:\n{text}"
    assert kernel_files(cache) == warmed
    assert kernel_files(seed) == warmed


def test_seeding_copies_only_what_the_cache_lacks(tmp_path: Path) -> None:
    seed, cache = tmp_path / "seed", tmp_path / "cache"
    (seed / "mod_abc").mkdir(parents=True)
    for name in ("f-1.py311.nbi", "f-1.py311.1.nbc", "g-2.py311.nbi", "g-2.py311.1.nbc"):
        (seed / "mod_abc" / name).write_bytes(b"seed " + name.encode())
    (seed / "mod_abc" / "notes.txt").write_text("not a kernel")
    (cache / "mod_abc").mkdir(parents=True)
    (cache / "mod_abc" / "g-2.py311.nbi").write_bytes(b"rewritten after a compile")
    read_only(seed)

    assert jit.seed_cache(cache, seed) == 3
    assert (cache / "mod_abc" / "f-1.py311.nbi").read_bytes() == b"seed f-1.py311.nbi"
    assert (cache / "mod_abc" / "g-2.py311.nbi").read_bytes() == b"rewritten after a compile"
    assert sorted(p.name for p in (cache / "mod_abc").iterdir()) == [
        "f-1.py311.1.nbc", "f-1.py311.nbi", "g-2.py311.1.nbc", "g-2.py311.nbi"
    ]  # fmt: skip
    assert jit.seed_cache(cache, seed) == 0  # a second process finds it done
