"""End-to-end training speed and traffic: naive vs herald vs het on real local clusters.

Run from the repository root (needs ``../shared/data`` for the Avazu sample)::

    python benchmarks/bench_local.py            # ~3 minutes on 2 cores
    python benchmarks/bench_local.py --quick

Each dataset trains every mode on its own fresh cluster (2 PS shards, the
scheduler, 4 worker processes, all on 127.0.0.1) over the same global
batches: 4 workers x 128 samples, AdaGrad, embedding dim 8, cache 10% of the
training keys per worker. The baseline is naive (sequential partition,
every update written back each iteration), measured in the same run.
Reported per mode: the median iteration time (slowest worker, plan received
-> report sent), samples/s from the first commit on, embedding rows and
payload bytes moved (pulls, gradient pushes + write-backs), ratios to naive,
and held-out AUC. JSON goes to ``benchmarks/results/bench_local.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from heraldps.bundled import bundled_data
from heraldps.job import TrainingJob
from launcher.local import ModeResult, run_local
from scheduler_service.simulate import cache_rows_for

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
OUTPUT = Path(__file__).resolve().parent / "results" / "bench_local.json"
MODES = ["naive", "herald", "het"]


def datasets() -> list[tuple[str, str, Path, Path]]:
    train, test = bundled_data()
    out = [("criteo (bundled)", "criteo", train, test)]
    avazu = SHARED / "avazu_head9k"
    if (avazu / "train.csv").exists():
        out.append(("avazu head9k", "avazu", avazu / "train.csv", avazu / "test.csv"))
    return out


def row(name: str, result: ModeResult, base: ModeResult) -> dict[str, object]:
    r, b = result.report(), base.report()
    moved = r["pulls"] + r["pushes"]
    base_moved = b["pulls"] + b["pushes"]
    seconds = [it["seconds"] for it in result.per_iteration[1:]] or [float("nan")]
    return {
        "data": name,
        "mode": result.mode,
        "iteration_ms": 1000 * statistics.median(seconds),
        "samples_per_second": result.samples_per_second,
        "rows_moved": moved,
        "bytes_moved": r["bytes_pulled"] + r["bytes_pushed"],
        "rows_vs_naive": moved / base_moved if base_moved else float("nan"),
        "bytes_vs_naive": (r["bytes_pulled"] + r["bytes_pushed"])
        / max(b["bytes_pulled"] + b["bytes_pushed"], 1),
        "final_flush": r["final_flush"],
        "auc": result.auc,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one epoch per dataset")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    rows = []
    for name, fmt, train_path, test_path in datasets():
        job = TrainingJob(data=str(train_path), format=fmt, workers=4, batch_size_per_worker=128,
                          epochs=1 if args.quick else 3)  # fmt: skip
        train, test = job.read(), job.read(str(test_path))
        job = replace(job, cache_rows=cache_rows_for(train, 0.1))
        results = run_local(job, MODES, 2, train, test)
        rows += [row(name, results[m], results["naive"]) for m in MODES]
    print("| data | mode | iteration ms (median) | samples/s | rows moved | MiB moved | "
          "rows vs naive | bytes vs naive | final flush | AUC |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['data']} | {r['mode']} | {r['iteration_ms']:.1f} | "
            f"{r['samples_per_second']:,.0f} | {r['rows_moved']:,} | "
            f"{r['bytes_moved'] / 2**20:.1f} | {r['rows_vs_naive']:.2f} | "  # type: ignore[operator]
            f"{r['bytes_vs_naive']:.2f} | {r['final_flush']:,} | {r['auc']:.4f} |"
        )
    machine = {"python": platform.python_version(), "numpy": np.__version__,
               "processor": platform.processor(), "cpus": os.cpu_count()}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": machine, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
