"""A trained model as a directory of files: what ``heraldps export`` writes and
``heraldps predict`` reads (docs/serving.md).

Layout (format ``heraldps-model``, version 1)::

    MODEL_DIR/
      manifest.json          format, version, source, every file's SHA-256 (below)
      job.json               the training job: columns, transforms, dense statistics,
                             model shape, seed (the data path's key function follows from it)
      dense.npy              float32 [dense_size]: the flat dense vector of the model
      <table>.keys.npy       int64 [n], ascending: every key training touched
      <table>.values.npy     float32 [n, dim]: its row, in the same order

Plain ``.npy`` files: float32 and int64 bit for bit as the shards held them, readable
by ``numpy.load`` (memory-mapped if wanted) with no other library, and the same files a
PS snapshot holds. Reading checks every file against its checksum and every array's
shape and dtype before anything is returned. No model code here: the forward pass is
the worker's (``worker_client.predictor``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf import json_format

from heraldps.checksums import sha256_file
from heraldps.data.keys import feature_key_reference
from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.init import Initializer, initializer_from_proto
from heraldps.v1 import types_pb2

FORMAT = "heraldps-model"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
JOB = "job.json"
# The data path's key function (heraldps/data/keys.py), with one of its test vectors: a
# reader whose keys differ refuses the model instead of scoring every key as unseen.
KEY_FUNCTION = {
    "name": "blake2b-64",
    "formula": "blake2b(f'{column_index}\\x1f{value}', digest_size=8) as little-endian int64",
    "test_vector": {"column_index": 0, "value": "68fd1e64", "key": 4185973209796718312},
}
DENSE = "dense.npy"


class ModelError(InvalidArgument):
    """A model directory that is missing, incomplete, damaged or of another format."""


@dataclass(frozen=True)
class ModelTable:
    """One embedding table of an exported model: its touched rows, sorted by key."""

    name: str
    keys: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    initializer: Initializer  # what a key the export lacks starts from (docs/serving.md)


@dataclass(frozen=True)
class ExportedModel:
    """What a model directory holds."""

    job_json: str
    tables: dict[str, ModelTable]
    dense: npt.NDArray[np.float32]
    source: dict[str, Any]


def touched(
    name: str,
    keys: npt.NDArray[np.int64],
    values: npt.NDArray[np.float32],
    versions: npt.NDArray[np.int64],
    initializer: Initializer,
) -> ModelTable:
    """The rows training updated (version > 0), sorted by key: a row only pulled (an
    evaluation's unseen key, version 0) still holds its initial value and is left out."""
    keep = np.asarray(versions) > 0
    if not keep.all():  # else no copy: a large table is held once, then once sorted
        keys, values = keys[keep], values[keep]
    order = np.argsort(keys, kind="stable")
    return ModelTable(
        name,
        np.ascontiguousarray(keys[order], np.int64),
        np.ascontiguousarray(values[order], np.float32),
        initializer,
    )


def write_model(path: str | Path, model: ExportedModel) -> Path:
    """Write ``model`` to the new directory ``path`` (written aside, then renamed into
    place: a reader never sees half a model). An existing ``path`` is refused."""
    final = Path(path)
    if os.path.lexists(final):
        raise FailedPrecondition(
            f"export: {final} already exists; give a new directory (or remove that one)"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        sums: dict[str, str] = {}
        (tmp / JOB).write_text(model.job_json)
        sums[JOB] = sha256_file(tmp / JOB)
        sums[DENSE] = _save(tmp / DENSE, np.asarray(model.dense, np.float32).reshape(-1))
        tables = []
        for name in sorted(model.tables):
            table = model.tables[name]
            _check_name(name)
            keys_file, values_file = f"{name}.keys.npy", f"{name}.values.npy"
            sums[keys_file] = _save(tmp / keys_file, table.keys)
            sums[values_file] = _save(tmp / values_file, table.values)
            tables.append({
                "name": name,
                "rows": int(table.keys.shape[0]),
                "dim": int(table.values.shape[1]),
                "initializer": json_format.MessageToDict(table.initializer.to_proto()),
            })  # fmt: skip
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "source": model.source,
            "dense_size": int(model.dense.size),
            "key_function": KEY_FUNCTION,
            "tables": tables,
            "sha256": sums,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_model(path: str | Path) -> ExportedModel:
    """The model at ``path``, every file checked against the manifest first
    (:class:`ModelError`, one line naming the file and what to do)."""
    root = Path(path)
    if not root.is_dir():
        raise ModelError(f"model {root}: no such directory; pass a directory heraldps export wrote")
    manifest = _manifest(root)
    _check_key_function(root, manifest.get("key_function"))
    sums = manifest["sha256"]
    for name in sorted(sums):
        _verify(root, name, sums[name])
    dense = _load(root / DENSE, (int(manifest["dense_size"]),), np.float32)
    tables = {}
    for entry in manifest["tables"]:
        try:
            name, rows, dim = str(entry["name"]), int(entry["rows"]), int(entry["dim"])
            proto = json_format.ParseDict(entry["initializer"], types_pb2.Initializer())
        except (KeyError, TypeError, ValueError, json_format.ParseError) as exc:
            raise ModelError(
                f"model {root}: a table entry of {MANIFEST} is malformed ({exc})"
            ) from None
        _check_name(name)
        for field in ("keys", "values"):
            if f"{name}.{field}.npy" not in sums:
                raise ModelError(f"model {root}: {MANIFEST} records no checksum for "
                                 f"{name}.{field}.npy; export the model again")  # fmt: skip
        keys = _load(root / f"{name}.keys.npy", (rows,), np.int64)
        values = _load(root / f"{name}.values.npy", (rows, dim), np.float32)
        if rows > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise ModelError(f"model {root}: {name}.keys.npy is not strictly ascending")
        tables[name] = ModelTable(name, keys, values, initializer_from_proto(proto))
    job_json = (root / JOB).read_text()
    return ExportedModel(job_json, tables, dense, dict(manifest.get("source") or {}))


def _manifest(root: Path) -> dict[str, Any]:
    where = root / MANIFEST
    try:
        manifest = json.loads(where.read_text())
    except FileNotFoundError:
        raise ModelError(
            f"model {root}: no {MANIFEST}; not a model heraldps export wrote"
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"model {root}: {MANIFEST} is unreadable ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelError(f"model {root}: {MANIFEST} is not format {FORMAT!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ModelError(
            f"model {root}: format_version {manifest.get('format_version')!r}; this heraldps "
            f"reads {FORMAT_VERSION}: export it again with this version"
        )
    sums, tables = manifest.get("sha256"), manifest.get("tables")
    if not isinstance(sums, dict) or not isinstance(tables, list) or JOB not in sums \
            or DENSE not in sums or type(manifest.get("dense_size")) is not int:  # fmt: skip
        raise ModelError(f"model {root}: {MANIFEST} lacks sha256, tables or dense_size")
    return manifest


def _check_key_function(root: Path, recorded: Any) -> None:
    """The manifest's key function is the one this data path computes (its test vector)."""
    try:
        vector = recorded["test_vector"]
        same = feature_key_reference(int(vector["column_index"]), str(vector["value"])) == int(
            vector["key"]
        )
    except (KeyError, TypeError, ValueError):
        same = False
    if not same or recorded.get("name") != KEY_FUNCTION["name"]:
        raise ModelError(
            f"model {root}: its key_function is not this heraldps's ({KEY_FUNCTION['name']}); "
            "its keys would not match the data's: export it with this version"
        )


def _check_name(name: str) -> None:
    if not name or "/" in name or name.startswith(".") or name in (JOB, DENSE, MANIFEST):
        raise ModelError(f"table name {name!r} cannot name a file of a model directory")


def _save(path: Path, array: npt.NDArray[Any]) -> str:
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)
    return sha256_file(path)


def _verify(root: Path, name: Any, expected: Any) -> None:
    path = root / str(name)
    if not isinstance(name, str) or "/" in name or not isinstance(expected, str):
        raise ModelError(f"model {root}: {MANIFEST} has a malformed sha256 entry {name!r}")
    if not path.is_file():
        raise ModelError(f"model {root}: {name} is missing; copy the whole directory")
    if sha256_file(path) != expected:
        raise ModelError(
            f"model {root}: {name} differs from the checksum in {MANIFEST} (changed or "
            "damaged after export); export the model again"
        )


def _load(path: Path, shape: tuple[int, ...], dtype: type) -> npt.NDArray[Any]:
    try:
        array: npt.NDArray[Any] = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ModelError(f"{path} is not a readable .npy file ({exc})") from None
    if array.shape != shape or array.dtype != np.dtype(dtype):
        raise ModelError(
            f"{path} holds {array.shape} {array.dtype}, the manifest says {shape} "
            f"{np.dtype(dtype)}; export the model again"
        )
    return array
