"""``heraldps simulate``: Herald's Table 1 for a dataset, from the real scheduler core.

Runs every mode of :class:`~scheduler_service.scheduler.Scheduler` over the
same global batches and reports pulls, pushes and their ratios to naive, for
each look-ahead asked for. No separate simulator logic: the counts are those of
the plans a live cluster executes.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from heraldps.data import SparseDataset
from heraldps.data.global_batches import GlobalBatches, InMemoryBatches, mini_batch_sizes
from heraldps.errors import InvalidArgument
from heraldps.modes import EARLY_WRITE_BACK_ALL, PIPELINED_MODE, check_look_ahead, mode_named
from heraldps.traffic import Traffic
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
    # Rows per worker and iteration (Scheduler's early_write_back; -1: every idle row).
    early_write_back: int = EARLY_WRITE_BACK_ALL
    # Batches the scheduler sees beyond the plan it releases (Scheduler's look_ahead): every
    # mode is counted once for each, in this order; (1,): one batch, as before.
    look_ahead: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        if not self.look_ahead:
            raise InvalidArgument("look_ahead needs at least one setting, e.g. (1,)")
        for batches in self.look_ahead:
            check_look_ahead(batches)

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
    will be trained (the first pass of a multi-epoch run: later passes repeat it); a
    streamed run gets the same number from its first pass instead
    (``heraldps.data.global_batches.MiniBatchSizes``)."""
    batches = _as_batches(data, workers, batch_size_per_worker, iterations)
    largest = 0
    for batch in batches.iter_from(0):
        rows = workers * batch_size_per_worker
        sizes = mini_batch_sizes(batch.offsets[: rows + 1], batch.keys, batch_size_per_worker)
        largest = max(largest, int(sizes.max(initial=0)))
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
    scheduler = Scheduler(workers, capacity, mode, expected_keys=expected_keys)
    _plan(scheduler, batches)
    return scheduler


def _plan(
    scheduler: Scheduler, batches: GlobalBatches, progress: Callable[[int, int], None] | None = None
) -> float:
    """Submit every batch to ``scheduler`` and finish it; the seconds spent planning
    (reading the batches not included). ``progress(done, total)`` after each batch."""
    workers = scheduler.num_workers
    spent = 0.0
    total = len(batches)
    for t, part in enumerate(batches.iter_from(0)):
        started = time.perf_counter()
        scheduler.submit(Batch(t, part.offsets, part.keys, workers))
        spent += time.perf_counter() - started
        if progress is not None:
            progress(t + 1, total)
    started = time.perf_counter()
    scheduler.finish()
    return spent + time.perf_counter() - started


def plan_groups(modes: Sequence[str]) -> list[tuple[str, ...]]:
    """``modes`` grouped by the plans they make, in order: modes with the same partitioner
    and sync (``Mode.plans``) make the same plans batch after batch, so one scheduler
    plans them all. Today that is herald and herald_pipelined, whose scheduler only marks
    which of those pulls may go early (``plan_modes`` plans such a group with the pipelined
    mode's scheduler, so its marks are counted too). Modes keep their order."""
    groups: dict[tuple[str, bool], list[str]] = {}
    for mode in modes:
        groups.setdefault(mode_named(mode).plans, []).append(mode)
    return [tuple(g) for g in groups.values()]


Progress = Callable[[str, int, int], None]


def plan_modes(
    batches: GlobalBatches,
    workers: int,
    capacity: int,
    modes: Sequence[str],
    progress: Progress | None = None,
    expected_keys: int = 0,
    early_write_back: int = EARLY_WRITE_BACK_ALL,
    look_ahead: int = 1,
) -> dict[str, tuple[Traffic, float]]:
    """Plan every batch in each of ``modes``: each's counts and planning seconds.

    One scheduler at a time, so memory holds one cache mirror, not one per mode; the
    batches are read again for each group of modes that plan alike (``plan_groups``): the
    price of that memory is a read of the data per group (4 for the 5 Herald modes).
    ``progress(mode, done, total)`` after each batch; ``expected_keys`` sizes each
    scheduler; ``early_write_back`` and ``look_ahead`` are every scheduler's settings.
    ``CacheTooSmall`` as soon as a mini-batch does not fit."""
    out: dict[str, tuple[Traffic, float]] = {}
    for group in plan_groups(modes):
        early = [mode for mode in group if mode_named(mode).early_pulls]
        planner = early[0] if early else group[0]
        scheduler = Scheduler(workers, capacity, planner, expected_keys=expected_keys,
                              early_write_back=early_write_back,
                              look_ahead=look_ahead)  # fmt: skip
        report = None if progress is None else partial(progress, "/".join(group))
        seconds = _plan(scheduler, batches, report)
        for mode in group:
            counts = replace(scheduler.counts)
            if not mode_named(mode).early_pulls:  # the same plans, without the early marks
                counts.early_pulls = 0
            out[mode] = (counts, seconds)
        del scheduler  # its mirror goes before the next group's is built
    return {mode: out[mode] for mode in modes}


def mode_counts(counts: Traffic, seconds: float) -> dict[str, Any]:
    c = counts
    return {
        "pulls": c.pulls,
        "pushes": c.pushes,
        "final_flush": c.final_flush,
        "grad_pushes": c.grad_pushes,
        "write_backs": c.write_backs,
        "evictions": c.evictions,
        "hits": c.hits,
        "early_pulls": c.early_pulls,
        "state_pulls": c.state_pulls,
        "iterations": c.iterations,
        "ms_per_batch": 1000 * seconds / max(c.iterations, 1),
    }


