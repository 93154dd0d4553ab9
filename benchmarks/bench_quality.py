"""A published result, reproduced: ``heraldps train`` on Frappe_x1 beside BARS's DeepFM figures.

Run from the repository root (not CI; about an hour on 2 busy cores; needs the ``torch`` extra
for the baseline and ``../shared/data/frappe_x1``)::

    nice -n 10 python benchmarks/bench_quality.py
    nice -n 10 python benchmarks/bench_quality.py --quick          # 2 epochs: a smoke check
    nice -n 10 python benchmarks/bench_quality.py --dataset avazu --skip-torch

Frappe (default job ``examples/jobs/frappe_bars.yaml``, BARS's configuration):

1. quality: ``heraldps train`` in mode herald, 4 workers, 2 shards, ``--seeds`` seeds; then
   naive with the first seed. Printed beside BARS (test AUC 0.98395 +- 0.00016, logloss
   0.1495): test AUC and logloss (mean, spread), epochs, wall time, samples/s, and the rows
   moved relative to naive's.
2. same model: herald vs naive for the same seed (test AUC difference; the largest absolute
   difference of the two exported models where both runs exported one), beside the
   shuffled-naive control of launcher/divergence.py: naive, herald and naive with each batch's
   samples permuted, ``--control-iterations`` iterations of the same model without dropout on a
   fresh local cluster each (a short run: the control measures float32 summation order).
3. speed: ``heraldps train`` with 1 worker x the job's global batch and 1 shard against the
   single-process PyTorch DeepFM of benchmarks/torch_deepfm.py (same data, shape, batch and
   optimizer), in the same run; then 2 and 4 workers. Target: >= 0.5x the torch samples/s.

``--dataset criteo`` / ``avazu`` run the same command on the bundled Criteo sample or
``../shared/data/avazu_head9k`` (their job files in examples/jobs/; no published target, no
torch baseline). The ``heraldps train`` interface the bench relies on (its flags, the fields of
``OUT/report.json``) is in two functions, :func:`train_command` and :func:`read_report`.
JSON goes to ``--out`` (default ``benchmarks/results/bench_quality.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from heraldps.data.global_batches import InMemoryBatches
from heraldps.job import TrainingJob
from heraldps.model_export import read_model
from launcher.divergence import ShuffledBatches, model_difference
from launcher.local import run_mode
from scheduler_service.simulate import cache_rows_for

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
OUTPUT = ROOT / "benchmarks" / "results" / "bench_quality.json"
JOBS = {
    "frappe": ROOT / "examples" / "jobs" / "frappe_bars.yaml",
    "criteo": ROOT / "examples" / "jobs" / "criteo_sample.yaml",
    "avazu": ROOT / "examples" / "jobs" / "avazu_head9k.yaml",
}
BARS = {"test_auc": 0.98395, "test_auc_std": 0.00016, "test_logloss": 0.1495}
FRAPPE_FIELDS = ("user", "item", "daytime", "weekday", "isweekend", "homework", "cost",
                 "weather", "country", "city")  # fmt: skip


# ----- the `heraldps train` interface ---------------------------------------------------------


@dataclass(frozen=True)
class TrainRun:
    """What one ``heraldps train`` run reports (OUT/report.json)."""

    mode: str
    seed: int
    workers: int
    shards: int
    global_batch: int
    test_auc: float
    test_logloss: float
    best_epoch: int
    epochs: int
    seconds: float  # the whole run
    samples_per_second: float  # training only: samples over the epochs' training seconds
    rows_moved: int  # embedding rows pulled, pushed, written back and flushed at the end
    export_dir: str | None  # the best epoch's exported model, if the run wrote one
    per_epoch: list[dict[str, Any]] = field(default_factory=list)


def train_command(
    job: Path, out: Path, mode: str, workers: int, shards: int, seed: int,
    batch_size_per_worker: int | None, max_epochs: int | None,
) -> list[str]:  # fmt: skip
    """The command line of one run (``python -m launcher`` is the ``heraldps`` entry point)."""
    cmd = [sys.executable, "-m", "launcher", "train", "--job", str(job), "--mode", mode,
           "--workers", str(workers), "--shards", str(shards), "--seed", str(seed),
           "--out", str(out)]  # fmt: skip
    if batch_size_per_worker is not None:
        cmd += ["--batch-size-per-worker", str(batch_size_per_worker)]
    if max_epochs is not None:
        cmd += ["--max-epochs", str(max_epochs)]
    return cmd


#: The traffic counts (heraldps.traffic.REPORTED) that are embedding rows moved.
MOVED = ("pulls", "grad_pushes", "write_backs", "final_flush")


def read_report(path: Path) -> TrainRun:
    """A run's ``report.json`` (launcher/train.py writes it), read into a :class:`TrainRun`:
    the only place that knows the report's field names."""
    r = json.loads(Path(path).read_text())
    job, cluster, epochs = r["job"], r["cluster"], r["epochs"]
    train_seconds = sum(e["seconds"] for e in epochs)
    trained = sum(e["samples_per_second"] * e["seconds"] for e in epochs)
    return TrainRun(
        mode=str(cluster["mode"]),
        seed=int(job["seed"]),
        workers=int(job["workers"]),
        shards=int(cluster["shards"]),
        global_batch=int(job["workers"]) * int(job["batch_size_per_worker"]),
        test_auc=float(r["test_auc"]),
        test_logloss=float(r["test_logloss"]),
        best_epoch=int(r["best_epoch"]),
        epochs=len(epochs),
        seconds=float(r["seconds"]),
        samples_per_second=trained / train_seconds if train_seconds > 0 else 0.0,
        rows_moved=sum(int(r["traffic"].get(k, 0)) for k in MOVED),
        export_dir=r.get("best_model"),
        per_epoch=list(epochs),
    )


