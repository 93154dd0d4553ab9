"""Checks of a run's configuration that need the data, made before any process starts.

A cluster that fails on its first batch costs a minute and prints an RPC error
from deep inside; these checks cost a second and name the flag to change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np

from heraldps import bundled
from heraldps.data import SparseDataset
from heraldps.data.global_batches import (
    GlobalBatches,
    InMemoryBatches,
    MiniBatchSizes,
    StreamedBatches,
)
from heraldps.errors import CacheTooSmall, InvalidArgument
from heraldps.modes import LOCATION_AWARE, mode_named


def check_columns(data: str, format: str, sparse_columns: tuple[str, ...] | None) -> None:
    """``--format csv`` needs ``--sparse-columns``; say what the file's first line holds."""
    if format != "csv" or sparse_columns:
        return
    path = bundled.resolve(data)
    try:
        with open(path, encoding="utf-8-sig") as f:
            first = f.readline().strip()
    except OSError as exc:
        raise InvalidArgument(f"--data {data}: {exc.strerror or exc}") from None
    raise InvalidArgument(
        f"--format csv needs --sparse-columns (comma-separated categorical columns of the "
        f"header line); the first line of {path.name}, read as the header, is: "
        f"{_short(first)!r} (if that is data, add a header line naming the columns)"
    )


def check_batches(rows: int, workers: int, batch_size_per_worker: int) -> None:
    """At least one whole global batch: a partial one is never trained."""
    batch = workers * batch_size_per_worker
    if rows < batch:
        raise InvalidArgument(
            f"the data has {rows:,} rows, fewer than one global batch of {batch:,} "
            f"(--workers {workers} x --batch-size-per-worker {batch_size_per_worker}); lower "
            "either"
        )


def check_cache(
    data: SparseDataset | GlobalBatches,
    workers: int,
    batch_size_per_worker: int,
    cache_rows: int,
    iterations: int | None,
    modes: Iterable[str],
    epochs: int = 1,
    distinct_keys: int | None = None,
    sizes: MiniBatchSizes | None = None,
    look_ahead: int = 1,
) -> None:
    """Every worker's mini-batch must fit its cache, in every mode that will run.

    The sequential partition (naive, on_demand, het) is checked from the data alone: by
    ``sizes``, gathered during the first pass (streamed runs), else by a pass over the
    batches. Location-aware assignment depends on the caches, so every batch of every
    epoch of those modes is planned with the real scheduler core (what ``heraldps
    simulate`` does), without a cluster; unless no mini-batch can outgrow the cache at
    all (``batch_size_per_worker`` x the most keys in one row fits it), which is exact and
    costs nothing. Streamed batches (``StreamedBatches``) carry their own passes and cap;
    ``distinct_keys`` then comes from the first pass, for the message. ``look_ahead``: the
    scheduler's (what it evicts, and so the assignment, may depend on it).
    """
    from scheduler_service.simulate import largest_mini_batch, plan_modes

    if isinstance(data, SparseDataset):
        rows, distinct = data.rows, data.distinct_keys()
        one_pass: GlobalBatches = InMemoryBatches(data, workers * batch_size_per_worker, iterations)
        every_pass: GlobalBatches = InMemoryBatches(
            data, workers * batch_size_per_worker, iterations, epochs
        )
        row_keys: int | None = int(np.diff(data.offsets).max(initial=0))
    else:
        assert isinstance(data, StreamedBatches)
        rows, distinct = data.rows, int(distinct_keys or 0)
        one_pass, every_pass = replace(data, epochs=1), data
        row_keys = None if sizes is None else sizes.max_row_keys
    check_batches(rows, workers, batch_size_per_worker)
    if sizes is not None:
        needed = sizes.largest(len(one_pass))
    else:
        needed = largest_mini_batch(one_pass, workers, batch_size_per_worker, iterations)
    if needed > cache_rows:
        raise cache_error(distinct, needed, cache_rows, "")
    planned = [mode for mode in modes if mode_named(mode).partitioner == LOCATION_AWARE]
    if planned and row_keys is not None and batch_size_per_worker * row_keys <= cache_rows:
        planned = []  # any mini-batch fits: no plan can need more than its rows' keys
    if planned:
        try:
            plan_modes(every_pass, workers, cache_rows, planned, expected_keys=distinct,
                       look_ahead=look_ahead)  # fmt: skip
        except CacheTooSmall as exc:
            raise cache_error(distinct, exc.needed, cache_rows, " with location-aware "
                              "assignment") from None  # fmt: skip


def cache_error(distinct: int, needed: int, cache_rows: int, where: str) -> InvalidArgument:
    fraction = math.ceil(1000 * needed / max(distinct, 1)) / 1000
    return InvalidArgument(
        f"a worker's mini-batch needs up to {needed:,} distinct rows{where}, but the cache "
        f"holds {cache_rows:,} ({cache_rows / max(distinct, 1):.3g} of {distinct:,} distinct "
        f"keys): use --cache-fraction {min(fraction, 1.0):g} or more, or a smaller "
        "--batch-size-per-worker"
    )


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def data_name(data: str) -> str:
    """The file name to show for ``--data`` (bundled names as given)."""
    return data if data.startswith(bundled.PREFIX) else Path(data).name
