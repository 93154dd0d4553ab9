"""``heraldps simulate``: Herald's Table 1 for a dataset, from the real scheduler core.

Runs every mode of :class:`~scheduler_service.scheduler.Scheduler` over the
same global batches and reports pulls, pushes and their ratios to naive. No
separate simulator logic: the counts are those of the plans a live cluster
executes.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heraldps.datasets import SparseDataset
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

    def cache_rows(self, dataset: SparseDataset) -> int:
        return cache_rows_for(dataset, self.cache_fraction)


def cache_rows_for(dataset: SparseDataset, cache_fraction: float) -> int:
    """Rows per worker cache: floor(cache_fraction x distinct keys of the data), at least 1."""
    return max(1, math.floor(cache_fraction * dataset.distinct_keys()))


def largest_mini_batch(
    dataset: SparseDataset, workers: int, batch_size_per_worker: int, iterations: int | None
) -> int:
    """Most distinct keys in one worker's mini-batch under the sequential partition.

    A worker's cache must hold its whole mini-batch, so this is the smallest cache
    (rows) that naive, on-demand and HET runs accept; location-aware assignment is
    checked by planning (it depends on the caches). Vectorized: one sort of
    (mini-batch, key) pairs over the batches that will be trained.
    """
    batch = workers * batch_size_per_worker
    count = dataset.rows // batch
    if iterations is not None:
        count = min(count, iterations)
    rows = count * batch
    end = int(dataset.offsets[rows])
    keys = dataset.keys[:end]
    group = np.repeat(np.arange(rows, dtype=np.int64) // batch_size_per_worker,
                      np.diff(dataset.offsets[: rows + 1]))  # fmt: skip
    order = np.lexsort((keys, group))
    keys, group = keys[order], group[order]
    first = np.ones(keys.shape[0], dtype=bool)
    first[1:] = (keys[1:] != keys[:-1]) | (group[1:] != group[:-1])
    return int(np.bincount(group[first], minlength=1).max())


def plan_all(
    dataset: SparseDataset,
    workers: int,
    batch_size_per_worker: int,
    capacity: int,
    mode: str,
    iterations: int | None,
    epochs: int = 1,
    expected_keys: int = 0,
) -> Scheduler:
    """Plan every global batch of ``epochs`` passes over ``dataset`` (at most ``iterations``)
    in ``mode``, plans dropped; the scheduler, with its counts. ``CacheTooSmall`` if a
    mini-batch does not fit a cache. Each pass counts: location-aware assignment depends
    on what the caches hold, so a later pass may split the same batch differently.
    ``expected_keys`` (the data's distinct keys, when known; 0: unknown) sizes the
    scheduler's key index and records up front (docs/scheduler.md, the cache mirror)."""
    scheduler = Scheduler(workers, capacity, mode, expected_keys=expected_keys)
    size = workers * batch_size_per_worker
    passes = (part for _ in range(epochs) for part in dataset.batches(size))
    for t, part in enumerate(itertools.islice(passes, iterations)):
        scheduler.submit(Batch(t, part.offsets, part.keys, workers))
    scheduler.finish()
    return scheduler


def simulate_mode(
    dataset: SparseDataset, config: SimulationConfig, mode: str, capacity: int
) -> dict[str, Any]:
    started = time.perf_counter()
    scheduler = plan_all(dataset, config.workers, config.batch_size_per_worker, capacity, mode,
                         config.iterations)  # fmt: skip
    seconds = time.perf_counter() - started
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


def simulate(dataset: SparseDataset, config: SimulationConfig) -> dict[str, Any]:
    """Counts of every mode; ``capacity`` = floor(cache_fraction x distinct keys)."""
    capacity = config.cache_rows(dataset)
    modes = {mode: simulate_mode(dataset, config, mode, capacity) for mode in MODES}
    return {
        "config": {**asdict(config), "cache_rows": capacity, "rows": dataset.rows,
                   "distinct_keys": dataset.distinct_keys()},
        "modes": modes,
    }  # fmt: skip


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
    Path(path).write_text(json.dumps(out, indent=2) + "\n")