def train(
    job: Path, workdir: Path, mode: str, workers: int, shards: int, seed: int,
    max_epochs: int | None, global_batch: int | None = None,
) -> TrainRun:  # fmt: skip
    """Run ``heraldps train`` once (its output streams through) and read its report.
    ``global_batch``: split it over ``workers`` (else the job's batch per worker)."""
    out = workdir / f"{mode}-w{workers}-s{shards}-seed{seed}"
    per_worker = None if global_batch is None else global_batch // workers
    cmd = train_command(job, out, mode, workers, shards, seed, per_worker, max_epochs)
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return read_report(out / "report.json")


# ----- comparisons ------------------------------------------------------------------------------


def exported_difference(dir_a: str, dir_b: str) -> dict[str, float]:
    """Largest absolute differences between two exported models: the embedding rows (key by
    key, every table) and the dense vector; inf where the tables hold different keys."""
    a, b = read_model(dir_a), read_model(dir_b)
    dense = float(np.max(np.abs(a.dense.astype(np.float64) - b.dense.astype(np.float64))))
    rows = 0.0
    for name, ta in a.tables.items():
        tb = b.tables.get(name)
        if tb is None or not np.array_equal(ta.keys, tb.keys):
            return {"embeddings": float("inf"), "dense": dense}
        diff = np.abs(ta.values.astype(np.float64) - tb.values.astype(np.float64))
        rows = max(rows, float(diff.max(initial=0.0)))
    return {"embeddings": rows, "dense": dense}


