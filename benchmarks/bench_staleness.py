"""HET's staleness bound against quality: s in {0, 1, 2} x SGD, AdaGrad, Adam, two datasets.

Run from the repository root (needs ``../shared/data`` for the Avazu sample)::

    python benchmarks/bench_staleness.py            # about 5 minutes on 2 cores (3 epochs)
    python benchmarks/bench_staleness.py --epochs 1 --optimizers adam

Every cell trains HET mode on its own fresh local cluster (2 PS shards, the
scheduler, 4 worker processes x 128 samples, embedding dim 8, cache 10% of the
training keys per worker, LRU) over the same global batches, then evaluates
the PS's model on held-out rows (the bundled sample's ``test.tsv``, Avazu's
``test.csv``). The baseline of each (data, optimizer) pair is s = 0, measured in
the same run: exactly synchronous training. Reported per cell: final held-out
logloss and AUC, the logloss ratio to s = 0, embedding rows and payload bytes
moved (pulls, gradient pushes, final flush) and their ratios to s = 0, and how
far the PS's optimizer state drifted from s = 0's over the rows trained: Adam's
per-row step counts (mean and largest gap, s = 0 minus s), AdaGrad's summed
accumulator growth as a ratio to s = 0's. JSON goes to
``benchmarks/results/bench_staleness.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from bench_local import datasets  # run as a script, this folder is on the path

from heraldps.data import SparseDataset
from heraldps.job import TrainingJob
from heraldps.modes import HET_MODE
from heraldps.optim import OPTIMIZERS
from launcher.local import ModeResult, run_mode
from scheduler_service.simulate import cache_rows_for

OUTPUT = Path(__file__).resolve().parent / "results" / "bench_staleness.json"


def train_het(job: TrainingJob, train: SparseDataset, test: SparseDataset) -> ModeResult:
    """HET mode on a fresh local cluster, keeping the final rows and state."""
    with tempfile.TemporaryDirectory(prefix="bench-staleness-") as workdir:
        return run_mode(job, HET_MODE, 2, train, test, Path(workdir), keep_model=True)


def state_drift(job: TrainingJob, result: ModeResult, base: ModeResult) -> dict[str, float]:
    """How far the PS's per-row optimizer state is from s = 0's (same keys, same order)."""
    state, base_state, dim = result.model["state"], base.model["state"], job.embedding_dim
    if job.optimizer == "adam":
        behind = base_state[:, 2 * dim] - state[:, 2 * dim]
        return {"adam_steps_behind_mean": float(behind.mean()),
                "adam_steps_behind_max": float(np.abs(behind).max())}  # fmt: skip
    if job.optimizer == "adagrad":
        start = job.make_optimizer().init_state(1, dim)[0, 0]
        grown, base_grown = (state - start).sum(), (base_state - start).sum()
        return {"adagrad_accumulator_vs_s0": float(grown / base_grown)}
    return {}


def cell(name: str, job: TrainingJob, result: ModeResult, base: ModeResult) -> dict[str, object]:
    r, b = result.report(), base.report()
    return {
        "data": name,
        "optimizer": job.optimizer,
        "staleness": job.staleness,
        "iterations": r["iterations"],
        "logloss": result.logloss,
        "auc": result.auc,
        "logloss_vs_s0": result.logloss / base.logloss,
        "auc_minus_s0": result.auc - base.auc,
        "rows_moved": r["moved_with_flush"],
        "rows_vs_s0": r["moved_with_flush"] / max(b["moved_with_flush"], 1),
        "bytes_moved": r["bytes_moved_with_flush"],
        "bytes_vs_s0": r["bytes_moved_with_flush"] / max(b["bytes_moved_with_flush"], 1),
        "seconds": result.seconds,
        **state_drift(job, result, base),
    }


def drift_text(r: dict[str, object]) -> str:
    if "adam_steps_behind_mean" in r:
        return (f"Adam steps behind: mean {r['adam_steps_behind_mean']:.2f}, "
                f"largest {r['adam_steps_behind_max']:.0f}")  # fmt: skip
    if "adagrad_accumulator_vs_s0" in r:
        return f"AdaGrad accumulator growth {r['adagrad_accumulator_vs_s0']:.2f}x"
    return "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training data")
    parser.add_argument("--staleness", default="0,1,2", help="bounds to run; 0 is the baseline")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    bounds = sorted({0, *(int(s) for s in args.staleness.split(","))})
    optimizers = args.optimizers.split(",")
    rows = []
    started = time.perf_counter()
    for name, fmt, train_path, test_path in datasets():
        base_job = TrainingJob(data=str(train_path), format=fmt, workers=4,
                               batch_size_per_worker=128, epochs=args.epochs)  # fmt: skip
        train, test = base_job.read(), base_job.read(str(test_path))
        base_job = replace(base_job, cache_rows=cache_rows_for(train, 0.1))
        for optimizer in optimizers:
            jobs = {s: replace(base_job, optimizer=optimizer, staleness=s) for s in bounds}
            results = {s: train_het(job, train, test) for s, job in jobs.items()}
            rows += [cell(name, jobs[s], results[s], results[0]) for s in bounds]
            for r in rows[-len(bounds) :]:
                print(f"  {r['data']} {r['optimizer']} s={r['staleness']}: "
                      f"logloss {r['logloss']:.4f} AUC {r['auc']:.4f}", flush=True)  # fmt: skip
    print(f"\n{args.epochs} epochs per cell; 4 workers x 128, 2 shards, dim 8, cache 10%\n")
    print("| data | optimizer | s | iterations | eval logloss | vs s=0 | AUC | AUC - s=0 | "
          "rows moved | rows vs s=0 | bytes vs s=0 | optimizer state vs s=0 |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['data']} | {r['optimizer']} | {r['staleness']} | {r['iterations']} | "
            f"{r['logloss']:.4f} | {r['logloss_vs_s0']:.4f} | {r['auc']:.4f} | "
            f"{r['auc_minus_s0']:+.4f} | {r['rows_moved']:,} | {r['rows_vs_s0']:.2f} | "
            f"{r['bytes_vs_s0']:.2f} | {drift_text(r)} |"
        )
    total = time.perf_counter() - started
    print(f"\ntotal {total:.0f} s")
    machine = {"python": platform.python_version(), "numpy": np.__version__,
               "processor": platform.processor(), "cpus": os.cpu_count()}  # fmt: skip
    settings = {"epochs": args.epochs, "workers": 4, "batch_size_per_worker": 128, "shards": 2,
                "embedding_dim": 8, "cache_fraction": 0.1, "policy": "lru"}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine, "settings": settings, "seconds": total, "results": rows}
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
