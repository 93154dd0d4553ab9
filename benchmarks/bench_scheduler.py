"""Scheduler speed: partition + plan per global batch, fast core vs the plain reference.

Run from the repository root::

    python benchmarks/bench_scheduler.py           # ~1-2 minutes on 2 cores
    python benchmarks/bench_scheduler.py --quick

Batches of W workers x B samples x 26 categorical fields, each field drawn
from a Zipf(1)-like distribution (log-uniform rank) over Criteo Kaggle's
published per-field cardinalities (``shared/data/CARDINALITIES.md``, 33.76M
keys in all); cache = 10% of that vocabulary per worker; mode ``herald``
(location-aware partition + on-demand sync), one core. Reported: median ms
per batch of ``Scheduler.submit`` after warm-up, and the reference
implementation's median on the same first batches with the speed-up (same
run). Target (8 x 128): median <= 2 ms. JSON goes to
``benchmarks/results/bench_scheduler.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from scheduler_service.batch import Batch
from scheduler_service.reference import ReferenceScheduler
from scheduler_service.scheduler import Scheduler

CRITEO_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
OUTPUT = Path(__file__).resolve().parent / "results" / "bench_scheduler.json"


def zipf_batches(count: int, workers: int, per_worker: int, seed: int) -> list[Batch]:
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


def time_submits(scheduler: Scheduler | ReferenceScheduler, batches: list[Batch]) -> list[float]:
    times = []
    for batch in batches:
        started = time.perf_counter()
        scheduler.submit(batch)
        times.append(1000 * (time.perf_counter() - started))
    return times


def measure(workers: int, per_worker: int, batches: int, ref_batches: int) -> dict[str, object]:
    capacity = int(0.1 * sum(CRITEO_CARDINALITIES))
    data = zipf_batches(batches, workers, per_worker, seed=workers)
    Scheduler(workers, capacity, "herald").submit(data[0])  # compile (cached on disk after)
    fast = time_submits(Scheduler(workers, capacity, "herald"), data)
    warm = fast[min(20, batches // 4) :]
    result: dict[str, object] = {
        "workers": workers,
        "samples_per_worker": per_worker,
        "fields": len(CRITEO_CARDINALITIES),
        "cache_rows_per_worker": capacity,
        "batches": batches,
        "fast_median_ms": statistics.median(warm),
        "fast_p90_ms": float(np.percentile(warm, 90)),
    }
    if ref_batches:
        ref = time_submits(
            ReferenceScheduler.for_mode(workers, capacity, "herald"),
            data[:ref_batches],
        )
        result["reference_batches"] = ref_batches
        result["reference_median_ms"] = statistics.median(ref)
        result["fast_median_ms_same_batches"] = statistics.median(fast[:ref_batches])
        result["speedup"] = statistics.median(ref) / statistics.median(fast[:ref_batches])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    configs = [(8, 128, 60 if args.quick else 400, 5 if args.quick else 20),
               (64, 512, 6 if args.quick else 40, 1 if args.quick else 2)]  # fmt: skip
    rows = [measure(*config) for config in configs]
    print("| workers x samples | fast median ms | fast p90 ms | reference ms | speed-up | target |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        target = "<= 2 ms" if (r["workers"], r["samples_per_worker"]) == (8, 128) else "-"
        print(
            f"| {r['workers']} x {r['samples_per_worker']} | {r['fast_median_ms']:.2f} | "
            f"{r['fast_p90_ms']:.2f} | {r.get('reference_median_ms', float('nan')):.1f} | "
            f"{r.get('speedup', float('nan')):.0f}x | {target} |"
        )
    machine = {"python": platform.python_version(), "processor": platform.processor(),
               "numpy": np.__version__}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": machine, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
