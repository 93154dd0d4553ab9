"""``heraldps train --job FILE``: train one job to the end (docs/training.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from heraldps.modes import ALL_MODES
from launcher.cli.command import Command, at_least, port_number, positive

# Flag -> the job file's "section.key" it overrides.
OVERRIDES = {
    "mode": "cluster.mode",
    "workers": "cluster.workers",
    "batch_size_per_worker": "cluster.batch_size_per_worker",
    "shards": "cluster.shards",
    "seed": "schedule.seed",
    "max_epochs": "schedule.max_epochs",
    "patience": "schedule.patience",
    "shuffle_buffer_rows": "schedule.shuffle_buffer_rows",
    "lr": "optimizer.lr",
    "out": "output.dir",
    "checkpoint_every": "schedule.checkpoint_every",
    "checkpoint_epochs": "schedule.checkpoint_epochs",
    "keep_checkpoints": "schedule.keep_checkpoints",
    "max_restarts": "cluster.max_restarts",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="the job file (YAML or JSON; docs/training.md)")
    p.add_argument("--out", default=None, help="output directory (overrides output.dir)")
    p.add_argument("--mode", default=None, choices=ALL_MODES, help="overrides cluster.mode")
    p.add_argument("--workers", type=at_least(1), default=None, help="overrides cluster.workers")
    p.add_argument(
        "--batch-size-per-worker",
        type=at_least(1),
        default=None,
        help="overrides cluster.batch_size_per_worker",
    )
    p.add_argument("--shards", type=at_least(1), default=None, help="overrides cluster.shards")
    p.add_argument("--seed", type=at_least(0), default=None, help="overrides schedule.seed")
    p.add_argument(
        "--max-epochs", type=at_least(1), default=None, help="overrides schedule.max_epochs"
    )
    p.add_argument("--patience", type=at_least(1), default=None, help="overrides schedule.patience")
    p.add_argument(
        "--shuffle-buffer-rows",
        type=at_least(0),
        default=None,
        help="overrides schedule.shuffle_buffer_rows (0: shuffle the training split in "
        "memory; N: a streaming shuffle holding at most N rows)",
    )
    p.add_argument("--lr", type=positive, default=None, help="overrides optimizer.lr")
    p.add_argument(
        "--checkpoint-every",
        type=at_least(0),
        default=None,
        help="a checkpoint (OUT/checkpoints) every N iterations, 0: off "
        "(schedule.checkpoint_every)",
    )
    p.add_argument(
        "--no-checkpoint-epochs",
        dest="checkpoint_epochs",
        action="store_const",
        const=False,
        default=None,
        help="no checkpoint at each epoch's end (schedule.checkpoint_epochs: false; they are "
        "on by default)",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=at_least(1),
        default=None,
        help="keep the newest N checkpoints (schedule.keep_checkpoints; default 2)",
    )
    p.add_argument(
        "--max-restarts",
        type=at_least(0),
        default=None,
        help="when a process dies, restart the cluster from the newest checkpoint and go on, "
        "at most N times (cluster.max_restarts; default 0: the run fails with the log)",
    )
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="serve the per-epoch figures as Prometheus gauges on /metrics here (0: free)",
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="address /metrics binds")


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as the job file keys they override."""
    return {key: getattr(args, flag) for flag, key in OVERRIDES.items()}


