"""Snapshot files: the Save/Load format, shared by every kind of store.

A snapshot is a directory; each shard writes its own sub-directory::

    SNAPSHOT/
      shard-00000-of-00002/
        meta.json                 format, shard, committed iteration, table specs,
                                  the SHA-256 of every .npy file (format_version 2)
        <table>.keys.npy          int64 [n]
        <table>.values.npy        float32 [n, dim]
        <table>.state.npy         float32 [n, state_width]
        <table>.versions.npy      int64 [n]   (per-row clock)
        <table>.changed.npy       int64 [n]   (iteration of last change, -1 never)
      shard-00001-of-00002/ ...

Plain ``.npy`` files, readable with ``numpy.load`` by any tool. Load checks
every file against its checksum and every field and row against the rules in
``snapshot_check`` before it returns anything (format_version 1 snapshots,
written before checksums, get every check but the checksums). A shard
writes into a temporary directory and renames it into place, so a reader
never sees a half-written shard directory. Load reads every shard directory
and keeps the rows whose key now hashes to the loading shard, so a snapshot
taken on S shards loads onto any number of shards.

A save replaces an existing shard directory only when it is a snapshot shard
directory (``meta.json`` of this format, nothing but snapshot files), and
never writes into a directory the caller names as kept out (a Cached-PS
shard's ``--data-dir``): a Cached-PS keeps its LMDB folders under the same
``shard-<i>-of-<S>`` names, and replacing one would delete the durable store.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format

from heraldps.errors import FailedPrecondition, HeraldError, InvalidArgument, shown
from heraldps.sharding import shard_of
from heraldps.spec import TableSpec
from heraldps.v1 import types_pb2
from ps_server import paths
from ps_server import snapshot_check as check
from ps_server.table import RowBlock

FORMAT = "heraldps-snapshot"
FORMAT_VERSION = 2  # 2: meta.json holds each file's sha256
READABLE_VERSIONS = (1, 2)
_ARRAYS = ("keys", "values", "state", "versions", "changed")
_PUBLISH_LOCK = threading.Lock()


def shard_dir_name(shard_index: int, num_shards: int) -> str:
    return f"shard-{shard_index:05d}-of-{num_shards:05d}"


def check_target(
    root: Path, shard_index: int, num_shards: int, keep_out: Sequence[Path] = ()
) -> Path:
    """The shard directory a save to ``root`` would (re)place; refuse one it must not touch.

    Raises FailedPrecondition, not InvalidArgument: the same path is a fine
    argument on another shard or once the folder is gone; what forbids it is
    the state of this server (its data directory) and of the file system.
    """
    final = root / shard_dir_name(shard_index, num_shards)
    _refuse_kept_out(root, final, keep_out)
    _refuse_foreign(final)
    _refuse_stores(root)
    return final


_LMDB_MARKERS = ("data.mdb", "heraldps.lock")


def _refuse_stores(root: Path) -> None:
    """Refuse a save into any shard's data: a directory holding a Cached-PS LMDB folder
    (any shard's, running or stopped, whatever its shard count), one inside such a folder,
    or one inside a snapshot's shard directory."""
    where = root.resolve()
    for folder in (where, *where.parents):
        if any((folder / marker).exists() for marker in _LMDB_MARKERS):
            _refuse(root, f"{shown(str(folder))} is a Cached-PS data folder")
        if (folder / "meta.json").is_file() and not _not_a_snapshot_shard(folder):
            _refuse(root, f"{shown(str(folder))} is a shard directory of a snapshot")
    if where.is_dir():
        for entry in sorted(where.glob("shard-*-of-*")):
            if entry.is_dir() and any((entry / m).exists() for m in _LMDB_MARKERS):
                _refuse(root, f"it holds {entry.name!r}, a Cached-PS data folder")


def _refuse(root: Path, why: str) -> None:
    raise FailedPrecondition(
        f"save to {shown(str(root))}: {why}, and a snapshot written there would mix with (or "
        "replace) another store's files; nothing was written. Save to an empty directory "
        "or to a previous heraldps snapshot"
    )


def _refuse_kept_out(root: Path, final: Path, keep_out: Sequence[Path]) -> None:
    """Refuse a save into, below, or over a kept-out directory (symlinks and '..' resolved)."""
    where, target = root.resolve(), final.resolve()
    for kept in (Path(k).resolve() for k in keep_out):
        if where == kept or kept in where.parents or _overlap(target, kept):
            raise FailedPrecondition(
                f"save to {shown(str(root))}: {shown(str(kept))} is this shard's --data-dir, and a "
                "snapshot written in it or over it would replace the LMDB files; nothing was "
                "written. Save to a directory outside it: an empty one or a previous heraldps "
                "snapshot"
            )


def _overlap(a: Path, b: Path) -> bool:
    """``a`` and ``b`` are the same directory, or one holds the other."""
    return a == b or a in b.parents or b in a.parents


def _refuse_foreign(final: Path) -> None:
    """Refuse to replace anything at ``final`` that is not a snapshot shard directory."""
    if not os.path.lexists(final):
        return
    why = _not_a_snapshot_shard(final)
    if why:
        raise FailedPrecondition(
            f"save: {shown(str(final))} exists and is not a {FORMAT} shard directory ({why}); "
            "nothing was written. Save to an empty directory or to a previous heraldps snapshot"
        )


def _not_a_snapshot_shard(path: Path) -> str:
    """Why ``path`` is not a directory a save wrote ('' when it is one)."""
    if path.is_symlink():
        return "a symbolic link"
    if not path.is_dir():
        return "not a directory"
    try:
        meta = json.loads((path / "meta.json").read_text())
        entries = list(path.iterdir())
    except (OSError, ValueError):
        return "no readable meta.json"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return f"its meta.json is not format {FORMAT!r}"
    for entry in entries:
        snapshot_file = entry.name == "meta.json" or entry.name.endswith(".npy")
        if entry.is_symlink() or not entry.is_file() or not snapshot_file:
            return f"it also holds {entry.name!r}, which a snapshot never writes"
    return ""


def write_shard(
    root: Path,
    shard_index: int,
    num_shards: int,
    committed_iteration: int,
    tables: list[tuple[TableSpec, RowBlock]],
    keep_out: Sequence[Path] = (),
) -> Path:
    """Write one shard's tables under ``root``; return the shard directory.

    ``keep_out``: directories the snapshot must stay out of (see ``check_target``).
    """
    final = check_target(root, shard_index, num_shards, keep_out)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        _write_files(tmp, shard_index, num_shards, committed_iteration, tables)
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_files(
    tmp: Path,
    shard_index: int,
    num_shards: int,
    committed_iteration: int,
    tables: list[tuple[TableSpec, RowBlock]],
) -> None:
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "shard_index": shard_index,
        "num_shards": num_shards,
        "committed_iteration": committed_iteration,
        "tables": [],
    }
    for spec, block in tables:
        sums = {}
        for field in _ARRAYS:
            name = f"{spec.name}.{field}.npy"
            sums[name] = check.save_npy(tmp / name, getattr(block, field))
        meta["tables"].append(  # type: ignore[attr-defined]
            {"spec": json_format.MessageToDict(spec.to_proto()), "rows": len(block),
             "sha256": sums}
        )  # fmt: skip
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    _fsync_dir(tmp)


