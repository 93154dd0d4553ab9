"""Everything Load checks in a snapshot before any store sees it.

A snapshot is files on a disk that anyone may have copied, truncated, edited or
mixed with another snapshot. ``read_for_shard`` (``snapshot.py``) runs these
checks on every shard directory and every table, and only a snapshot that
passes them all reaches ``replace_all``: a failed Load changes nothing.
Each failure is ``InvalidArgument`` naming the file and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import io
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.checksums import sha256_file
from heraldps.errors import InvalidArgument
from heraldps.keyindex import distinct
from heraldps.limits import MAX_ITERATION
from heraldps.spec import TableSpec

_NPY_LOCK = threading.Lock()


def save_npy(path: Path, array: npt.NDArray[Any]) -> str:
    """``numpy.save`` of ``array`` to ``path`` (a plain .npy file); return its hex SHA-256.

    The header and the data go out in two writes and are hashed as they go, so Save
    never reads a file back; a full disk raises OSError (ENOSPC) from the write.
    """
    data = np.ascontiguousarray(array)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(data))
    digest = hashlib.sha256(header.getvalue())
    body = data.reshape(-1).data.cast("B") if data.size else memoryview(b"")
    digest.update(body)
    with open(path, "wb") as f:
        f.write(header.getvalue())
        f.write(body)
    return digest.hexdigest()


def integer(meta: dict[str, Any], field: str, low: int, high: int, where: Path) -> int:
    """``meta[field]`` as an int in ``low..high`` (a bool, float or string is refused)."""
    value = meta.get(field)
    if type(value) is not int or not low <= value <= high:
        raise InvalidArgument(
            f"{where}/meta.json: {field} is {value!r}, expected an integer in {low}..{high}; "
            "the snapshot was edited or damaged, load another one"
        )
    return value


def check_meta(meta: Any, where: Path, versions: tuple[int, ...], fmt: str) -> None:
    """The shape of a shard directory's ``meta.json``: types and ranges of every field."""
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise InvalidArgument(f"{where} is not a {fmt} shard directory (meta.json format)")
    if meta.get("format_version") not in versions:
        raise InvalidArgument(
            f"{where}/meta.json: format_version {meta.get('format_version')!r}, this server "
            f"reads {', '.join(map(str, versions))}"
        )
    shards = integer(meta, "num_shards", 1, 1 << 20, where)
    integer(meta, "shard_index", 0, shards - 1, where)
    integer(meta, "committed_iteration", -1, MAX_ITERATION, where)
    if not isinstance(meta.get("tables"), list):
        raise InvalidArgument(f"{where}/meta.json: tables is not a list")


def check_checksum(path: Path, expected: Any) -> None:
    """The file's SHA-256 equals the one Save recorded in meta.json."""
    if not isinstance(expected, str):
        raise InvalidArgument(
            f"{path}: meta.json records no sha256 for it; the snapshot is damaged"
        )
    if not path.is_file():
        raise InvalidArgument(f"{path} is missing; the snapshot is incomplete")
    actual = sha256_file(path)
    if actual != expected:
        raise InvalidArgument(
            f"{path}: sha256 {actual[:16]}... differs from {expected[:16]}... recorded by Save; "
            "the file was changed or damaged after the snapshot was written, load another one"
        )


def load_array(path: Path) -> npt.NDArray[Any]:
    """One ``.npy`` file; a missing, truncated or non-NumPy file is InvalidArgument.

    One at a time per process: ``numpy.load`` parses the header with ``ast``, and
    CPython 3.11's parser fails at random when two threads run it at once (SystemError
    "AST constructor recursion depth mismatch"), e.g. two in-process shards loading.
    """
    try:
        with _NPY_LOCK:
            array: npt.NDArray[Any] = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidArgument(
            f"{path} is not a readable .npy file ({exc}); the snapshot is damaged"
        ) from None
    return array


def check_arrays(
    spec: TableSpec, arrays: dict[str, npt.NDArray[Any]], rows: Any, committed: int, where: Path
) -> None:
    """Shapes, dtypes and values of one table's arrays in one shard directory."""
    n = arrays["keys"].shape[0] if arrays["keys"].ndim == 1 else -1
    expected = {
        "keys": ((n,), np.int64),
        "values": ((n, spec.dim), np.float32),
        "state": ((n, spec.state_width), np.float32),
        "versions": ((n,), np.int64),
        "changed": ((n,), np.int64),
    }
    for field, (shape, dtype) in expected.items():
        a = arrays[field]
        if a.shape != shape or a.dtype != np.dtype(dtype):
            raise InvalidArgument(
                f"{where}/{spec.name}.{field}.npy has shape {a.shape} {a.dtype}, "
                f"expected {shape} {np.dtype(dtype)}"
            )
    if rows != n:
        raise InvalidArgument(f"{where}/meta.json says table {spec.name!r} has {rows!r} rows, "
                              f"its files hold {n}")  # fmt: skip
    for field in ("values", "state"):
        finite = np.isfinite(arrays[field]).all(axis=1)
        if not finite.all():
            key = int(arrays["keys"][np.flatnonzero(~finite)[0]])
            raise InvalidArgument(
                f"{where}/{spec.name}.{field}.npy: {int((~finite).sum())} rows hold NaN or Inf "
                f"(first: key {key}); a snapshot never holds them, load another one"
            )
    # Never negative (a wrapped clock); above MAX_VERSION only through commits after a
    # write-back of it, so no upper bound but int64's.
    _check_range(arrays, "versions", 0, np.iinfo(np.int64).max, spec, where)
    # A write-back while iteration t trains is stamped t = committed + 1.
    _check_range(arrays, "changed", -1, committed + 1, spec, where)
    if distinct(arrays["keys"])[0].shape[0] != n:
        raise InvalidArgument(f"{where}/{spec.name}.keys.npy holds a key twice")


def _check_range(
    arrays: dict[str, npt.NDArray[Any]],
    field: str,
    low: int,
    high: int,
    spec: TableSpec,
    where: Path,
) -> None:
    a = arrays[field]
    bad = (a < low) | (a > high)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(
            f"{where}/{spec.name}.{field}.npy: key {int(arrays['keys'][i])} has {field} "
            f"{int(a[i])}, outside {low}..{high}; the snapshot is damaged, load another one"
        )


def check_distinct_across(name: str, keys: list[npt.NDArray[np.int64]], root: Path) -> None:
    """No key of table ``name`` appears in two shard directories."""
    if len(keys) < 2:
        return
    merged = np.concatenate(keys)
    if distinct(merged)[0].shape[0] != merged.shape[0]:
        raise InvalidArgument(
            f"snapshot {str(root)!r}: table {name!r} holds a key in two shard directories; "
            "the directories come from different snapshots, load one whole snapshot"
        )
