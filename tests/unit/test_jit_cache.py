"""Numba's compile cache lives outside the installed package (``heraldps/jit.py``).

A cache inside ``site-packages/heraldps/__pycache__`` outlived a reinstall and then
shadowed the package (``cannot import name '__version__' from 'heraldps'``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import heraldps
from heraldps import jit

ROOT = Path(heraldps.__file__).resolve().parent.parent


def test_the_cache_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert jit.cache_dir() == str(tmp_path / "mine")
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jit.cache_dir() == str(tmp_path / "xdg" / "heraldps" / "numba")
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # unusable: the temp dir is next
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    assert jit.cache_dir() == str(tmp_path / "tmp" / f"heraldps-numba-{os.getuid()}")


def test_an_unwritable_numba_cache_dir_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only root file system without a writable /tmp: numba would refuse to compile
    into NUMBA_CACHE_DIR at all, so the next writable folder takes its place."""
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocked / "numba"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jit.cache_dir() == str(tmp_path / "xdg" / "heraldps" / "numba")
    assert f"NUMBA_CACHE_DIR={blocked / 'numba'} is not writable" in caplog.text


def test_compiled_kernels_are_cached_in_the_user_cache_not_in_the_package(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = (
        "import numpy as np\n"
        "from heraldps.sharding import shard_of\n"
        "print(shard_of(np.arange(10, dtype=np.int64), 3).tolist())\n"
    )
    before = set((ROOT / "heraldps" / "__pycache__").glob("*.nb[ic]"))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    assert done.stdout.startswith("[")
    cached = list((tmp_path / "heraldps" / "numba").rglob("*.nbi"))
    assert cached, "no numba index written to $XDG_CACHE_HOME/heraldps/numba"
    assert set((ROOT / "heraldps" / "__pycache__").glob("*.nb[ic]")) <= before
