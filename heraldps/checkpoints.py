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

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.limits import MAX_ITERATION

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
    ``loss_sum`` and ``loss_samples``: the training loss summed over those samples (the
    scheduler's ``committed_loss_sum``), so a resumed run's per-epoch mean loss is the
    uninterrupted run's.
    """

    iteration: int
    num_shards: int
    mode: str
    workers: int
    tables: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    samples_seen: int = 0
    loss_sum: float = 0.0
    loss_samples: int = 0
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
        """Parse and check a manifest: every field's type and range (:class:`ManifestError`
        naming the field), so that nothing downstream meets a string where a number goes."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ManifestError("not a JSON object")
        if raw.get("format") != FORMAT or raw.get("format_version") != FORMAT_VERSION:
            raise ManifestError(f"not a {FORMAT} v{FORMAT_VERSION} manifest")
        unknown = set(raw) - _FIELDS.keys() - {"next_iteration"}
        if unknown:
            raise ManifestError(f"unknown fields {sorted(unknown)}")
        for name, check in _FIELDS.items():
            if name in raw and not check(raw[name]):
                raise ManifestError(f"{name} is {raw[name]!r}, expected {_EXPECTED[name]}")
        for name in ("iteration", "num_shards", "mode", "workers"):
            if name not in raw:
                raise ManifestError(f"{name} is missing")
        position = raw.pop("next_iteration", raw["iteration"] + 1)
        if position != raw["iteration"] + 1:
            raise ManifestError(
                f"iteration {raw['iteration']} and next_iteration {position!r} (the data "
                "position) disagree",
                reason="disagrees",
            )
        return cls(**raw)


class ManifestError(ValueError):
    """A manifest that cannot be read, has a field of the wrong type or range
    (``reason`` "unreadable"), or whose fields disagree ("disagrees")."""

    def __init__(self, message: str, reason: str = "unreadable") -> None:
        super().__init__(message)
        self.reason = reason


def _is_int(low: int, high: int = MAX_ITERATION) -> Callable[[Any], bool]:
    return lambda v: type(v) is int and low <= v <= high


def _is_table(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and _is_int(1, 1 << 20)(entry.get("dim"))
        and _is_int(0)(entry.get("rows"))
    )


_FIELDS: dict[str, Callable[[Any], bool]] = {
    "iteration": _is_int(0),
    "num_shards": _is_int(1, 1 << 20),
    "mode": lambda v: isinstance(v, str),
    "workers": _is_int(1, 1 << 20),
    "tables": lambda v: isinstance(v, list) and all(_is_table(t) for t in v),
    "rows": _is_int(0),
    "samples_seen": _is_int(0),
    "loss_sum": lambda v: type(v) in (int, float),
    "loss_samples": _is_int(0),
    "fingerprint": lambda v: isinstance(v, str),
    "seconds": lambda v: type(v) in (int, float) and v >= 0,
    "format": lambda v: v == FORMAT,
    "format_version": lambda v: v == FORMAT_VERSION,
}
_EXPECTED = {
    "iteration": "an integer >= 0",
    "num_shards": "an integer >= 1",
    "mode": "a string",
    "workers": "an integer >= 1",
    "tables": "a list of {name, dim, rows}",
    "rows": "an integer >= 0",
    "samples_seen": "an integer >= 0",
    "loss_sum": "a number",
    "loss_samples": "an integer >= 0",
    "fingerprint": "a string",
    "seconds": "a number >= 0",
    "format": repr(FORMAT),
    "format_version": str(FORMAT_VERSION),
}


