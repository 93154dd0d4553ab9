"""Scheduler speed: partition + plan (``Scheduler.submit``) per global batch, by shape.

Run from the repository root::

    python benchmarks/bench_scheduler.py           # about 1-2 minutes on 2 cores
    python benchmarks/bench_scheduler.py --quick   # fewer batches
    python benchmarks/bench_scheduler.py --threads 1 --no-hint   # one core, no size hint
    python benchmarks/bench_scheduler.py --threads 2   # the helper thread whatever the load

Batches of W workers x B samples x 26 categorical fields, each field drawn from a
Zipf(1)-like distribution (log-uniform rank: P(rank r) ~ 1/(r + 1)) over Criteo
Kaggle's published per-field cardinalities C1..C26 (``shared/data/CARDINALITIES.md``,
33.76M keys in all); cache = 10% of that vocabulary per worker (3.38M rows, so the
caches fill up and never evict within a run: every batch brings new keys); mode
``herald`` (location-aware partition + on-demand sync).

The scheduler is told the run's distinct-key count (``expected_keys``), as a job with a
keyset or a first pass over its data knows it; ``--no-hint`` leaves it to the growth
policy (docs/scheduler.md). Numba compiles (or loads its cache) in a throw-away
scheduler before timing: warm-up is excluded; every batch of the timed run counts.
Reported per shape: median, p99 and max ms per batch, and each stage's median
(``Scheduler.stage_seconds``); the floor beside it is
``np.unique`` of the same batch's keys, timed in the same run (the sort any plan needs
at least the equivalent of), and the ratio median / floor. Targets (issue 22, our
2-core machine): 8 x 128 median <= 2 ms; 64 x 512 median <= 10 ms and p99 <= 25 ms.
JSON goes to ``benchmarks/results/bench_scheduler.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from heraldps.modes import EARLY_WRITE_BACK_ALL
from heraldps.runtime import tune_malloc
from launcher.cli.command import early_write_back, look_ahead
from scheduler_service import split
from scheduler_service.batch import Batch
from scheduler_service.scheduler import STAGES, Scheduler

CRITEO_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
OUTPUT = Path(__file__).resolve().parent / "results" / "bench_scheduler.json"
# (workers, samples per worker, batches, batches with --quick)
SHAPES = [(8, 128, 400, 100), (16, 256, 100, 30), (64, 512, 40, 12)]
TARGETS = {(8, 128): (2.0, None), (64, 512): (10.0, 25.0)}  # median, p99 ms


def zipf_batches(count: int, workers: int, per_worker: int, seed: int) -> list[Batch]:
    """``count`` batches; field f's rank r has probability ~ 1 / (r + 1) (Zipf(1))."""
    rng = np.random.default_rng(seed)
    cards = np.array(CRITEO_CARDINALITIES, dtype=np.float64)
    base = np.concatenate([[0], np.cumsum(cards)[:-1]]).astype(np.int64)
    fields = cards.shape[0]
    samples = workers * per_worker
    offsets = np.arange(samples + 1, dtype=np.int64) * fields
    batches = []
    for t in range(count):
        u = rng.random((samples, fields))
        rank = np.minimum(np.floor(np.exp(u * np.log(cards + 1))) - 1, cards - 1)
        keys: npt.NDArray[np.int64] = (base + rank.astype(np.int64)).reshape(-1)
        batches.append(Batch(t, offsets, keys, workers))
    return batches


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def measure(
    workers: int, per_worker: int, count: int, hint: bool, early: int = EARLY_WRITE_BACK_ALL,
    ahead: int = 1,
) -> dict[str, object]:  # fmt: skip
    capacity = int(0.1 * sum(CRITEO_CARDINALITIES))
    data = zipf_batches(count, workers, per_worker, seed=workers)
    # The first pass a job with a keyset knows the answer of: distinct keys of the run.
    expected = int(np.unique(np.concatenate([b.keys for b in data])).shape[0]) if hint else 0
    # Compiles or loads the kernels before the timed scheduler.
    warm = Scheduler(workers, capacity, "herald", early_write_back=early, look_ahead=ahead)
    for batch in zipf_batches(2, workers, per_worker, seed=workers + 1000):
        warm.submit(batch)
    warm.finish()  # plans the batches a look-ahead held
    del warm
    planner = Scheduler(workers, capacity, "herald", expected_keys=expected,
                        early_write_back=early, look_ahead=ahead)  # fmt: skip
    times, floor = [], []
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    for batch in data:
        before = dict(planner.stage_seconds)
        started = time.perf_counter()
        planner.submit(batch)
        times.append(1000 * (time.perf_counter() - started))
        for name in STAGES:
            stages[name].append(1000 * (planner.stage_seconds[name] - before[name]))
        started = time.perf_counter()
        np.unique(batch.keys)
        floor.append(1000 * (time.perf_counter() - started))
    # With look-ahead K the first K - 1 submits only hold their batches: time the rest.
    times, floor = times[ahead - 1 :], floor[ahead - 1 :]
    stages = {name: v[ahead - 1 :] for name, v in stages.items()}
    median = float(np.median(times))
    return {
        "workers": workers,
        "samples_per_worker": per_worker,
        "fields": len(CRITEO_CARDINALITIES),
        "keys_per_batch": int(data[0].keys.shape[0]),
        "cache_rows_per_worker": capacity,
        "expected_keys": expected,
        "mirror_keys": len(planner.mirror.index),
        "mirror_keys_forgotten": planner.mirror.forgotten,
        "batches": count,
        "median_ms": median,
        "p99_ms": percentile(times, 99),
        "max_ms": max(times),
        "np_unique_median_ms": float(np.median(floor)),
        "stage_median_ms": {name: float(np.median(v)) for name, v in stages.items()},
        "ratio_to_np_unique": median / float(np.median(floor)),
    }


