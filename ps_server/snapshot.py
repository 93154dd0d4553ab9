"""Snapshot files: the Save/Load format, shared by every kind of store.

A snapshot is a directory; each shard writes its own sub-directory::

    SNAPSHOT/
      shard-00000-of-00002/
        meta.json                 format, shard, committed iteration, table specs
        <table>.keys.npy          int64 [n]
        <table>.values.npy        float32 [n, dim]
        <table>.state.npy         float32 [n, state_width]
        <table>.versions.npy      int64 [n]   (per-row clock)
        <table>.changed.npy       int64 [n]   (iteration of last change, -1 never)
      shard-00001-of-00002/ ...

Plain ``.npy`` files, readable with ``numpy.load`` by any tool. A shard
writes into a temporary directory and renames it into place, so a reader
never sees a half-written shard directory. Load reads every shard directory
and keeps the rows whose key now hashes to the loading shard, so a snapshot
taken on S shards loads onto any number of shards.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
from google.protobuf import json_format

from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.sharding import shard_of
from heraldps.spec import TableSpec
from heraldps.v1 import types_pb2
from ps_server.table import RowBlock

FORMAT = "heraldps-snapshot"
FORMAT_VERSION = 1
_ARRAYS = ("keys", "values", "state", "versions", "changed")
_PUBLISH_LOCK = threading.Lock()


def shard_dir_name(shard_index: int, num_shards: int) -> str:
    return f"shard-{shard_index:05d}-of-{num_shards:05d}"


def write_shard(
    root: Path,
    shard_index: int,
    num_shards: int,
    committed_iteration: int,
    tables: list[tuple[TableSpec, RowBlock]],
) -> Path:
    """Write one shard's tables under ``root``; return the shard directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / shard_dir_name(shard_index, num_shards)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "shard_index": shard_index,
        "num_shards": num_shards,
        "committed_iteration": committed_iteration,
        "tables": [],
    }
    for spec, block in tables:
        for field in _ARRAYS:
            np.save(tmp / f"{spec.name}.{field}.npy", getattr(block, field))
        meta["tables"].append(  # type: ignore[attr-defined]
            {"spec": json_format.MessageToDict(spec.to_proto()), "rows": len(block)}
        )
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    _fsync_dir(tmp)
    with _PUBLISH_LOCK:  # two saves to one path in this process publish one at a time
        old = root / f".{final.name}.old-{os.getpid()}"
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(root)
    return final


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
    root: Path, shard_index: int, num_shards: int
) -> tuple[int, list[tuple[TableSpec, RowBlock]]]:
    """Every row of the snapshot at ``root`` that belongs to ``shard_index`` of ``num_shards``."""
    if not root.is_dir():
        raise InvalidArgument(
            f"snapshot {str(root)!r} is not a directory; pass the path given to Save"
        )
    metas = []
    for shard_dir in sorted(root.glob("shard-*-of-*")):
        try:
            meta = json.loads((shard_dir / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise InvalidArgument(
                f"snapshot shard {str(shard_dir)!r} is unreadable: {exc}"
            ) from None
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise InvalidArgument(
                f"{str(shard_dir)!r} is not a {FORMAT} v{FORMAT_VERSION} directory"
            )
        metas.append((shard_dir, meta))
    if not metas:
        raise InvalidArgument(f"snapshot {str(root)!r} holds no shard-*-of-* directories")
    counts = {m["num_shards"] for _, m in metas}
    iterations = {m["committed_iteration"] for _, m in metas}
    if len(counts) != 1 or len(metas) != next(iter(counts)):
        raise FailedPrecondition(
            f"snapshot {str(root)!r} is incomplete: {len(metas)} shard directories for "
            f"num_shards {sorted(counts)}; save again from every shard"
        )
    if len(iterations) != 1:
        raise FailedPrecondition(
            f"snapshot {str(root)!r} mixes committed iterations {sorted(iterations)}; "
            "save every shard between the same two commits"
        )

    specs: dict[str, TableSpec] = {}
    parts: dict[str, list[RowBlock]] = {}
    for shard_dir, meta in metas:
        for entry in meta["tables"]:
            spec = TableSpec.from_proto(json_format.ParseDict(entry["spec"], types_pb2.TableSpec()))
            if specs.setdefault(spec.name, spec) != spec:
                raise FailedPrecondition(f"snapshot has two different specs for {spec.name!r}")
            arrays = {
                field: np.load(shard_dir / f"{spec.name}.{field}.npy", allow_pickle=False)
                for field in _ARRAYS
            }
            _check_shapes(spec, arrays, shard_dir)
            mine = shard_of(arrays["keys"], num_shards) == shard_index
            parts.setdefault(spec.name, []).append(
                RowBlock(**{field: arrays[field][mine] for field in _ARRAYS})
            )
    tables = []
    for name in sorted(specs):
        blocks = parts[name]
        merged = RowBlock(
            **{field: np.concatenate([getattr(b, field) for b in blocks]) for field in _ARRAYS}
        )
        tables.append((specs[name], merged))
    return next(iter(iterations)), tables


def _check_shapes(spec: TableSpec, arrays: dict[str, np.ndarray], where: Path) -> None:
    n = arrays["keys"].shape[0]
    expected = {
        "keys": ((n,), np.int64),
        "values": ((n, spec.dim), np.float32),
        "state": ((n, spec.state_width), np.float32),
        "versions": ((n,), np.int64),
        "changed": ((n,), np.int64),
    }
    for field, (shape, dtype) in expected.items():
        a = arrays[field]
        if a.shape != shape or a.dtype != dtype:
            raise InvalidArgument(
                f"{where}/{spec.name}.{field}.npy has shape {a.shape} {a.dtype}, "
                f"expected {shape} {np.dtype(dtype)}"
            )