def control_rows(iterations: int, seed: int, workdir: Path) -> list[dict[str, Any]]:
    """naive, herald and shuffled naive on Frappe over ``iterations`` iterations of the BARS
    model shape, 4 workers x 1024, 2 shards; each model's largest difference from naive's
    (launcher/divergence.py). Without batch norm (``TrainingJob`` has no such field yet) and
    without dropout: a sample's mask follows its index in the global batch, so permuting a
    batch's samples would change the masks, not only the summation order."""
    job = TrainingJob(
        data=str(SHARED / "frappe_x1" / "train.csv"), format="csv",
        sparse_columns=FRAPPE_FIELDS, label_column="label", workers=4,
        batch_size_per_worker=1024, iterations=iterations, epochs=1000, optimizer="adam",
        lr=1e-3, embedding_l2=0.05, embedding_dim=10, hidden=(400, 400, 400), dropout=0.0,
        seed=seed,
    )  # fmt: skip
    data = job.read()
    test = job.read(str(SHARED / "frappe_x1" / "test.csv"))
    job = replace(job, cache_rows=cache_rows_for(data, 1.0))  # Frappe: 5,382 keys
    batches = InMemoryBatches(data, job.global_batch, job.iterations, job.epochs)
    shuffled = ShuffledBatches(data, job.global_batch, job.iterations, job.epochs, 0)
    runs = {}
    for name, mode, b in (("naive", "naive", batches), ("herald", "herald", batches),
                          ("naive shuffled", "naive", shuffled)):  # fmt: skip
        runs[name] = run_mode(job, mode, 2, b, test, workdir / f"control-{name}",
                              keep_model=True)  # fmt: skip
    naive = runs["naive"]
    rows = []
    for name, r in runs.items():
        diff = model_difference(r.model, naive.model)
        rows.append({"run": name, "iterations": r.iterations, "auc": r.auc,
                     "embeddings": diff.values, "dense": diff.dense_values,
                     "max_abs_vs_naive": diff.largest})  # fmt: skip
    return rows