def _publish(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``, replacing an older snapshot shard directory there."""
    root = final.parent
    with _PUBLISH_LOCK:  # two saves to one path in this process publish one at a time
        _refuse_foreign(final)  # again: something may have appeared while the files were written
        old = root / f".{final.name}.old-{os.getpid()}"
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    for child in path.iterdir():
        if child.is_file():
            with open(child, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_for_shard(
    root: Path, shard_index: int, num_shards: int, confine: str | None = None
) -> tuple[int, list[tuple[TableSpec, RowBlock]]]:
    """Every row of the snapshot at ``root`` that belongs to ``shard_index`` of ``num_shards``.

    ``confine``: the snapshot root every folder and file read must resolve under
    (``paths.within``; PermissionDenied for a link out of it); None: anywhere.

    Everything is checked first (``snapshot_check``); a damaged snapshot raises
    InvalidArgument (FailedPrecondition when it is incomplete or mixed) and
    nothing is returned.
    """
    if not root.is_dir():
        raise InvalidArgument(
            f"snapshot {shown(str(root))} is not a directory; pass the path given to Save"
        )
    metas = [(d, _read_meta(d, confine)) for d in sorted(root.glob("shard-*-of-*"))]
    if not metas:
        raise InvalidArgument(f"snapshot {shown(str(root))} holds no shard-*-of-* directories")
    counts = {m["num_shards"] for _, m in metas}
    iterations = {m["committed_iteration"] for _, m in metas}
    indexes = sorted(m["shard_index"] for _, m in metas)
    if len(counts) != 1 or indexes != list(range(next(iter(counts)))):
        raise FailedPrecondition(
            f"snapshot {shown(str(root))} is incomplete: shard directories {indexes} for "
            f"num_shards {sorted(counts)}; save again from every shard"
        )
    if len(iterations) != 1:
        raise FailedPrecondition(
            f"snapshot {shown(str(root))} mixes committed iterations {sorted(iterations)}; "
            "save every shard between the same two commits"
        )
    committed = next(iter(iterations))

    specs: dict[str, TableSpec] = {}
    parts: dict[str, list[RowBlock]] = {}
    all_keys: dict[str, list[np.ndarray]] = {}
    for shard_dir, meta in metas:
        names: set[str] = set()
        for entry in meta["tables"]:
            spec = _spec_of(entry, shard_dir)
            if spec.name in names:
                raise InvalidArgument(f"{shard_dir}/meta.json lists table {spec.name!r} twice")
            names.add(spec.name)
            if specs.setdefault(spec.name, spec) != spec:
                raise FailedPrecondition(f"snapshot has two different specs for {spec.name!r}")
            arrays = _read_arrays(shard_dir, spec, entry, meta["format_version"], confine)
            check.check_arrays(spec, arrays, entry.get("rows"), committed, shard_dir)
            all_keys.setdefault(spec.name, []).append(arrays["keys"])
            mine = shard_of(arrays["keys"], num_shards) == shard_index
            parts.setdefault(spec.name, []).append(
                RowBlock(**{field: arrays[field][mine] for field in _ARRAYS})
            )
    for name, keys in all_keys.items():
        check.check_distinct_across(name, keys, root)
    tables = []
    for name in sorted(specs):
        blocks = parts[name]
        merged = RowBlock(
            **{field: np.concatenate([getattr(b, field) for b in blocks]) for field in _ARRAYS}
        )
        tables.append((specs[name], merged))
    return committed, tables


def _read_meta(shard_dir: Path, confine: str | None) -> dict[str, Any]:
    """A shard directory's meta.json, checked, and its name matching what it says."""
    paths.within(shard_dir, confine, "load")
    try:
        meta = json.loads(paths.within(shard_dir / "meta.json", confine, "load").read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"snapshot shard {str(shard_dir)!r} is unreadable: {exc}") from None
    check.check_meta(meta, shard_dir, READABLE_VERSIONS, FORMAT)
    named = shard_dir_name(meta["shard_index"], meta["num_shards"])
    if shard_dir.name != named:
        raise InvalidArgument(f"{shard_dir}/meta.json describes {named}; the folder was renamed")
    return dict(meta)


def _spec_of(entry: Any, shard_dir: Path) -> TableSpec:
    """A table entry's spec, validated like a CreateTable request."""
    try:
        proto = json_format.ParseDict(entry["spec"], types_pb2.TableSpec())
        return TableSpec.from_proto(proto)
    except HeraldError as exc:
        raise InvalidArgument(f"{shard_dir}/meta.json: {exc.message}") from None
    except (KeyError, TypeError, json_format.ParseError) as exc:
        raise InvalidArgument(
            f"{shard_dir}/meta.json: a table entry is malformed ({exc})"
        ) from None


def _read_arrays(
    shard_dir: Path, spec: TableSpec, entry: dict[str, Any], version: int, confine: str | None
) -> dict[str, np.ndarray]:
    """A table's five arrays, each checked against its recorded checksum first (v2)."""
    sums = entry.get("sha256", {}) if version >= 2 else None
    if sums is not None and not isinstance(sums, dict):
        raise InvalidArgument(f"{shard_dir}/meta.json: sha256 of {spec.name!r} is not a mapping")
    arrays = {}
    for field in _ARRAYS:
        named = shard_dir / f"{spec.name}.{field}.npy"
        path = paths.within(named, confine, "load")  # the resolved file, read twice below
        if sums is not None:
            check.check_checksum(path, sums.get(named.name))
        arrays[field] = check.load_array(path)
    return arrays
