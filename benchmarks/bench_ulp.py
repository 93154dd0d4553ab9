"""How far one float32 rounding carries over a training run: the recipe's own noise floor.

Run from the repository root (Frappe_x1 beside the checkout, as the job file expects)::

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_ulp.py            # 150 iterations, ~3 min
    python benchmarks/bench_ulp.py --job examples/jobs/frappe_bars.yaml --at 10 --every 25

Two single-process trainers (``worker_client.reference.ReferenceTrainer``: the model every
mode must train) run the job's global batches in file order, identical except that at
iteration ``--at`` one dense weight of the second is moved by one ulp: the size of one
difference in float32 summation order, which is all that separates naive from herald (they
add the same per-sample terms, grouped by different workers). Printed every ``--every``
iterations: how many dense values differ, the largest differences of the embedding rows and
of the dense parameters, and the validation AUC of both. A target on the AUC difference
between two modes below what this prints cannot be met by any partition of the samples that
sums in a different order (docs/figures.md, "One ulp").
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from heraldps.data import SparseDataset, read_all
from heraldps.job_file import load
from worker_client.evaluation import auc
from worker_client.minibatch import MiniBatch, select
from worker_client.reference import ReferenceTrainer

ROOT = Path(__file__).resolve().parent.parent


def valid_auc(trainer: ReferenceTrainer, valid: MiniBatch, labels: np.ndarray) -> float:
    """AUC of ``trainer``'s model on the validation rows (running statistics, no dropout)."""
    emb, _, _ = trainer.rows_of(valid.keys)
    dense = trainer.dense_param.from_rows(trainer.dense_rows)
    scores = trainer.model.predict(dense, emb, valid.field_rows, valid.dense)
    return auc(labels, np.asarray(scores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, default=ROOT / "examples/jobs/frappe_bars.yaml")
    parser.add_argument("--at", type=int, default=10, help="iteration of the one-ulp change")
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--every", type=int, default=25)
    args = parser.parse_args()
    job_file = load(args.job)
    job = job_file.job
    if job_file.splits.valid is None:
        raise SystemExit(f"{args.job}: the job names no validation file (data.valid)")
    train: SparseDataset = read_all(job.data_spec())
    valid = read_all(job.data_spec(job_file.splits.valid))
    valid_rows = select(valid)
    a, b = ReferenceTrainer(job), ReferenceTrainer(job)
    per_epoch = train.rows // job.global_batch
    print(f"{args.job.name}: global batch {job.global_batch}, one ulp on one dense weight at "
          f"iteration {args.at}; load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    print(
        "| after iteration | dense values differ | max emb diff | max dense diff "
        "| valid AUC a | valid AUC b | AUC diff |\n|---:|---:|---:|---:|---:|---:|---:|"
    )
    started = time.monotonic()
    for t in range(args.iterations):
        start = (t % per_epoch) * job.global_batch
        batch = train.row_slice(start, start + job.global_batch)
        if t == args.at:  # one weight a third of the way into the vector: a hidden layer's
            flat = b.dense_rows.reshape(-1)
            i = flat.size // 3
            flat[i] = np.nextafter(flat[i], np.float32(np.inf))
        a.step(batch, t)
        b.step(batch, t)
        if (t + 1) % args.every == 0 or t == args.at:
            differ = int(np.count_nonzero(a.dense_rows != b.dense_rows))
            emb = float(np.max(np.abs(a.values - b.values))) if a.values.size else 0.0
            dense = float(np.max(np.abs(a.dense_rows - b.dense_rows)))
            va, vb = (valid_auc(x, valid_rows, valid.labels) for x in (a, b))
            print(f"| {t + 1} | {differ:,} | {emb:.2g} | {dense:.2g} | {va:.6f} | {vb:.6f} "
                  f"| {abs(va - vb):.1e} |", flush=True)  # fmt: skip
    print(f"{time.monotonic() - started:.0f} s; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
