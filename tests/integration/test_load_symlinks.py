"""Load stays under ``--snapshot-root`` through symlinks inside a snapshot, as Save does
(issue 23, section 3): a shard folder or a file linked out of the root is refused, and
the shard keeps its rows. Real files, real shards."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from heraldps.client import PSClient
from heraldps.errors import PermissionDenied
from heraldps.optim import SGD
from tests.conftest import ClusterFactory

SHARD = "shard-00000-of-00001"


@pytest.fixture
def layout(cluster: ClusterFactory, tmp_path: Path) -> tuple[PSClient, Path, Path]:
    """(a client of a shard confined to ``root`` holding 3 rows, root, an outside snapshot
    of 100 rows saved by an unconfined shard)."""
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside" / "snap"
    _, free = cluster(1)
    free.create_table("emb", 2, SGD(1.0))
    free.push_gradients("emb", np.arange(100), np.ones((100, 2), np.float32), 0)
    free.commit(0)
    assert free.save(str(outside)) == 100
    _, ps = cluster(1, snapshot_root=str(root))
    ps.create_table("emb", 2, SGD(1.0))
    ps.pull("emb", [1, 2, 3])
    assert ps.save("mine") == 3
    return ps, root, outside


def _refused(ps: PSClient, path: str) -> None:
    with pytest.raises(PermissionDenied, match="snapshot root"):
        ps.load(path)
    assert ps.describe_table("emb").rows == 3  # nothing loaded


def test_a_shard_folder_linked_out_of_the_root_is_refused(
    layout: tuple[PSClient, Path, Path],
) -> None:
    ps, root, outside = layout
    (root / "linked").mkdir()
    (root / "linked" / SHARD).symlink_to(outside / SHARD)
    _refused(ps, "linked")


@pytest.mark.parametrize("name", ["meta.json", "emb.values.npy", "emb.keys.npy"])
def test_a_file_linked_out_of_the_root_is_refused(
    layout: tuple[PSClient, Path, Path], name: str
) -> None:
    """The linked file is an exact copy (its checksum matches): only the link is wrong."""
    ps, root, outside = layout
    copy = root / "copy" / SHARD
    shutil.copytree(root / "mine" / SHARD, copy)
    away = outside.parent / name
    (copy / name).rename(away)
    (copy / name).symlink_to(away)
    _refused(ps, "copy")


def test_links_that_stay_inside_the_root_still_load(
    layout: tuple[PSClient, Path, Path],
) -> None:
    ps, root, _ = layout
    (root / "alias").symlink_to(root / "mine")
    assert ps.load("alias") == 3
    (root / "inner").mkdir()
    (root / "inner" / SHARD).symlink_to(root / "mine" / SHARD)
    assert ps.load("inner") == 3
