"""What ``PSClient`` checks in a whole request before it sends any part of it.

A request that spans shards is split into one request per shard. If a shard
could refuse its part while another applies its own, a rejected request would
be half applied; so every rule a shard enforces on the data itself (sizes,
finiteness, step counts, version ranges, iteration ranges) is checked here on
the whole request first, and a bad one raises the shard's own error class
(``InvalidArgument``) with nothing sent. The shards check again: other clients
exist.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument
from heraldps.keyindex import distinct
from heraldps.limits import MAX_ITERATION, MAX_VERSION
from heraldps.optim import MAX_STEPS


def finite_rows(rows: npt.NDArray[np.float32], what: str) -> None:
    """Every value finite (as each shard requires of grads, values and state)."""
    if rows.size and not np.isfinite(rows).all():
        bad = int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
        raise InvalidArgument(
            f"{what}: row {bad} contains NaN or Inf; every value must be finite (nothing was "
            "sent to any shard)"
        )


def iteration(what: str, value: int) -> None:
    if value > MAX_ITERATION:
        raise InvalidArgument(
            f"{what}: iteration {value} is above the largest allowed, {MAX_ITERATION} (2**62)"
        )


def steps(counts: npt.NDArray[np.int32]) -> None:
    bad = (counts < 1) | (counts > MAX_STEPS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(
            f"push: steps[{i}] is {counts[i]}; each gradient row stands for 1 to {MAX_STEPS} "
            "optimizer steps (nothing was sent to any shard)"
        )


def write_back(
    keys: npt.NDArray[np.int64],
    base: npt.NDArray[np.int64],
    new: npt.NDArray[np.int64],
) -> None:
    """The shards' write-back rules on the whole request: one version of each kind per
    key, distinct keys, versions in 0..MAX_VERSION that only move forward."""
    n = keys.shape[0]
    if base.shape[0] != n or new.shape[0] != n:
        raise InvalidArgument(
            f"write_back: {n} keys but {base.shape[0]} base_versions and {new.shape[0]} "
            "new_versions; send one of each per key"
        )
    if distinct(keys)[0].shape[0] != n:
        raise InvalidArgument("write_back: keys must be distinct (one row per key)")
    bad = (base < 0) | (new > MAX_VERSION) | (new < base)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(
            f"write_back: key {keys[i]} has base_version {base[i]}, new_version {new[i]}; "
            f"versions lie in 0..{MAX_VERSION} (2**62) and only move forward (nothing was "
            "sent to any shard)"
        )
