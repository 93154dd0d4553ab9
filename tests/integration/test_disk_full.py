"""A full disk is RESOURCE_EXHAUSTED with nothing applied (issue #14, section 1), on a real
2 MiB tmpfs: a Cached-PS commit, and a Save that leaves no temporary folder behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps.errors import ResourceExhausted
from heraldps.optim import SGD
from tests.conftest import ClusterFactory


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (needs root to mount); unmounted after the test's servers stopped."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where = tmp_path / "fs"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def grow(fs: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(fs)], check=True)


def test_a_commit_on_a_full_disk_applies_nothing_and_the_next_one_works(
    tiny_fs: Path, cluster: ClusterFactory
) -> None:
    _, ps = cluster(1, store="cached", data_dir=str(tiny_fs / "data"), cache_gb=0.001)
    ps.create_table("emb", dim=16, optimizer=SGD(lr=1.0))
    grads = np.ones((5000, 16), np.float32)
    failed = None
    for t in range(20):
        keys = np.arange(t * 5000, (t + 1) * 5000)
        ps.push_gradients("emb", keys, grads, t)
        try:
            ps.commit(t)
        except ResourceExhausted as err:
            assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "disk" in err.message and "nothing of this request was written" in err.message
            failed = t
            break
    assert failed is not None and failed > 0, "the 2 MiB disk never filled"
    keys = np.arange(failed * 5000, (failed + 1) * 5000)
    assert ps.committed_iteration() == failed - 1
    assert not ps.versions("emb", keys).any()  # not on disk, not in the cache
    assert ps.versions("emb", np.arange(failed * 5000)).tolist() == [1] * (failed * 5000)
    grow(tiny_fs, "16m")  # space again: the buffered gradients commit now
    assert ps.commit(failed) == 5000
    values, versions = ps.pull("emb", keys)
    assert versions.tolist() == [1] * 5000 and np.all(values == -1.0)


def test_a_save_on_a_full_disk_leaves_no_temporary_folder(
    tiny_fs: Path, cluster: ClusterFactory
) -> None:
    _, ps = cluster(1)
    ps.create_table("emb", dim=8, optimizer=SGD())
    ps.pull("emb", np.arange(100_000))  # 3.2 MB of values: more than the disk holds
    target = tiny_fs / "snap"
    with pytest.raises(ResourceExhausted, match="disk full"):
        ps.save(str(target))
    assert sorted(os.listdir(target)) == []  # no .shard-*.tmp-* folder, no partial shard
    grow(tiny_fs, "16m")
    assert ps.save(str(target)) == 100_000
    assert sorted(os.listdir(target)) == ["shard-00000-of-00001"]