def run(args: argparse.Namespace) -> int:
    import json
    from dataclasses import replace

    from heraldps import job_file
    from heraldps.errors import InvalidArgument
    from heraldps.ports import serve_metrics
    from launcher.lifeline import stop_on_signals
    from launcher.train import Trainer, TrainMetrics, fingerprint, read_data, shuffle_setting
    from launcher.train_state import TrainState

    jf = job_file.load(args.job, overrides_of(args))
    if jf.output is None:
        raise InvalidArgument("give --out DIR or output.dir in the job file")
    out = Path(jf.output)
    earlier = TrainState.load(out)
    if (out / "report.json").exists() or ((out / "best").exists() and earlier is None):
        raise InvalidArgument(f"--out {out} holds a finished run (report.json or best/); "
                              "give a new directory or remove it")  # fmt: skip
    from worker_client.device import array_module

    array_module(jf.job.device)  # cluster.device gpu without CuPy and a GPU: refused here
    print(f"heraldps train: job file {args.job}")
    print(json.dumps(jf.settings, indent=2, default=str))
    data = read_data(jf)
    from scheduler_service.simulate import cache_rows_for

    job = data.job
    # Never below one worker's largest possible mini-batch (any shuffle of the rows).
    cache_rows = max(cache_rows_for(job.distinct_keys or 1, jf.cluster.cache_fraction),
                     job.batch_size_per_worker * job.num_fields)  # fmt: skip
    print(
        f"resolved: {job.train_rows:,} training rows, {job.distinct_keys:,} distinct keys, "
        f"mode {jf.cluster.mode}, {job.workers} workers x {job.batch_size_per_worker}, "
        f"{jf.cluster.shards} {jf.cluster.store} shards, cache {cache_rows:,} rows per "
        f"worker, {job.optimizer} lr {job.make_optimizer().lr:g}, up to "
        f"{jf.schedule.max_epochs} epochs (monitor {jf.schedule.monitor}, patience "
        f"{jf.schedule.patience}, lr x{jf.schedule.lr_decay:g} after "
        f"{jf.schedule.lr_patience} epochs without improvement), "
        f"{shuffle_setting(jf.schedule, job.train_rows or 0)}; out {out}",
        flush=True,
    )
    if earlier is not None:
        this = fingerprint(jf, replace(job, cache_rows=cache_rows, iterations=None))
        if earlier.fingerprint != this:
            raise InvalidArgument(
                f"--out {out} holds the checkpoints of another job (fingerprint "
                f"{earlier.fingerprint}; this job's is {this}: its data, model, optimizer, "
                "batch, mode, shards, splits or schedule differ): rerun that job to resume "
                "it, or give a new directory"
            )
        print(f"resuming: {out} holds this job's unfinished run ({len(earlier.epochs)} "
              "epochs recorded); training goes on from its newest checkpoint",
              flush=True)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    metrics = TrainMetrics()
    if args.metrics_port is not None:
        server = serve_metrics(args.metrics_port, args.metrics_host, metrics.registry,
                               "heraldps train")  # fmt: skip
        print(f"metrics: http://{args.metrics_host}:{server.server_port}/metrics", flush=True)
    with stop_on_signals():
        trainer = Trainer(jf, data, out, cache_rows, say=lambda line: print(line, flush=True),
                          metrics=metrics, resume=earlier)  # fmt: skip
        report = trainer.run()
    print(f"{final_line(report, out)}; report {out / 'report.json'}, curves "
          f"{out / 'curves.png'}")  # fmt: skip
    return 0


def final_line(report: dict[str, Any], out: Path) -> str:
    """The run's outcome: the best epoch and its test scores, or why there are none."""
    best = f"best epoch {report['best_epoch']}"
    if report["test_auc"] == report["test_auc"]:  # not NaN: a test split was scored
        return (f"{best}: test AUC {report['test_auc']:.6f}, logloss "
                f"{report['test_logloss']:.6f} (scored from {out / 'best'})")  # fmt: skip
    return f"{best} ({out / 'best'}); no test split in the job (data.test or test_fraction)"


COMMAND = Command(
    name="train",
    help="train one job to the end: epochs, validation, early stopping, best model",
    description="Read a job file (docs/training.md), start a local cluster (PS shards, "
    "scheduler, workers) in one mode, and train epoch by epoch: shuffle, feed, flush, "
    "evaluate the validation split, keep the best model (OUT/best), decay the learning rate "
    "on a plateau, stop early; then score the test split with the best model and write "
    "OUT/report.json and OUT/curves.png. Flags override the job file. With checkpoints "
    "(every epoch's end by default, --checkpoint-every N) a process that dies is restarted "
    "from the newest one (--max-restarts), and the same command run again after the "
    "launcher itself died resumes OUT's unfinished run.",
    add_arguments=add_arguments,
    run=run,
    failure_code=1,
    interrupted="interrupted; every process was stopped",
)
