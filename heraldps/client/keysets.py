"""Warming the Cached-PS host caches: Prefetch, and HugeCTR keyset files to prefetch.

A keyset file is raw native-endian int64 keys, no header (HugeCTR ETC).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from heraldps import wire
from heraldps.client import rpc
from heraldps.client.arguments import as_keys, check_name, check_path
from heraldps.client.core import ShardClient
from heraldps.errors import FailedPrecondition, HeraldError, InvalidArgument, NotFound, shown
from heraldps.v1 import ps_pb2


def read_keyset(path: str) -> npt.NDArray[np.int64]:
    """Keys of a HugeCTR keyset file: raw native-endian int64, no header."""
    path = check_path(path, "read_keyset")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise _file_error("read_keyset", path, exc) from None
    if len(data) % 8:
        raise InvalidArgument(
            f"read_keyset: {shown(path)} holds {len(data)} bytes, not a multiple of 8; a "
            "keyset file is raw int64 keys"
        )
    return np.frombuffer(data, dtype=np.dtype("=i8")).astype(np.int64)


def write_keyset(path: str, keys: npt.ArrayLike) -> int:
    """Write distinct ``keys`` (sorted) as a HugeCTR keyset file; return how many."""
    path = check_path(path, "write_keyset")
    unique = np.unique(as_keys(keys))
    try:
        unique.astype(np.dtype("=i8")).tofile(path)
    except OSError as exc:
        raise _file_error("write_keyset", path, exc) from None
    return int(unique.shape[0])


def _file_error(what: str, path: str, exc: OSError) -> HeraldError:
    """A missing file is NotFound; any other OS error FailedPrecondition (a directory, no
    permission): the path was well formed but the file system says no."""
    reason = exc.strerror or str(exc)
    message = f"{what}: {shown(path)}: {reason}"
    return NotFound(message) if isinstance(exc, FileNotFoundError) else FailedPrecondition(message)


class KeysetPrefetch(ShardClient):
    """Warm the shards' host caches (Cached-PS) with a keyset before training."""

    def prefetch(self, table: str, keys: npt.ArrayLike) -> int:
        """Load the rows of ``keys`` into the shards' host caches; return rows now cached."""
        check_name(table)
        keys = as_keys(keys)
        calls = [
            self._unary(shard, "Prefetch", ps_pb2.PrefetchRequest(
                table=table, keys=wire.encode_keys(keys[index])), idempotent=True)
            for shard, index in self._requests(keys, 8)
        ]  # fmt: skip
        return rpc.wait(rpc.gather(calls, lambda answers: sum(int(a.cached_rows) for a in answers)))

    def prefetch_keyset(self, table: str, path: str) -> int:
        """``prefetch`` of a HugeCTR keyset file; return rows now cached."""
        return self.prefetch(table, read_keyset(path))
