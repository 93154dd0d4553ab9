"""Training checkpoints: where they live, what their manifest says, which one is the latest.

A checkpoint is a PS snapshot (``Save``: one ``shard-*-of-*`` directory per
shard) taken right after the scheduler committed iteration ``t``, plus a
``manifest.json`` written last (to a temporary file, fsynced, renamed): a
checkpoint directory without a manifest is incomplete and never resumed
from. Layout::

    CHECKPOINT_DIR/
      ckpt-000000000019/
        shard-00000-of-00002/ ...   the PS snapshot at iteration 19
        manifest.json               what resuming needs (below)
      ckpt-000000000039/ ...

Shared by the scheduler (writes, resumes) and the launcher (finds the
latest, reports it); no gRPC here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heraldps.errors import FailedPrecondition, InvalidArgument

FORMAT = "heraldps-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_NAME = re.compile(r"ckpt-(\d{12})")


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds and where training goes on from.

    ``iteration``: the last committed iteration in the snapshot; training resumes with
    batch ``next_iteration`` (= iteration + 1), which is also the data position: global
    batch i is a pure function of the job and i, so the feeder starts at batch
    ``next_iteration`` (``samples_seen`` samples in). ``fingerprint``: the job's (data,
    model, optimizer, batch size, mode), checked on resume when the scheduler is given one.
    """

    iteration: int
    num_shards: int
    mode: str
    workers: int
    tables: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    samples_seen: int = 0
    fingerprint: str = ""
    seconds: float = 0.0  # how long the snapshot took
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @property
    def next_iteration(self) -> int:
        return self.iteration + 1

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "next_iteration": self.next_iteration}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        raw.pop("next_iteration", None)
        if raw.get("format") != FORMAT or raw.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"not a {FORMAT} v{FORMAT_VERSION} manifest")
        return cls(**raw)


def fingerprint(*parts: str) -> str:
    """A short digest of what must not change across a resume (job JSON, mode)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def checkpoint_path(root: Path, iteration: int) -> Path:
    return root / f"ckpt-{iteration:012d}"


def complete(root: Path) -> list[tuple[Path, Manifest]]:
    """Every complete checkpoint under ``root`` (a readable manifest), oldest first."""
    found = []
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            if not _NAME.fullmatch(entry.name) or not entry.is_dir():
                continue
            manifest = read_manifest(entry)
            if manifest is not None:
                found.append((entry, manifest))
    return found


def read_manifest(path: Path) -> Manifest | None:
    """The manifest of the checkpoint at ``path``; None when it has none (incomplete)."""
    try:
        return Manifest.from_json((path / MANIFEST).read_text())
    except (OSError, ValueError, TypeError):
        return None


def resolve(path: Path) -> tuple[Path, Manifest] | None:
    """The checkpoint to resume from: ``path`` itself when it is a complete checkpoint,
    else the newest complete one under it; None when there is none (start from 0)."""
    manifest = read_manifest(path)
    if manifest is not None:
        return path, manifest
    if _NAME.fullmatch(path.name) and path.is_dir():
        raise FailedPrecondition(
            f"checkpoint {str(path)!r} is incomplete (no {MANIFEST}: the run died while it was "
            "written); resume from its parent directory to take the newest complete one"
        )
    if path.exists() and not path.is_dir():
        raise InvalidArgument(f"--resume-from {str(path)!r} is not a directory")
    found = complete(path)
    return found[-1] if found else None


def begin(root: Path, iteration: int) -> Path:
    """The directory checkpoint ``iteration`` is saved into, without a manifest (so it
    reads as incomplete until :func:`publish`)."""
    target = checkpoint_path(root, iteration)
    target.mkdir(parents=True, exist_ok=True)
    (target / MANIFEST).unlink(missing_ok=True)
    return target


def publish(target: Path, manifest: Manifest) -> None:
    """Write the manifest atomically (temporary file, fsync, rename, fsync the directory):
    from here on the checkpoint is complete."""
    tmp = target / f".{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(target / MANIFEST)
    for directory in (target, target.parent):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def prune(root: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` complete checkpoints, and incomplete ones older
    than the newest complete one; return what was removed."""
    found = complete(root)
    if not found:
        return []
    newest = found[-1][1].iteration
    kept = {path for path, _ in found[-keep:]} if keep > 0 else {p for p, _ in found}
    removed = []
    for entry in sorted(root.iterdir()):
        match = _NAME.fullmatch(entry.name)
        if not match or entry in kept or not entry.is_dir():
            continue
        if read_manifest(entry) is not None or int(match.group(1)) < newest:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
