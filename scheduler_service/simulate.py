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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from heraldps.datasets import SparseDataset
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


def simulate_mode(
    dataset: SparseDataset, config: SimulationConfig, mode: str, capacity: int
) -> dict[str, Any]:
    scheduler = Scheduler(config.workers, capacity, mode)
    started = time.perf_counter()
    batch_size = config.workers * config.batch_size_per_worker
    for t, part in enumerate(dataset.batches(batch_size, config.iterations)):
        scheduler.submit(Batch(t, part.offsets, part.keys, config.workers))
    scheduler.finish()
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
        "iterations": c.iterations,
        "ms_per_batch": 1000 * seconds / max(c.iterations, 1),
    }


def simulate(dataset: SparseDataset, config: SimulationConfig) -> dict[str, Any]:
    """Counts of every mode; ``capacity`` = floor(cache_fraction x distinct keys)."""
    capacity = math.floor(config.cache_fraction * dataset.distinct_keys())
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


def write_json(result: dict[str, Any], path: str) -> None:
    """``{"config": {...}, "modes": {MODE: {"pulls": P, "pushes": Q}}}`` as the issue fixes it."""
    out = {
        "config": result["config"],
        "modes": {
            m: {"pulls": c["pulls"], "pushes": c["pushes"]} for m, c in result["modes"].items()
        },
    }
    Path(path).write_text(json.dumps(out, indent=2) + "\n")
