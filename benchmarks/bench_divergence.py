"""Same model in every mode: how far each mode's final model is from naive's, beside chance.

Run from the repository root::

    python benchmarks/bench_divergence.py --dense-ps       # 36 runs: 35 min on 2 busy cores
    python benchmarks/bench_divergence.py --iterations 30 --optimizers sgd --controls 2

Per optimizer, every mode trains the bundled Criteo sample on its own fresh local
cluster (2 PS shards, the scheduler, 4 worker processes x 128 samples, embedding
dim 8, dense parameters all-reduced, cache 10% of the keys) over the same global
batches; the final model is read back from the PS. Then naive runs again on the
same batches with each batch's samples permuted (``--controls`` seeds): the
shuffled-naive control, the size of a difference in float32 summation order alone.
Printed per optimizer and mode: the largest absolute difference from naive's model
of the embedding rows, their optimizer state and the dense parameters; whether row
versions are equal; and the held-out AUC and logloss. ``--dense-ps`` adds a herald
run with the dense parameters through the PS instead of all-reduced. JSON goes to
``benchmarks/results/bench_divergence.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from heraldps.bundled import bundled_data
from heraldps.data import SparseDataset
from heraldps.data.global_batches import GlobalBatches, InMemoryBatches
from heraldps.job import TrainingJob
from heraldps.modes import ALL_MODES
from heraldps.optim import OPTIMIZERS
from launcher.divergence import ShuffledBatches, model_difference
from launcher.local import ModeResult, run_mode
from scheduler_service.simulate import cache_rows_for

OUTPUT = Path(__file__).resolve().parent / "results" / "bench_divergence.json"


def train(job: TrainingJob, mode: str, batches: GlobalBatches, test: SparseDataset) -> ModeResult:
    with tempfile.TemporaryDirectory(prefix="bench-divergence-") as workdir:
        result = run_mode(job, mode, 2, batches, test, Path(workdir), keep_model=True)
    print(f"{job.optimizer} {mode}: {result.iterations} iterations in {result.seconds:.0f} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return result


def measure(job: TrainingJob, controls: int, dense_ps: bool) -> list[dict[str, object]]:
    """Every mode and the controls against naive, for one optimizer."""
    data, test = job.read(), job.read(str(bundled_data()[1]))
    batches = InMemoryBatches(data, job.global_batch, job.iterations, job.epochs)
    runs: dict[str, ModeResult] = {}
    for mode in ALL_MODES:
        runs[mode] = train(job, mode, batches, test)
    if dense_ps:
        runs["herald, dense via PS"] = train(replace(job, dense_sync="ps"), "herald", batches, test)
    for seed in range(controls):
        shuffled = ShuffledBatches(data, job.global_batch, job.iterations, job.epochs, seed)
        runs[f"naive shuffled #{seed}"] = train(job, "naive", shuffled, test)
    naive = runs["naive"]
    rows = []
    for name, result in runs.items():
        diff = model_difference(result.model, naive.model)
        rows.append({
            "optimizer": job.optimizer, "run": name, "iterations": result.iterations,
            "embeddings": diff.values, "embedding_state": diff.state,
            "dense": diff.dense_values, "dense_state": diff.dense_state,
            "bit_identical": diff.bit_identical, "versions_equal": diff.versions_equal,
            "auc": result.auc, "logloss": result.logloss,
        })  # fmt: skip
    return rows


def print_table(rows: list[dict[str, object]]) -> None:
    head = ("optimizer", "run", "embeddings", "emb. state", "dense", "dense state", "versions",
            "AUC", "logloss")  # fmt: skip
    print("max |x - naive| after the run")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([
            str(r["optimizer"]), str(r["run"]),
            *(f"{r[k]:.2g}" if r[k] else "0" for k in
              ("embeddings", "embedding_state", "dense", "dense_state")),
            "equal" if r["versions_equal"] else "differ",
            f"{r['auc']:.6f}", f"{r['logloss']:.6f}",
        ]))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    parser.add_argument("--controls", type=int, default=5, help="shuffled-naive seeds")
    parser.add_argument("--dense-ps", action="store_true")
    args = parser.parse_args()
    train_file, _ = bundled_data()
    rows: list[dict[str, object]] = []
    for optimizer in args.optimizers:
        job = TrainingJob(
            data=str(train_file), workers=4, batch_size_per_worker=128, iterations=args.iterations,
            epochs=1000, optimizer=optimizer, embedding_dim=8,
        )  # fmt: skip
        job = replace(job, cache_rows=cache_rows_for(job.read(), 0.1))
        rows += measure(job, args.controls, args.dense_ps)
    print_table(rows)
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
        "iterations": args.iterations, "controls": args.controls, "rows": rows,
    }, indent=2) + "\n")  # fmt: skip
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