def fingerprint(*parts: str) -> str:
    """A short digest of what must not change across a resume (job JSON, mode)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def checkpoint_path(root: Path, iteration: int) -> Path:
    return root / f"ckpt-{iteration:012d}"


@dataclass(frozen=True)
class Candidate:
    """A published checkpoint (its folder holds a manifest file): the manifest when it
    reads, else ``problem`` says why not. Such a checkpoint is never silently ignored."""

    path: Path
    manifest: Manifest | None
    problem: str = ""
    reason: str = ""  # the problem's kind: "unreadable" or "disagrees"

    @property
    def iteration(self) -> int:
        """The iteration its folder is named after."""
        match = _NAME.fullmatch(self.path.name)
        return int(match.group(1)) if match else -1


def published(root: Path) -> list[Candidate]:
    """Every checkpoint under ``root`` with a manifest file, readable or not, oldest first."""
    found = []
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            if not _NAME.fullmatch(entry.name) or not entry.is_dir():
                continue
            if not (entry / MANIFEST).exists():
                continue  # incomplete: the run died while it was written
            try:
                found.append(Candidate(entry, _read(entry)))
            except ManifestError as exc:
                found.append(Candidate(entry, None, f"{MANIFEST}: {exc}", exc.reason))
    return found


def complete(root: Path) -> list[tuple[Path, Manifest]]:
    """Every complete checkpoint under ``root`` (a readable manifest), oldest first."""
    return [(c.path, c.manifest) for c in published(root) if c.manifest is not None]


def _read(path: Path) -> Manifest:
    try:
        text = (path / MANIFEST).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(str(exc)) from None
    return Manifest.from_json(text)


def read_manifest(path: Path) -> Manifest | None:
    """The manifest of the checkpoint at ``path``; None when it has none (incomplete) or
    it does not read (:func:`published` says why)."""
    try:
        return _read(path)
    except ManifestError:
        return None


def candidates(path: Path) -> list[Candidate]:
    """What ``--resume-from path`` may resume from, newest first: ``path`` alone when it is
    a checkpoint (named directly: no fallback), else every published one under it."""
    if (path / MANIFEST).exists():
        try:
            return [Candidate(path, _read(path))]
        except ManifestError as exc:
            return [Candidate(path, None, f"{MANIFEST}: {exc}", exc.reason)]
    if _NAME.fullmatch(path.name) and path.is_dir():
        raise FailedPrecondition(
            f"checkpoint {str(path)!r} is incomplete (no {MANIFEST}: the run died while it was "
            "written); resume from its parent directory to take the newest complete one"
        )
    if path.exists() and not path.is_dir():
        raise InvalidArgument(f"--resume-from {str(path)!r} is not a directory")
    return published(path)[::-1]


def resolve(path: Path) -> tuple[Path, Manifest] | None:
    """The newest checkpoint with a readable manifest that ``--resume-from path`` names
    (unchecked against its snapshot: :func:`disagreement`); None when there is none."""
    for candidate in candidates(path):
        if candidate.manifest is not None:
            return candidate.path, candidate.manifest
    return None


SNAPSHOT_FORMAT = "heraldps-snapshot"  # ps_server.snapshot.FORMAT: each shard's meta.json


def disagreement(path: Path, manifest: Manifest) -> str:
    """Why the checkpoint at ``path`` cannot be the state its manifest describes ('' when
    its parts agree): the folder's iteration, the shard count, every shard's committed
    iteration and the tables (names, dims, rows) of the shards' ``meta.json`` files.
    Reads only those small files: the shards check every array and checksum on Load."""
    named = Candidate(path, manifest).iteration
    if named >= 0 and named != manifest.iteration:
        return f"the manifest says iteration {manifest.iteration}, its folder {path.name}"
    metas: dict[str, dict[str, Any]] = {}
    for shard_dir in sorted(path.glob("shard-*-of-*")):
        try:
            meta = json.loads((shard_dir / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            return f"{shard_dir.name}/meta.json is unreadable ({exc})"
        if not isinstance(meta, dict) or meta.get("format") != SNAPSHOT_FORMAT:
            return f"{shard_dir.name}/meta.json is not a {SNAPSHOT_FORMAT} shard"
        metas[shard_dir.name] = meta
    shards = sorted({m.get("num_shards") for m in metas.values()}, key=repr)
    indexes = sorted((m.get("shard_index") for m in metas.values()), key=repr)
    if shards != [manifest.num_shards] or indexes != list(range(manifest.num_shards)):
        return (
            f"the manifest says {manifest.num_shards} shards; the snapshot holds shard "
            f"directories {sorted(metas)}"
        )
    behind = {n: m.get("committed_iteration") for n, m in metas.items()}
    behind = {n: it for n, it in behind.items() if it != manifest.iteration}
    if behind:
        said = ", ".join(f"{n} at {it!r}" for n, it in behind.items())
        return f"the manifest says iteration {manifest.iteration}; the snapshot has {said}"
    return _tables_disagree(metas, manifest)


def _tables_disagree(metas: dict[str, dict[str, Any]], manifest: Manifest) -> str:
    """The manifest's tables (name, dim, rows summed over shards) against the shards'."""
    found: dict[str, list[int]] = {}
    for name, meta in metas.items():
        entries = meta.get("tables")
        if not isinstance(entries, list):
            return f"{name}/meta.json lists no tables"
        for entry in entries:
            try:
                table, dim, rows = entry["spec"]["name"], int(entry["spec"]["dim"]), entry["rows"]
            except (KeyError, TypeError, ValueError):
                return f"{name}/meta.json has a malformed table entry"
            if type(rows) is not int:
                return f"{name}/meta.json: rows of {table!r} is {rows!r}"
            dims_rows = found.setdefault(table, [dim, 0])
            if dims_rows[0] != dim:
                return f"table {table!r} has dim {dim} in {name}, {dims_rows[0]} elsewhere"
            dims_rows[1] += rows
    wanted = {t["name"]: [t["dim"], t["rows"]] for t in manifest.tables}
    if wanted != found:
        return f"the manifest lists tables {_tables(wanted)}; the snapshot holds {_tables(found)}"
    return ""


def _tables(tables: dict[str, list[int]]) -> str:
    return ", ".join(f"{n} (dim {d}, {r} rows)" for n, (d, r) in sorted(tables.items())) or "none"


def size_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a checkpoint's size on disk, near enough)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def remove_partial(root: Path) -> list[Path]:
    """Remove every checkpoint under ``root`` without a manifest file (a run or a save that
    died while it wrote it) and leftover temporary files; return what was removed. Only
    for the one scheduler that writes ``root``, when it is not writing."""
    removed = []
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            if _NAME.fullmatch(entry.name) and entry.is_dir() and not (entry / MANIFEST).exists():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def begin(root: Path, iteration: int) -> Path:
    """The directory checkpoint ``iteration`` is saved into, without a manifest (so it
    reads as incomplete until :func:`publish`)."""
    target = checkpoint_path(root, iteration)
    target.mkdir(parents=True, exist_ok=True)
    (target / MANIFEST).unlink(missing_ok=True)
    return target


def publish(target: Path, manifest: Manifest) -> None:
    """Write the manifest atomically: from here on the checkpoint is complete."""
    write_durably(target / MANIFEST, manifest.to_json(), also_sync=(target.parent,))


def write_durably(path: Path, text: str, also_sync: tuple[Path, ...] = ()) -> None:
    """Replace ``path`` by ``text`` atomically (temporary file, fsync, rename, fsync its
    directory and ``also_sync``): a crash leaves the old file or the new one, whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)
    for directory in (path.parent, *also_sync):
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
    newest = Candidate(found[-1][0], None).iteration
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


def free_bytes(root: Path) -> int:
    """Bytes free to an unprivileged writer on ``root``'s file system (its nearest
    existing folder's)."""
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).free


def make_room(root: Path, needed: int, newest_good: Path | None) -> list[Path]:
    """Remove checkpoints, oldest first, until ``needed`` bytes are free under ``root``;
    never ``newest_good`` (the one a resume would take). Return what was removed."""
    removed: list[Path] = []
    for candidate in published(root):
        if free_bytes(root) >= needed:
            break
        if newest_good is not None and candidate.path == newest_good:
            continue
        if newest_good is not None and candidate.iteration > Candidate(newest_good, None).iteration:
            continue  # newer than the newest good one: not ours to judge here
        shutil.rmtree(candidate.path, ignore_errors=True)
        removed.append(candidate.path)
    return removed
