"""Key -> shard routing shared by clients, servers and snapshots.

A key goes to ``jump_consistent_hash(splitmix64(key), num_shards)``
(Lamping & Veach, 2014). Mixing first spreads sequential ids evenly; the jump
hash moves only ~1/S of the keys when a shard is added, which keeps
re-sharding a snapshot cheap.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.jit import njit


@njit(nogil=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """The SplitMix64 finaliser: a bijective 64-bit mix."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(nogil=True)
def _jump_shards(
    keys: npt.NDArray[np.int64], num_shards: int
) -> npt.NDArray[np.int32]:  # pragma: no cover
    out = np.empty(keys.shape[0], dtype=np.int32)
    for i in range(keys.shape[0]):
        h = splitmix64(np.uint64(keys[i]))
        b = np.int64(-1)
        j = np.int64(0)
        while j < num_shards:
            b = j
            h = h * np.uint64(2862933555777941757) + np.uint64(1)
            j = np.int64((b + 1) * (float(1 << 31) / float((h >> np.uint64(33)) + np.uint64(1))))
        out[i] = b
    return out


def shard_of(keys: npt.NDArray[np.int64], num_shards: int) -> npt.NDArray[np.int32]:
    """The shard index of every key, vectorized (compiled)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    if num_shards == 1:
        return np.zeros(keys.shape[0], dtype=np.int32)
    result: npt.NDArray[np.int32] = _jump_shards(keys, num_shards)
    return result


def split_by_shard(
    keys: npt.NDArray[np.int64], num_shards: int
) -> tuple[npt.NDArray[np.intp], list[slice]]:
    """Group keys by shard.

    Returns ``order`` (a stable permutation putting each shard's keys together)
    and one slice of ``order`` per shard. ``keys[order][slices[s]]`` are shard
    ``s``'s keys in caller order; results placed at ``out[order]`` come back
    in the caller's order.
    """
    shards = shard_of(keys, num_shards)
    order = np.argsort(shards, kind="stable")
    counts = np.bincount(shards, minlength=num_shards)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return order, [slice(int(bounds[s]), int(bounds[s + 1])) for s in range(num_shards)]
