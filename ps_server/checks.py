"""Request rules both stores enforce, each in one place (and one wording for its error).

Every check raises before the store changes anything.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument, StaleIteration, TableExists, VersionConflict
from heraldps.keyindex import distinct
from heraldps.limits import MAX_ITERATION, MAX_VERSION
from heraldps.optim import MAX_STEPS
from heraldps.spec import TableSpec
from ps_server.kernels import first_non_finite


def check_same_spec(existing: TableSpec, requested: TableSpec) -> None:
    """CreateTable of an existing name: an equal spec is a no-op, another one an error."""
    if existing != requested:
        raise TableExists(
            f"table {requested.name!r} already exists with a different spec "
            f"(existing: {existing}, requested: {requested}); pick another name "
            "or send the existing spec"
        )


def check_iteration(what: str, iteration: int) -> None:
    """Iterations stay at most MAX_ITERATION, so no clock derived from one can wrap."""
    if iteration > MAX_ITERATION:
        raise InvalidArgument(
            f"{what}: iteration {iteration} is above the largest allowed, {MAX_ITERATION} "
            "(2**62); iterations count training steps from 0"
        )


def check_commit_order(iteration: int, committed: int) -> bool:
    """True when ``iteration`` is already committed (a no-op); older ones are refused."""
    check_iteration("commit", iteration)
    if iteration < committed:
        raise StaleIteration(
            f"commit of iteration {iteration}, but iteration {committed} "
            "is already committed; iterations are committed in increasing order"
        )
    return iteration == committed


def check_push_iteration(table: str, iteration: int, committed: int) -> None:
    check_iteration(f"push to {table!r}", iteration)
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
    out = (base_versions < 0) | (new_versions > MAX_VERSION)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise InvalidArgument(
            f"write_back: key {keys[i]} has base_version {base_versions[i]} and new_version "
            f"{new_versions[i]}; versions lie in 0..{MAX_VERSION} (2**62), so that no commit "
            "can wrap them around to a negative number"
        )
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


def check_finite_rows(
    table: str,
    what: str,
    keys: npt.NDArray[np.int64],
    values: npt.NDArray[np.float32],
    state: npt.NDArray[np.float32],
    hint: str = "",
) -> None:
    """Rows an update computed, before they are stored: every value and state finite.

    Finite gradients can still overflow float32 (two 3e38 gradients on a key, a huge
    learning rate); such an update is refused whole rather than storing Inf or NaN.
    """
    i = first_non_finite(values, state)  # one compiled pass; the count only on failure
    if i >= 0:
        bad = ~(np.isfinite(values).all(axis=1) & np.isfinite(state).all(axis=1))
        raise InvalidArgument(
            f"{what} on table {table!r} would store a non-finite value or optimizer state "
            f"in {int(bad.sum())} rows (first: key {keys[i]}); nothing was applied. The "
            f"gradients or the learning rate are too large for float32: lower them{hint}"
        )


COMMIT_HINT = (
    " (the iteration's gradients stay buffered, so this commit fails again until the shard "
    "is loaded from a snapshot)"
)


def check_initializer(spec: TableSpec) -> None:
    """CreateTable: rows the initializer produces (a sample of keys, both signs) are finite.

    The spec's own checks bound every parameter; this catches what they miss, before a
    table exists whose rows would be created non-finite on first touch.
    """
    keys = np.concatenate([np.arange(-64, 64, dtype=np.int64), _EXTREME_KEYS])
    rows = spec.initializer.generate(keys, spec.dim)
    state = spec.optimizer.init_state(keys.shape[0], spec.dim)
    if not (np.isfinite(rows).all() and np.isfinite(state).all()):
        raise InvalidArgument(
            f"table {spec.name!r}: its initializer {spec.initializer} creates rows that hold "
            "NaN or Inf; pick parameters whose values fit in float32"
        )


_EXTREME_KEYS = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], dtype=np.int64)