def torch_baseline(seed: int, quick: bool) -> dict[str, Any]:
    """The PyTorch DeepFM of BARS's configuration on Frappe, single process, 2 threads."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch_deepfm

    cfg = torch_deepfm.TorchConfig(seed=seed, max_epochs=2 if quick else 100)
    result = torch_deepfm.run(SHARED / "frappe_x1", cfg, log=lambda s: print(s, file=sys.stderr))
    return asdict(result)


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def quality_table(runs: list[TrainRun], naive: TrainRun | None, bars: bool) -> list[str]:
    """Markdown rows: BARS, herald (mean +- std over seeds), each seed, naive."""
    lines = [
        "| run | test AUC | test logloss | epochs (best) | wall s | samples/s | rows vs naive |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    if bars:
        lines.append(
            f"| BARS DeepFM (5 runs, P100) | {BARS['test_auc']:.5f} +- "
            f"{BARS['test_auc_std']:.5f} | {BARS['test_logloss']:.4f} | 15 (13) | | | |"
        )

    def vs(run: TrainRun) -> str:
        return f"{run.rows_moved / naive.rows_moved:.2f}" if naive and naive.rows_moved else ""

    if runs:
        aucs, lls = [r.test_auc for r in runs], [r.test_logloss for r in runs]
        lines.append(
            f"| {runs[0].mode}, {len(runs)} seeds, mean | {statistics.mean(aucs):.5f} +- "
            f"{spread(aucs):.5f} | {statistics.mean(lls):.4f} +- {spread(lls):.4f} | "
            f"{statistics.mean(r.epochs for r in runs):.1f} | "
            f"{statistics.mean(r.seconds for r in runs):.0f} | "
            f"{statistics.mean(r.samples_per_second for r in runs):,.0f} | |"
        )
    for r in [*runs, *([naive] if naive else [])]:
        lines.append(f"| {r.mode} seed {r.seed} ({r.workers} workers, {r.shards} shards) | "
                     f"{r.test_auc:.5f} | {r.test_logloss:.4f} | {r.epochs} ({r.best_epoch}) | "
                     f"{r.seconds:.0f} | {r.samples_per_second:,.0f} | {vs(r)} |")  # fmt: skip
    return lines


def speed_table(torch_sps: float | None, runs: list[TrainRun]) -> list[str]:
    lines = ["| trainer | samples/s | vs torch |", "|---|---:|---:|"]
    if torch_sps:
        lines.append(f"| PyTorch DeepFM, 1 process, 2 threads | {torch_sps:,.0f} | 1.00 |")
    for r in runs:
        ratio = f"{r.samples_per_second / torch_sps:.2f}" if torch_sps else ""
        lines.append(f"| heraldps train {r.mode}, {r.workers} worker(s), {r.shards} shard(s) | "
                     f"{r.samples_per_second:,.0f} | {ratio} |")  # fmt: skip
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=sorted(JOBS), default="frappe")
    p.add_argument("--job", type=Path, help="job file (default: the dataset's in examples/jobs)")
    p.add_argument("--seeds", type=int, default=3, help="herald seeds (naive runs the first)")
    p.add_argument("--quick", action="store_true", help="2 epochs per run: a smoke check")
    p.add_argument("--skip-torch", action="store_true", help="no PyTorch baseline")
    p.add_argument("--skip-speed", action="store_true", help="no 1/2/4-worker speed runs")
    p.add_argument("--control-iterations", type=int, default=150,
                   help="length of the shuffled-naive control runs (0: none)")  # fmt: skip
    p.add_argument("--out", type=Path, default=OUTPUT)
    args = p.parse_args()
    job = args.job or JOBS[args.dataset]
    if not job.exists():
        p.error(f"{job} does not exist; give --job (examples/jobs/ holds the shipped jobs)")
    max_epochs = 2 if args.quick else None
    frappe = args.dataset == "frappe"
    started = time.perf_counter()
    results: dict[str, Any] = {"job": str(job), "dataset": args.dataset, "quick": args.quick,
                               "load_average_start": os.getloadavg()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        workdir = Path(tmp)
        herald = [train(job, workdir, "herald", 4, 2, seed, max_epochs)
                  for seed in range(args.seeds)]  # fmt: skip
        naive = train(job, workdir, "naive", 4, 2, 0, max_epochs)
        lines = quality_table(herald, naive, bars=frappe)
        same = {"auc_difference": herald[0].test_auc - naive.test_auc, "max_abs_model": None}
        if herald[0].export_dir and naive.export_dir:
            same["max_abs_model"] = exported_difference(herald[0].export_dir, naive.export_dir)
        controls = (control_rows(args.control_iterations, 0, workdir)
                    if frappe and args.control_iterations else [])  # fmt: skip
        torch_result = None
        speed: list[TrainRun] = []
        if frappe and not args.skip_torch:
            torch_result = torch_baseline(0, args.quick)
        if not args.skip_speed:
            batch = herald[0].global_batch  # the job's: 4096 for BARS
            speed = [train(job, workdir, "herald", w, 1, 0, max_epochs, batch) for w in (1, 2, 4)]
    print("\n".join(lines))
    print(f"\nherald vs naive, seed 0: test AUC difference {same['auc_difference']:+.2e}, "
          f"largest difference of the exported models {same['max_abs_model']}")  # fmt: skip
    if controls:
        print(f"control ({args.control_iterations} iterations, 4 workers x 1024, 2 shards):")
        for c in controls:
            print(f"  {c['run']}: max |x - naive| embeddings {c['embeddings']:.2g}, dense "
                  f"{c['dense']:.2g} (with optimizer state {c['max_abs_vs_naive']:.2g}), "
                  f"AUC {c['auc']:.6f}")  # fmt: skip
    torch_sps = torch_result["train_samples_per_s"] if torch_result else None
    if torch_result:
        print(f"\ntorch baseline: test AUC {torch_result['test_auc']:.5f} logloss "
              f"{torch_result['test_logloss']:.4f}, {torch_result['epochs']} epochs")  # fmt: skip
    if speed or torch_sps:
        print("\n".join(["", *speed_table(torch_sps, speed)]))
    results.update({
        "bars": BARS if frappe else None, "herald": [asdict(r) for r in herald],
        "naive": asdict(naive), "same_model": same, "controls": controls,
        "torch": torch_result, "speed": [asdict(r) for r in speed],
        "seconds": time.perf_counter() - started, "load_average_end": os.getloadavg(),
        "machine": {"python": platform.python_version(), "numpy": np.__version__,
                    "cpus": os.cpu_count()},
    })  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
