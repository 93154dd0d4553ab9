"""The ``heraldps local`` command: arguments -> job -> runs -> table, JSON, plot."""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from heraldps.bundled import bundled_data
from heraldps.datasets import SparseDataset
from heraldps.errors import InvalidArgument
from worker_client.job import TrainingJob
from worker_client.local import ALL_MODES, cache_rows_for, run_local
from worker_client.report import summary_table, write_json, write_plot


def _columns(text: str | None) -> tuple[str, ...] | None:
    return tuple(c for c in text.split(",") if c) if text else None


def datasets(
    args: argparse.Namespace, job: TrainingJob
) -> tuple[TrainingJob, SparseDataset, SparseDataset]:
    """(job, train, held-out) as the flags ask. Without --eval-data the last
    --eval-fraction of --data is held out, and the job trains on the rows before it."""
    if args.data is None:
        _, test_path = bundled_data()
        return job, job.read(), job.read(str(test_path))
    full = job.read()
    if args.eval_data is not None:
        return job, full, job.read(args.eval_data)
    if not 0 < args.eval_fraction < 1:
        raise InvalidArgument("--eval-fraction must be between 0 and 1 (or give --eval-data)")
    cut = full.rows - max(1, int(full.rows * args.eval_fraction))
    return replace(job, max_rows=cut), full.row_slice(0, cut), full.row_slice(cut, full.rows)


def run_local_command(args: argparse.Namespace) -> int:
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown or not modes:
        raise InvalidArgument(f"--modes takes a comma-separated subset of {', '.join(ALL_MODES)}")
    data = args.data or str(bundled_data()[0])
    job = TrainingJob(
        data=data, format=args.format, sparse_columns=_columns(args.sparse_columns),
        label_column=args.label_column, dense_columns=_columns(args.dense_columns),
        workers=args.workers, batch_size_per_worker=args.batch_size_per_worker,
        iterations=args.iterations, epochs=args.epochs, optimizer=args.optimizer, lr=args.lr,
        embedding_dim=args.embedding_dim, staleness=args.staleness, policy=args.policy,
        device=args.device,
    )  # fmt: skip
    job, train, held_out = datasets(args, job)
    job = replace(job, cache_rows=cache_rows_for(train, args.cache_fraction))
    console = Console()
    if not console.is_terminal:
        console.width = 180  # logs and CI: wide enough for the whole table
    console.print(
        f"[bold]heraldps local[/]: {train.rows:,} training rows ({Path(job.data).name}), "
        f"{held_out.rows:,} held out; {job.workers} workers x {job.batch_size_per_worker}, "
        f"{args.shards} {args.store} shards, cache {job.cache_rows:,} rows per worker, "
        f"{job.optimizer}, "
        f"modes {', '.join(modes)}"
    )
    with Progress(
        TextColumn("{task.description:>15}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console,
    ) as bars:  # fmt: skip
        tasks = {m: bars.add_task(m, total=None, rate="") for m in modes}

        def progress(mode: str, done: int, total: int, so_far: dict[str, float]) -> None:
            elapsed = bars.tasks[tasks[mode]].elapsed or 0.0
            rate = done * job.global_batch / elapsed if elapsed else 0.0
            bars.update(
                tasks[mode],
                completed=done,
                total=total,
                rate=f"{rate:,.0f} samples/s  loss {so_far['loss']:.4f}  "
                f"pulled {int(so_far['pulls']):,}  pushed {int(so_far['pushes']):,}",
            )

        results = run_local(
            job, modes, args.shards, train, held_out,
            Path(args.workdir) if args.workdir else None, progress, args.store, args.cache_gb,
        )  # fmt: skip
        for mode, result in results.items():
            t = result.traffic
            bars.update(
                tasks[mode],
                rate=f"{result.samples_per_second:,.0f} samples/s  pulled {t['pulls']:,}  "
                f"pushed {t['grad_pushes'] + t['write_backs']:,}",
            )
    console.print(summary_table(results))
    config = {**asdict(job), "shards": args.shards, "cache_fraction": args.cache_fraction}
    if args.json:
        write_json(results, config, args.json)
        console.print(f"report: {args.json}")
    if args.plot:
        write_plot(results, args.plot)
        console.print(f"plot: {args.plot}")
    return 0
