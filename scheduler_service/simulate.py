"""``heraldps simulate``: Herald's Table 1 for a dataset, from the real scheduler core.

Runs every mode of :class:`~scheduler_service.scheduler.Scheduler` over the
same global batches and reports pulls, pushes and their ratios to naive. No
separate simulator logic: the counts are those of the plans a live cluster
executes.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heraldps.data import SparseDataset
from heraldps.data.global_batches import GlobalBatches, InMemoryBatches
from heraldps.modes import PIPELINED_MODE
from scheduler_service.batch import Batch
from scheduler_service.scheduler import MODES, Scheduler


@dataclass(frozen=True)
class SimulationConfig:
    data: str
    format: str
    workers: int = 8
    batch_size_per_worker: int = 128
    cache_fraction: float = 0.1
    iterations: int | None = None

    def cache_rows(self, data: SparseDataset | int) -> int:
        return cache_rows_for(data, self.cache_fraction)

    def batches(self, data: SparseDataset | GlobalBatches) -> GlobalBatches:
        """One pass of global batches over ``data`` (a streamed run's batches as they are)."""
        if isinstance(data, SparseDataset):
            return InMemoryBatches(data, self.workers * self.batch_size_per_worker,
                                   self.iterations)  # fmt: skip
        return data


def cache_rows_for(data: SparseDataset | int, cache_fraction: float) -> int:
    """Rows per worker cache: floor(cache_fraction x distinct keys of the data), at least 1.
    ``data``: the data set, or its distinct-key count (from a streamed first pass)."""
    distinct = data.distinct_keys() if isinstance(data, SparseDataset) else int(data)
    return max(1, math.floor(cache_fraction * distinct))


def _as_batches(
    data: SparseDataset | GlobalBatches,
    workers: int,
    batch_size_per_worker: int,
    iterations: int | None,
    epochs: int = 1,
) -> GlobalBatches:
    if isinstance(data, SparseDataset):
        return InMemoryBatches(data, workers * batch_size_per_worker, iterations, epochs)
    return data


def mini_batch_sizes(batch: SparseDataset, workers: int, batch_size_per_worker: int) -> int:
    """Most distinct keys in one worker's mini-batch of ``batch`` (sequential partition):
    one sort of (mini-batch, key) pairs."""
    rows = workers * batch_size_per_worker
    keys = batch.keys[: int(batch.offsets[rows])]
    group = np.repeat(np.arange(rows, dtype=np.int64) // batch_size_per_worker,
                      np.diff(batch.offsets[: rows + 1]))  # fmt: skip
    order = np.lexsort((keys, group))
    keys, group = keys[order], group[order]
    first = np.ones(keys.shape[0], dtype=bool)
    first[1:] = (keys[1:] != keys[:-1]) | (group[1:] != group[:-1])
    return int(np.bincount(group[first], minlength=1).max())


def largest_mini_batch(
    data: SparseDataset | GlobalBatches,
    workers: int,
    batch_size_per_worker: int,
    iterations: int | None,
) -> int:
    """Most distinct keys in one worker's mini-batch under the sequential partition.

    A worker's cache must hold its whole mini-batch, so this is the smallest cache
    (rows) that naive, on-demand and HET runs accept; location-aware assignment is
    checked by planning (it depends on the caches). One pass over the batches that
    will be trained (the first pass of a multi-epoch run: later passes repeat it).
    """
    batches = _as_batches(data, workers, batch_size_per_worker, iterations)
    largest = 0
    for batch in batches.iter_from(0):
        largest = max(largest, mini_batch_sizes(batch, workers, batch_size_per_worker))
    return largest


def plan_all(
    data: SparseDataset | GlobalBatches,
    workers: int,
    batch_size_per_worker: int,
    capacity: int,
    mode: str,
    iterations: int | None,
    epochs: int = 1,
    expected_keys: int = 0,
) -> Scheduler:
    """Plan every global batch of ``epochs`` passes over ``data`` (at most ``iterations``;
    streamed batches carry their own passes and cap) in ``mode``, plans dropped; the
    scheduler, with its counts. ``CacheTooSmall`` if a mini-batch does not fit a cache.
    Each pass counts: location-aware assignment depends on what the caches hold, so a
    later pass may split the same batch differently. ``expected_keys`` (the data's
    distinct keys, when known; 0: unknown) sizes the scheduler's key index and records
    up front (docs/scheduler.md, the cache mirror)."""
    batches = _as_batches(data, workers, batch_size_per_worker, iterations, epochs)
    return plan_modes(batches, workers, capacity, (mode,), expected_keys=expected_keys)[mode]


Progress = Callable[[int, int], None]


def plan_modes(
    batches: GlobalBatches,
    workers: int,
    capacity: int,
    modes: Sequence[str],
    progress: Progress | None = None,
    seconds: dict[str, float] | None = None,
    expected_keys: int = 0,
) -> dict[str, Scheduler]:
    """Plan every batch in each of ``modes``, reading the data once: each batch goes to
    every mode's scheduler in turn. ``progress(done, total)`` after each batch;
    ``seconds`` gets each mode's planning time; ``expected_keys`` sizes each scheduler."""
    schedulers = {
        mode: Scheduler(workers, capacity, mode, expected_keys=expected_keys) for mode in modes
    }
    spent = dict.fromkeys(modes, 0.0)
    total = len(batches)
    for t, part in enumerate(batches.iter_from(0)):
        for mode, scheduler in schedulers.items():
            started = time.perf_counter()
            scheduler.submit(Batch(t, part.offsets, part.keys, workers))
            spent[mode] += time.perf_counter() - started
        if progress is not None:
            progress(t + 1, total)
    for mode, scheduler in schedulers.items():
        started = time.perf_counter()
        scheduler.finish()
        spent[mode] += time.perf_counter() - started
    if seconds is not None:
        seconds.update(spent)
    return schedulers


def mode_counts(scheduler: Scheduler, seconds: float) -> dict[str, Any]:
    c = scheduler.counts
    return {
        "pulls": c.pulls,
        "pushes": c.pushes,
        "final_flush": c.final_flush,
        "grad_pushes": c.grad_pushes,
        "write_backs": c.write_backs,
        "evictions": c.evictions,
        "hits": c.hits,
        "early_pulls": c.early_pulls,
        "iterations": c.iterations,
        "ms_per_batch": 1000 * seconds / max(c.iterations, 1),
    }


def simulate(
    data: SparseDataset | GlobalBatches,
    config: SimulationConfig,
    distinct_keys: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Counts of every mode over one read of the data; ``capacity`` = floor(cache_fraction x
    distinct keys). Streamed data gives its distinct-key count from the first pass."""
    if distinct_keys is None:
        if not isinstance(data, SparseDataset):
            raise ValueError("simulate of streamed batches needs distinct_keys (the first pass)")
        distinct_keys = data.distinct_keys()
    capacity = config.cache_rows(distinct_keys)
    batches = config.batches(data)
    seconds: dict[str, float] = {}
    schedulers = plan_modes(batches, config.workers, capacity, list(MODES), progress, seconds,
                            expected_keys=distinct_keys)  # fmt: skip
    modes = {mode: mode_counts(schedulers[mode], seconds[mode]) for mode in MODES}
    rows = data.rows if isinstance(data, SparseDataset) else batches_rows(batches)
    return {
        "config": {**asdict(config), "cache_rows": capacity, "rows": rows,
                   "distinct_keys": distinct_keys},
        "modes": modes,
    }  # fmt: skip


def batches_rows(batches: GlobalBatches) -> int:
    """Rows of the data behind ``batches``."""
    return batches.dataset.rows if isinstance(batches, InMemoryBatches) else batches.rows


def ratio(value: int, base: int) -> float:
    return value / base if base else float("nan")


def table(result: dict[str, Any]) -> str:
    """Markdown table in the layout of Herald's Table 1."""
    naive = result["modes"]["naive"]
    lines = [
        "| mode | pulls | pushes | final flush | pull | push | overall |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, c in result["modes"].items():
        overall = ratio(c["pulls"] + c["pushes"], naive["pulls"] + naive["pushes"])
        lines.append(
            f"| {mode} | {c['pulls']:,} | {c['pushes']:,} | {c['final_flush']:,} | "
            f"{ratio(c['pulls'], naive['pulls']):.2f} | {ratio(c['pushes'], naive['pushes']):.2f}"
            f" | {overall:.2f} |"
        )
    return "\n".join(lines)


def early_line(result: dict[str, Any]) -> str | None:
    """How many of the pipelined mode's pulls its plans mark early; None if it did not run."""
    c = result["modes"].get(PIPELINED_MODE)
    if c is None:
        return None
    share = ratio(c["early_pulls"], c["pulls"])
    return (
        f"{PIPELINED_MODE}: {c['early_pulls']:,} of {c['pulls']:,} pulls ({share:.0%}) are early "
        "(the previous iteration does not change them)"
    )


def write_json(result: dict[str, Any], path: str) -> None:
    """``{"config": {...}, "modes": {MODE: {"pulls": P, "pushes": Q}}}`` as the issue fixes it."""
    out = {
        "config": result["config"],
        "modes": {
            m: {"pulls": c["pulls"], "pushes": c["pushes"]} for m, c in result["modes"].items()
        },
    }
    if "fields" in result:  # distinct values and keys per sparse column (collisions)
        out["fields"] = result["fields"]
    Path(path).write_text(json.dumps(out, indent=2) + "\n")
