"""What checkpoints and resuming cost: a run without checkpoints (the baseline), the same
run checkpointing every N iterations, and one whose worker is killed mid-run and resumed.

Run from the repository root (about 2 minutes on 2 cores; a warm-up run first)::

    python benchmarks/bench_resume.py
    python benchmarks/bench_resume.py --iterations 40 --every 5

Mode herald (on-demand sync: rows stay dirty in worker caches, so a checkpoint also
writes them back), 2 PS shards, the scheduler and 4 worker processes on 127.0.0.1,
4 x 128 samples of the bundled Criteo sample, AdaGrad, embedding dim 8, cache 10% of
the training keys per worker. Reported: wall seconds and steady samples/s of each run
(ratios to the baseline, measured in the same run), the median seconds of one checkpoint
(snapshot of every shard, manifest, pruning: the scheduler's own measure in each
manifest), and the seconds from the failure seen by the launcher to the first commit
after the resume. JSON goes to ``benchmarks/results/bench_resume.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import grpc

from heraldps import checkpoints
from heraldps.bundled import bundled_data
from heraldps.job import TrainingJob
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from launcher.local import ModeResult, Recovery, run_mode
from scheduler_service.simulate import cache_rows_for

OUTPUT = Path(__file__).resolve().parent / "results" / "bench_resume.json"


def kill_worker_at(workdir: Path, iteration: int) -> None:
    """SIGKILL worker-1 once the scheduler has committed ``iteration``."""
    while True:
        try:
            port = (workdir / "scheduler.port").read_text().split()[0]
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=1)
            if status.committed_iteration >= iteration:
                os.kill(int((workdir / "worker-1.pid").read_text()), signal.SIGKILL)
                return
        except (OSError, IndexError, grpc.RpcError):
            pass
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N iterations")
    args = parser.parse_args()
    train_path, _ = bundled_data()
    job = TrainingJob(data=str(train_path), iterations=args.iterations, epochs=100)
    train = job.read()
    job = replace(job, cache_rows=cache_rows_for(train, 0.1))
    runs: dict[str, tuple[ModeResult, float, Path]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as scratch:
        # A warm-up run first (compile caches, page cache), not reported.
        run_mode(job, "herald", 2, train, None, Path(scratch) / "warm-up")
        plans = {
            "baseline": Recovery(),
            f"checkpoint every {args.every}": Recovery(checkpoint_every=args.every),
            "checkpoint every 1": Recovery(checkpoint_every=1),
            "killed + resumed": Recovery(checkpoint_every=args.every, max_restarts=1),
        }
        for name, recovery in plans.items():
            workdir = Path(scratch) / name.replace(" ", "-")
            if recovery.max_restarts:
                workdir.mkdir(parents=True)
                at = args.iterations // 2 + args.every // 2
                threading.Thread(target=kill_worker_at, args=(workdir, at), daemon=True).start()
            started = time.perf_counter()
            result = run_mode(job, "herald", 2, train, None, workdir, recovery=recovery)
            runs[name] = (result, time.perf_counter() - started, workdir)
        rows = []
        base_seconds = runs["baseline"][1]
        base_rate = runs["baseline"][0].samples_per_second
        for name, (result, seconds, workdir) in runs.items():
            found = checkpoints.complete(workdir / "checkpoints")
            cost = [m.seconds for _, m in found]
            resume = [r.seconds_to_resume for r in result.restarts]
            rows.append({
                "run": name,
                "seconds": seconds,
                "vs_baseline": seconds / base_seconds,
                "samples_per_second": result.samples_per_second,
                "rate_vs_baseline": result.samples_per_second / base_rate,
                "iteration_ms_median": 1000 * result.report()["iteration_seconds_median"],
                "checkpoint_seconds_median": statistics.median(cost) if cost else None,
                "checkpoint_rows": found[-1][1].rows if found else None,
                "resumed_at": [r.resumed_at for r in result.restarts],
                "seconds_to_resume": resume,
            })  # fmt: skip
    print(f"herald, {args.iterations} iterations, 4 workers x 128, 2 shards, "
          f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})\n")  # fmt: skip
    print("| run | wall s | vs baseline | samples/s | vs baseline | median iteration ms "
          "| one checkpoint s | resume s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ckpt = r["checkpoint_seconds_median"]
        resume = ", ".join(f"{s:.1f}" for s in r["seconds_to_resume"]) or "-"  # type: ignore[attr-defined]
        print(f"| {r['run']} | {r['seconds']:.1f} | {r['vs_baseline']:.2f} | "
              f"{r['samples_per_second']:,.0f} | {r['rate_vs_baseline']:.2f} | "
              f"{r['iteration_ms_median']:.0f} | "
              f"{'-' if ckpt is None else f'{ckpt:.3f}'} | {resume} |")  # fmt: skip
    OUTPUT.write_text(json.dumps({"iterations": args.iterations, "rows": rows}, indent=2))
    print(f"\nJSON: {OUTPUT}")


if __name__ == "__main__":
    main()
