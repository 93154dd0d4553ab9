"""Warming the Cached-PS host caches: Prefetch, and HugeCTR keyset files to prefetch.

A keyset file is raw native-endian int64 keys, no header (HugeCTR ETC).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps import wire
from heraldps.client import rpc
from heraldps.client.core import ShardClient
from heraldps.client.routing import as_keys
from heraldps.v1 import ps_pb2


def read_keyset(path: str) -> npt.NDArray[np.int64]:
    """Keys of a HugeCTR keyset file: raw native-endian int64, no header."""
    raw = np.fromfile(path, dtype=np.dtype("=i8"))
    return raw.astype(np.int64, copy=False)


def write_keyset(path: str, keys: npt.ArrayLike) -> int:
    """Write distinct ``keys`` (sorted) as a HugeCTR keyset file; return how many."""
    unique = np.unique(np.asarray(keys, dtype=np.int64))
    unique.astype(np.dtype("=i8")).tofile(path)
    return int(unique.shape[0])


class KeysetPrefetch(ShardClient):
    """Warm the shards' host caches (Cached-PS) with a keyset before training."""

    def prefetch(self, table: str, keys: npt.ArrayLike) -> int:
        """Load the rows of ``keys`` into the shards' host caches; return rows now cached."""
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
