"""Confining Save and Load to the operator's snapshot root (``--snapshot-root``).

Without a root a shard reads and writes any path its user may (a trusted
network only). With one, a path is taken relative to the root (an absolute
path must lie under it), ``..`` and symlinks are resolved first, and anything
that ends outside the root, or is the root itself, is refused with
PERMISSION_DENIED. Load also checks every shard folder and file it reads inside
the snapshot (``within``): a symlink that leads out of the root is refused the
same way, as Save refuses to write through one. The refusal of a path is decided
on the resolved name alone and says the same for a path that exists and one that
does not, so it cannot be used to probe the shard's file system.
"""

from __future__ import annotations

import os
from pathlib import Path

from heraldps.errors import PermissionDenied, shown


def confine(path: str, root: str | None, action: str) -> Path:
    """The path to ``action`` (save, load): ``path`` itself without a root, else
    ``path`` resolved under ``root``; PermissionDenied when it leaves the root."""
    if root is None:
        return Path(path)
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(base / path))  # an absolute ``path`` replaces ``base``
    if target == base or not target.is_relative_to(base):
        raise PermissionDenied(
            f"{action}: {shown(path)} is not under this shard's snapshot root; give a path "
            "relative to the root (the operator's --snapshot-root), e.g. 'run1/iter-100'"
        )
    return target


def within(path: Path, root: str | None, action: str) -> Path:
    """``path`` (a folder or file inside a snapshot) with its links resolved, when that
    stays under ``root`` (None: ``path`` as it is); PermissionDenied when a link leads out."""
    if root is None:
        return path
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(path))
    if not target.is_relative_to(base) or target == base:
        raise PermissionDenied(
            f"{action}: {shown(path.name)} in the snapshot is a link out of this shard's "
            "snapshot root; a snapshot holds no links out of the root (Save never writes "
            "one). Copy the files into the root instead"
        )
    return target
