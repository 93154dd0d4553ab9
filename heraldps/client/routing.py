"""Which request carries which keys: split by shard, then by the message limit.

Pure NumPy on the caller's arrays, no gRPC: each request is a (shard, index)
pair, where ``keys[index]`` are the request's keys and ``out[index] = part``
puts its results back in the caller's order.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from heraldps.sharding import split_by_shard

Index = npt.NDArray[np.intp] | slice


def plan_requests(
    keys: npt.NDArray[np.int64], num_shards: int, per_request: int
) -> list[tuple[int, Index]]:
    """(shard, index) of each request, at most ``per_request`` keys each; a shard's part
    that needs several requests is cut into equal ones (sizes differ by at most one key).

    With one shard the index is a slice, so requests and results are plain
    contiguous copies instead of gathers and scatters.
    """

    def cut(n: int) -> list[slice]:
        count = -(-n // max(per_request, 1))
        bounds = [n * i // count for i in range(count + 1)] if count else []
        return [slice(a, b) for a, b in itertools.pairwise(bounds)]

    if num_shards == 1:
        return [(0, piece) for piece in cut(keys.shape[0])]
    order, slices = split_by_shard(keys, num_shards)
    plan: list[tuple[int, Index]] = []
    for shard, part in enumerate(slices):
        positions = order[part]
        plan += [(shard, positions[piece]) for piece in cut(positions.shape[0])]
    return plan


def count(index: Index, total: int) -> int:
    """How many keys ``index`` selects out of ``total``."""
    if isinstance(index, slice):
        return len(range(*index.indices(total)))
    return int(index.shape[0])