def verdict(r: dict[str, object]) -> str:
    target = TARGETS.get((int(r["workers"]), int(r["samples_per_worker"])))  # type: ignore[call-overload]
    if target is None:
        return "-"
    median_max, p99_max = target
    met = float(r["median_ms"]) <= median_max  # type: ignore[arg-type]
    text = f"median <= {median_max:g}"
    if p99_max is not None:
        met = met and float(r["p99_ms"]) <= p99_max  # type: ignore[arg-type]
        text += f", p99 <= {p99_max:g}"
    return f"{text} ({'met' if met else 'NOT met'})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches per shape")
    parser.add_argument("--threads", choices=("auto", "1", "2"), default="auto",
                        help="auto: a batch uses the helper thread when a core is idle (what "
                             "the service does); 2: always; 1: one core")  # fmt: skip
    parser.add_argument("--no-hint", action="store_true",
                        help="do not tell the scheduler the run's distinct-key count")  # fmt: skip
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--early-write-back", type=early_write_back, default=EARLY_WRITE_BACK_ALL,
                        help="the scheduler's setting: all (the default), off or rows")  # fmt: skip
    parser.add_argument("--look-ahead", type=look_ahead, default=1, metavar="K",
                        help="batches the scheduler sees beyond the plan it releases, 1 (the "
                             "default) to 32")  # fmt: skip
    args = parser.parse_args()
    split.FORCE_HELPER = {"auto": None, "1": False, "2": True}[args.threads]
    tune_malloc()  # as every heraldps process does at start (the scheduler service too)
    load_before = os.getloadavg()
    rows = [measure(w, b, quick if args.quick else full, not args.no_hint,
                    args.early_write_back, args.look_ahead)
            for w, b, full, quick in SHAPES]  # fmt: skip
    load_after = os.getloadavg()
    print(
        f"threads {args.threads}, size hint {'no' if args.no_hint else 'yes'}, "
        f"early write-back {args.early_write_back}, look-ahead {args.look_ahead}, "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
        f"({os.cpu_count()} CPUs); warm-up (compile) excluded, every timed batch counted"
    )
    print("| workers x samples | batches | median ms | p99 ms | max ms | np.unique ms | "
          "median / np.unique | target |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['workers']} x {r['samples_per_worker']} | {r['batches']} | "
            f"{r['median_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.2f} | "
            f"{r['np_unique_median_ms']:.2f} | {r['ratio_to_np_unique']:.2f} | {verdict(r)} |"
        )
    print("\nmedian wall ms per stage of a batch (Scheduler.stage_seconds):")
    print("| workers x samples | " + " | ".join(STAGES) + " |")
    print("|---|" + "---:|" * len(STAGES))
    for r in rows:
        medians = r["stage_median_ms"]
        cells = " | ".join(f"{medians[name]:.2f}" for name in STAGES)  # type: ignore[index]
        print(f"| {r['workers']} x {r['samples_per_worker']} | {cells} |")
    machine = {"python": platform.python_version(), "processor": platform.processor(),
               "cpus": os.cpu_count(), "numpy": np.__version__}  # fmt: skip
    run = {"threads": args.threads, "hint": not args.no_hint,
           "early_write_back": args.early_write_back, "look_ahead": args.look_ahead,
           "load_average_before": load_before[0], "load_average_after": load_after[0]}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"machine": machine, "run": run, "results": rows}, indent=2) + "\n"
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