def simulate(
    data: SparseDataset | GlobalBatches,
    config: SimulationConfig,
    distinct_keys: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Counts of every mode; ``capacity`` = floor(cache_fraction x distinct keys). Streamed
    data gives its distinct-key count from the first pass. The modes are planned one
    group after another (``plan_modes``), each over a new read of the data, once per
    look-ahead of ``config``.

    One look-ahead K: ``{"config": {..., "look_ahead": K}, "modes": {MODE: counts}}``.
    Several: ``{"config": {..., "look_ahead": [K, ...]}, "runs": [{"look_ahead": K,
    "modes": {...}}, ...]}`` in the config's order (``runs`` reads either)."""
    if distinct_keys is None:
        if not isinstance(data, SparseDataset):
            raise ValueError("simulate of streamed batches needs distinct_keys (the first pass)")
        distinct_keys = data.distinct_keys()
    capacity = config.cache_rows(distinct_keys)
    batches = config.batches(data)
    several = len(config.look_ahead) > 1
    found = []
    for k in config.look_ahead:
        report = _labelled(progress, f" (look-ahead {k})") if several else progress
        planned = plan_modes(batches, config.workers, capacity, list(MODES), report,
                             expected_keys=distinct_keys,
                             early_write_back=config.early_write_back,
                             look_ahead=k)  # fmt: skip
        found.append({"look_ahead": k, "modes": {m: mode_counts(*planned[m]) for m in MODES}})
    rows = data.rows if isinstance(data, SparseDataset) else batches_rows(batches)
    settings = list(config.look_ahead) if several else config.look_ahead[0]
    head = {"config": {**asdict(config), "look_ahead": settings, "cache_rows": capacity,
                       "rows": rows, "distinct_keys": distinct_keys}}  # fmt: skip
    if several:
        return {**head, "runs": found}
    return {**head, "modes": found[0]["modes"]}


def _labelled(progress: Progress | None, suffix: str) -> Progress | None:
    """``progress`` with ``suffix`` after each group's name (which look-ahead is planned)."""
    if progress is None:
        return None
    report = progress
    return lambda modes, done, total: report(modes + suffix, done, total)


def runs(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each look-ahead's counts of a ``simulate`` result, in order: ``[{"look_ahead": K,
    "modes": {MODE: counts}}, ...]``; one entry when it counted one."""
    if "runs" in result:
        return list(result["runs"])
    return [{"look_ahead": result["config"]["look_ahead"], "modes": result["modes"]}]


def batches_rows(batches: GlobalBatches) -> int:
    """Rows of the data behind ``batches``."""
    return batches.dataset.rows if isinstance(batches, InMemoryBatches) else batches.rows


def ratio(value: int, base: int) -> float:
    return value / base if base else float("nan")


def table(result: dict[str, Any]) -> str:
    """Markdown table in the layout of Herald's Table 1; with several look-aheads, one
    block of rows per look-ahead after a ``look-ahead`` column (ratios to that block's naive)."""
    found = runs(result)
    several = len(found) > 1
    first = "| look-ahead " if several else ""
    lines = [
        f"{first}| mode | pulls | pushes | final flush | pull | push | overall |",
        f"{'|---:' if several else ''}|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in found:
        naive = run["modes"]["naive"]
        lead = f"| {run['look_ahead']} " if several else ""
        for mode, c in run["modes"].items():
            overall = ratio(c["pulls"] + c["pushes"], naive["pulls"] + naive["pushes"])
            lines.append(
                f"{lead}| {mode} | {c['pulls']:,} | {c['pushes']:,} | {c['final_flush']:,} | "
                f"{ratio(c['pulls'], naive['pulls']):.2f} | "
                f"{ratio(c['pushes'], naive['pushes']):.2f} | {overall:.2f} |"
            )
    return "\n".join(lines)


def early_line(result: dict[str, Any]) -> str | None:
    """How many of the pipelined mode's pulls its plans mark early (a line per look-ahead
    when there are several); None if it did not run."""
    found = runs(result)
    lines = []
    for run in found:
        c = run["modes"].get(PIPELINED_MODE)
        if c is None:
            return None
        share = ratio(c["early_pulls"], c["pulls"])
        which = f" (look-ahead {run['look_ahead']})" if len(found) > 1 else ""
        lines.append(
            f"{PIPELINED_MODE}{which}: {c['early_pulls']:,} of {c['pulls']:,} pulls "
            f"({share:.0%}) are early (the previous iteration does not change them)"
        )
    return "\n".join(lines)


JSON_COUNTS = ("pulls", "pushes", "grad_pushes", "write_backs", "final_flush", "state_pulls",
               "early_pulls")  # fmt: skip
"""Per mode in ``--json``: Table 1's pulls and pushes first, then what splits them by bytes
(a gradient, a write-back with its state, a pull with or without state)."""


def write_json(result: dict[str, Any], path: str) -> None:
    """``{"config": {...}, "modes": {MODE: {"pulls": P, "pushes": Q, ...}}}`` (the counts of
    ``JSON_COUNTS``); with several look-aheads, ``"runs": [{"look_ahead": K, "modes": {...}},
    ...]`` instead of ``modes``."""

    def moved(modes: dict[str, Any]) -> dict[str, Any]:
        return {m: {k: c[k] for k in JSON_COUNTS} for m, c in modes.items()}

    out: dict[str, Any] = {"config": result["config"]}
    if "runs" in result:
        out["runs"] = [{"look_ahead": r["look_ahead"], "modes": moved(r["modes"])}
                       for r in result["runs"]]  # fmt: skip
    else:
        out["modes"] = moved(result["modes"])
    if "fields" in result:  # distinct values and keys per sparse column (collisions)
        out["fields"] = result["fields"]
    Path(path).write_text(json.dumps(out, indent=2) + "\n")
