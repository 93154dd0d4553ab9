"""Request rules both stores enforce, each in one place (and one wording for its error).

Every check raises before the store changes anything.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument, StaleIteration, TableExists, VersionConflict
from heraldps.keyindex import distinct
from heraldps.optim import MAX_STEPS
from heraldps.spec import TableSpec


def check_same_spec(existing: TableSpec, requested: TableSpec) -> None:
    """CreateTable of an existing name: an equal spec is a no-op, another one an error."""
    if existing != requested:
        raise TableExists(
            f"table {requested.name!r} already exists with a different spec "
            f"(existing: {existing}, requested: {requested}); pick another name "
            "or send the existing spec"
        )


def check_commit_order(iteration: int, committed: int) -> bool:
    """True when ``iteration`` is already committed (a no-op); older ones are refused."""
    if iteration < committed:
        raise StaleIteration(
            f"commit of iteration {iteration}, but iteration {committed} "
            "is already committed; iterations are committed in increasing order"
        )
    return iteration == committed


def check_push_iteration(table: str, iteration: int, committed: int) -> None:
    if iteration <= committed:
        raise StaleIteration(
            f"push to iteration {iteration} of table {table!r}, but iteration "
            f"{committed} is already committed; push to a newer iteration"
        )


def check_steps(steps: npt.NDArray[np.int32]) -> None:
    """A push's optimizer step counts: each in 1..MAX_STEPS."""
    bad = (steps < 1) | (steps > MAX_STEPS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(
            f"push: steps[{i}] is {steps[i]}; each gradient row stands for 1 to {MAX_STEPS} "
            "optimizer steps (leave steps empty for 1 each)"
        )


def check_write_back(
    keys: npt.NDArray[np.int64],
    base_versions: npt.NDArray[np.int64],
    new_versions: npt.NDArray[np.int64],
) -> None:
    if distinct(keys)[0].shape[0] != keys.shape[0]:
        raise InvalidArgument("write_back: keys must be distinct (one row per key)")
    behind = new_versions < base_versions
    if behind.any():
        i = int(np.flatnonzero(behind)[0])
        raise InvalidArgument(
            f"write_back: key {keys[i]} has new_version {new_versions[i]} < base_version "
            f"{base_versions[i]}; versions only move forward"
        )


def check_versions_unchanged(
    table: str,
    keys: npt.NDArray[np.int64],
    stored: npt.NDArray[np.int64],
    base_versions: npt.NDArray[np.int64],
) -> None:
    moved = stored != base_versions
    if moved.any():
        i = int(np.flatnonzero(moved)[0])
        raise VersionConflict(
            f"write_back to {table!r} rejected: {int(moved.sum())} of {keys.shape[0]} "
            f"rows changed since the worker read them (key {keys[i]}: stored version "
            f"{stored[i]}, base_version {base_versions[i]}); pull them again and retry"
        )
