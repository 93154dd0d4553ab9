"""``heraldps local``: a local cluster training every mode on the same batches.

Arguments -> job -> checks (before any process starts) -> one cluster per mode
-> table, JSON, plot.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from heraldps.activations import ACTIVATIONS
from heraldps.modes import ALL_MODES, DEFAULT_LOCAL_MODES, MAX_WORKERS
from heraldps.optim import OPTIMIZERS
from launcher.cli.command import (
    Command,
    add_early_write_back_argument,
    add_look_ahead_argument,
    add_prefetch_plans_argument,
    at_least,
    fraction,
    names,
    non_negative,
    positive,
)
from launcher.cli.data import add_data_arguments

if TYPE_CHECKING:
    from heraldps.data import DataSpec
    from heraldps.data.global_batches import MiniBatchSizes, StreamedBatches
    from heraldps.job import TrainingJob


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--job",
        default=None,
        help="a job file (docs/training.md): its data, model, optimizer, epochs and cluster "
        "set the flags' values; a flag given on the command line wins",
    )
    add_data_arguments(p)
    p.add_argument(
        "--eval-data",
        default=None,
        help="held-out file (none: the bundled sample's test.tsv for the bundled data, "
        "else the last --eval-fraction of --data)",
    )
    p.add_argument(
        "--eval-fraction",
        type=float,
        default=0.1,
        help="share of --data held out for evaluation when --eval-data is not given",
    )
    p.add_argument(
        "--modes",
        default=",".join(DEFAULT_LOCAL_MODES),
        help=f"comma-separated modes to train, in order, of {', '.join(ALL_MODES)}",
    )
    p.add_argument(
        "--staleness", type=at_least(0), default=0, help="HET staleness bound s (het mode)"
    )
    p.add_argument(
        "--workers", type=at_least(1, MAX_WORKERS), default=4, help="worker processes (<= 64)"
    )
    p.add_argument("--shards", type=at_least(1), default=2, help="PS shard processes")
    p.add_argument(
        "--batch-size-per-worker", type=at_least(1), default=128, help="samples per worker"
    )
    p.add_argument(
        "--iterations", type=at_least(1), default=None, help="at most this many global batches"
    )
    p.add_argument("--epochs", type=at_least(1), default=4, help="passes over the training data")
    p.add_argument(
        "--cache-fraction",
        type=fraction,
        default=0.1,
        help="cache rows per worker = floor(fraction x distinct training keys), 0 < f <= 1",
    )
    add_early_write_back_argument(p)
    add_look_ahead_argument(p)
    add_prefetch_plans_argument(p)
    p.add_argument("--optimizer", default="adagrad", choices=tuple(OPTIMIZERS), help="optimizer")
    p.add_argument(
        "--lr", type=positive, default=None, help="learning rate (none: 0.05, adam 0.001)"
    )
    p.add_argument(
        "--embedding-l2",
        type=non_negative,
        default=0.0,
        help="L2 on the embedding rows each step updates: grad + L2 x row (0: off)",
    )
    p.add_argument(
        "--weight-decay",
        type=non_negative,
        default=0.0,
        help="L2 on the dense parameters: grad + DECAY x param, as torch's weight_decay (0: off)",
    )
    p.add_argument("--embedding-dim", type=at_least(1), default=8, help="embedding width")
    p.add_argument(
        "--hidden-layers", type=widths, default=(64, 32),
        help="MLP hidden layer widths, comma-separated, e.g. 400,400,400 ('': none)",
    )  # fmt: skip
    p.add_argument(
        "--activation", default="relu", choices=tuple(ACTIVATIONS), help="MLP hidden activation"
    )
    p.add_argument(
        "--dropout", type=non_negative, default=0.0,
        help="dropout rate of the MLP hidden layers in training, in [0, 1) (0: off)",
    )  # fmt: skip
    p.add_argument(
        "--batch-norm", action="store_true",
        help="batch normalization of every MLP hidden layer, with the global batch's "
        "statistics (needs --dense-sync allreduce; auto picks it)",
    )  # fmt: skip
    p.add_argument(
        "--policy", default="lru", choices=("lru", "lfu"), help="HET cache eviction policy"
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "gpu", "auto"),
        help="workers train on NumPy (cpu), CuPy (gpu), or CuPy when a GPU is usable (auto)",
    )
    p.add_argument(
        "--dense-sync",
        default="auto",
        choices=("auto", "allreduce", "ps"),
        help="dense (MLP) parameters: all-reduced among workers, or through the PS; auto: "
        "all-reduce with --link-mbit or --batch-norm, the PS on loopback (where bytes are "
        "free and the all-reduce's extra RPCs only cost CPU: 10%% slower on 2 cores)",
    )
    p.add_argument(
        "--dense-checkpoint-every",
        type=at_least(0),
        default=10,
        help="allreduce: worker 0 stores the dense model on the PS this often (0: at the end)",
    )
    p.add_argument("--json", default=None, help="write the full report here")
    p.add_argument(
        "--export",
        default=None,
        metavar="DIR",
        help="write each mode's final model to DIR/MODE (a new directory; docs/serving.md): "
        "heraldps predict --model DIR/MODE scores data with it",
    )
    p.add_argument("--plot", default=None, help="write traffic and loss curves here (PNG)")
    p.add_argument(
        "--wide", action="store_true", help="print every count, not the 100-column summary"
    )
    p.add_argument(
        "--progress-every",
        type=at_least(1),
        default=10,
        help="off a terminal: one progress line per mode every this many iterations",
    )
    p.add_argument("--workdir", default=None, help="keep logs, job and reports here")
    p.add_argument(
        "--store",
        default="staged",
        choices=("staged", "cached"),
        help="PS shards in host memory (staged) or LMDB + host cache (cached)",
    )
    p.add_argument(
        "--cache-gb", type=positive, default=1.0, help="cached store: host cache per table, GiB"
    )
    p.add_argument(
        "--worker-timeout",
        type=non_negative,
        default=60.0,
        help="seconds a worker may stay silent (not report its iteration) before the run is "
        "aborted with its name, and the scheduler may leave the launcher unanswered before "
        "the run is given up (frozen); with --max-restarts the cluster then restarts. 0: "
        "wait forever. Set it above your slowest iteration",
    )
    p.add_argument(
        "--link-mbit",
        type=positive,
        default=None,
        help="emulate a cluster network: every process in its own network namespace behind "
        "a link of this many Mbit/s each way (token bucket, tc tbf; needs root and iproute2). "
        "Bandwidth only: no latency emulation (netem is not available). none: all processes "
        "on 127.0.0.1; see docs/network.md",
    )
    p.add_argument(
        "--checkpoint-every",
        type=at_least(0),
        default=0,
        help="checkpoint every N iterations: workers write back their dirty rows and the "
        "dense model, the scheduler snapshots every shard (docs/failure-and-recovery.md); 0: "
        "never (with --max-restarts: only the start of the run to resume from)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where checkpoints go, one folder per mode (none: WORKDIR/MODE/checkpoints); a "
        "new run removes the complete checkpoints an earlier run left there",
    )
    p.add_argument(
        "--keep-checkpoints", type=at_least(1), default=2, help="complete checkpoints to keep"
    )
    p.add_argument(
        "--max-restarts",
        type=at_least(0),
        default=0,
        help="when any process dies, stop the cluster, start it again from the newest "
        "checkpoint and train on, up to this many times per mode; 0: a death fails the run",
    )
    p.add_argument(
        "--ps-link-mbit",
        type=positive,
        default=None,
        help="with --link-mbit: the PS shards' links at this rate instead (none: --link-mbit)",
    )


def widths(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated integers (``--hidden-layers 400,400,400``); the
    job refuses widths below 1 with the flag's name."""
    try:
        return tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated integers such as 400,400,400, got {text!r}"
        ) from None


def modes_of(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown or not modes:
        from heraldps.errors import InvalidArgument

        raise InvalidArgument(f"--modes takes a comma-separated subset of {', '.join(ALL_MODES)}")
    return modes


def check_export(export: str | None, modes: list[str]) -> None:
    """``--export DIR``: every DIR/MODE must be new, checked before anything trains."""
    if export is None:
        return
    import os
    from pathlib import Path

    taken = [str(Path(export) / m) for m in modes if os.path.lexists(Path(export) / m)]
    if taken:
        from heraldps.errors import InvalidArgument

        raise InvalidArgument(f"--export: {', '.join(taken)} already exists; give a new "
                              "directory (or remove it)")  # fmt: skip


def dense_sync_of(args: argparse.Namespace) -> str:
    """``--dense-sync``, with ``auto`` resolved: the all-reduce where the network is real,
    or where batch normalization needs it to sum its statistics."""
    if args.dense_sync != "auto":
        return str(args.dense_sync)
    return "allreduce" if args.link_mbit is not None or args.batch_norm else "ps"


def check_network(link_mbit: float | None, ps_link_mbit: float | None) -> None:
    """``--link-mbit`` needs root and iproute2; ``--ps-link-mbit`` needs ``--link-mbit``."""
    if link_mbit is None:
        if ps_link_mbit is not None:
            from heraldps.errors import InvalidArgument

            raise InvalidArgument("--ps-link-mbit sets the PS shards' links: add --link-mbit")
        return
    from launcher.netns import check_requirements

    check_requirements()


def link_config(args: argparse.Namespace) -> dict[str, float | None]:
    """The link rates a run used, for ``--json`` (null: loopback)."""
    ps = args.ps_link_mbit if args.ps_link_mbit is not None else args.link_mbit
    return {"link_mbit": args.link_mbit, "ps_link_mbit": ps}


def network_line(args: argparse.Namespace) -> str:
    """The header's note on the emulated network ("" on loopback)."""
    if args.link_mbit is None:
        return ""
    rates = link_config(args)
    ps = "" if rates["ps_link_mbit"] == args.link_mbit else f", PS {rates['ps_link_mbit']:g}"
    return f"; links {args.link_mbit:g} Mbit/s per process{ps} (no latency emulation)"


@dataclass(frozen=True)
class Splits:
    """What a run trains on and evaluates: the job (its data spec, first-pass numbers
    recorded), the training batches, streamed, and the held-out data's spec; and what the
    first pass found about the batches' mini-batches (for the cache check)."""

    job: TrainingJob
    train: StreamedBatches
    held_out: DataSpec
    held_out_rows: int
    distinct_keys: int
    sizes: MiniBatchSizes


def splits(args: argparse.Namespace, job: TrainingJob) -> Splits:
    """The training and held-out data as the flags ask, read in one first pass that checks
    every row and records what the job needs (row count, distinct keys, dense statistics,
    each mini-batch's distinct keys). Without --eval-data the last --eval-fraction of --data
    is held out: the rows are counted first by parsing alone (a Parquet file's footer has
    the count), then the first pass reads every row, profiling the rows before the cut
    and checking those after it; the job trains on the rows before the cut."""
    from heraldps.bundled import bundled_data
    from heraldps.data.global_batches import MiniBatchSizes, StreamedBatches
    from heraldps.errors import InvalidArgument
    from launcher.cli.data import BUNDLED_TRAIN, count_rows, first_pass

    spec, total, cut = job.data_spec(), 0, None
    if args.data == BUNDLED_TRAIN and args.eval_data is None:
        held_out_source, start = str(bundled_data()[1]), 0
    elif args.eval_data is not None:
        held_out_source, start = args.eval_data, 0
    else:
        if not 0 < args.eval_fraction < 1:
            raise InvalidArgument("--eval-fraction must be between 0 and 1 (or give --eval-data)")
        total = count_rows(spec)
        cut = total - max(1, int(total * args.eval_fraction))
        job = replace(job, max_rows=cut)
        held_out_source, start = job.data, cut
    sizes = MiniBatchSizes(job.workers, job.batch_size_per_worker)
    # Without --eval-data, one pass over every row: the training rows profiled, the held-out
    # rows after them checked.
    profile = first_pass(spec if cut is not None else job.data_spec(), "first pass",
                         profile_rows=cut, on_chunk=sizes)  # fmt: skip
    stats = tuple(s.to_dict() for s in profile.dense_stats)
    job = replace(job, dense_stats=stats or None, train_rows=profile.rows,
                  distinct_keys=profile.total_distinct_keys,
                  dense_transforms=job.data_spec().transforms() or None)  # fmt: skip
    held_out = job.data_spec(held_out_source, start_row=start)
    # A held-out split of --data was checked by the first pass; another file is read now.
    held_out_rows = total - start if start else first_pass(held_out, "held-out data").rows
    train = StreamedBatches(job.data_spec(), profile.rows, job.global_batch, job.iterations,
                            job.epochs)  # fmt: skip
    return Splits(job, train, held_out, held_out_rows, profile.total_distinct_keys, sizes)


def job_file_flags(args: argparse.Namespace) -> dict[str, Any]:
    """``--job FILE``: the flags its sections set (``heraldps.job_file`` maps the file; the
    flags take the job it makes), for every flag still at its default; the job fields no
    flag has (seed, batch_norm, ...) are returned to be set on the job."""
    from heraldps import job_file

    jf = job_file.load(args.job)
    job = jf.job
    plain = argparse.ArgumentParser(add_help=False)
    add_arguments(plain)
    defaults = vars(plain.parse_args([]))
    spec = job.data_spec()
    transforms = set(job.dense_transforms or ())
    from_file: dict[str, object] = {
        "data": job.data, "format": job.format, "label_column": job.label_column,
        "sparse_columns": ",".join(job.sparse_columns) if job.sparse_columns else None,
        "dense_columns": ",".join(job.dense_columns) if job.dense_columns else None,
        "dense_transform": (next(iter(transforms)) if len(transforms) == 1 else
                            ",".join(f"{c}={t}" for c, t in
                                     zip(spec.dense(), spec.transforms(), strict=True))
                            if transforms else None),
        "eval_data": jf.splits.valid or jf.splits.test,
        "eval_fraction": jf.splits.valid_fraction or defaults["eval_fraction"],
        "modes": jf.cluster.mode, "workers": job.workers, "shards": jf.cluster.shards,
        "batch_size_per_worker": job.batch_size_per_worker, "epochs": job.epochs,
        "cache_fraction": jf.cluster.cache_fraction, "optimizer": job.optimizer, "lr": job.lr,
        "embedding_l2": job.embedding_l2, "weight_decay": job.weight_decay,
        "embedding_dim": job.embedding_dim, "hidden_layers": job.hidden,
        "activation": job.activation, "dropout": job.dropout, "policy": job.policy,
        "device": job.device, "dense_sync": job.dense_sync, "staleness": job.staleness,
        "store": jf.cluster.store, "cache_gb": jf.cluster.cache_gb,
        "checkpoint_every": jf.schedule.checkpoint_every,
        "keep_checkpoints": jf.schedule.keep_checkpoints,
        "max_restarts": jf.cluster.max_restarts,
        "early_write_back": job.early_write_back, "look_ahead": job.look_ahead,
        "prefetch_plans": job.prefetch_plans,
    }  # fmt: skip
    for dest, value in from_file.items():
        if getattr(args, dest) == defaults[dest]:
            setattr(args, dest, value)
    covered = {"data", "format", "label_column", "sparse_columns", "dense_columns",
               "dense_transforms", "workers", "batch_size_per_worker", "epochs", "optimizer",
               "lr", "embedding_l2", "weight_decay", "embedding_dim", "hidden", "activation",
               "dropout", "policy", "device", "dense_sync", "staleness", "early_write_back",
               "look_ahead", "prefetch_plans"}  # fmt: skip
    default_job = type(job)(data=job.data)
    return {k: v for k, v in asdict(job).items()
            if k not in covered and v != getattr(default_job, k)}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from heraldps.job import TrainingJob
    from launcher.cli.data import spec_of
    from launcher.lifeline import stop_on_signals
    from launcher.local import Recovery, run_local
    from launcher.preflight import check_cache, check_columns, data_name
    from launcher.progress import progress_display
    from launcher.report import (
        SUMMARY_KEY,
        agreement_line,
        summary_table,
        wide_table,
        write_json,
    )
    from scheduler_service.simulate import cache_rows_for
    from worker_client.device import array_module

    extra = job_file_flags(args) if args.job else {}
    modes = modes_of(args.modes)
    check_export(args.export, modes)
    check_network(args.link_mbit, args.ps_link_mbit)
    sparse = names(args.sparse_columns)
    check_columns(args.data, args.format, sparse)
    array_module(args.device)  # --device gpu without CuPy and a GPU: refused here
    spec = spec_of(args)
    job = TrainingJob(
        data=args.data, format=args.format, sparse_columns=sparse,
        label_column=args.label_column, dense_columns=names(args.dense_columns),
        dense_transforms=spec.dense_transforms, no_label=spec.no_label,
        workers=args.workers, batch_size_per_worker=args.batch_size_per_worker,
        iterations=args.iterations, epochs=args.epochs, optimizer=args.optimizer, lr=args.lr,
        embedding_dim=args.embedding_dim, staleness=args.staleness, policy=args.policy,
        hidden=args.hidden_layers, activation=args.activation, dropout=args.dropout,
        batch_norm=args.batch_norm,
        device=args.device, dense_sync=dense_sync_of(args),
        dense_checkpoint_every=args.dense_checkpoint_every,
        embedding_l2=args.embedding_l2,
        weight_decay=args.weight_decay, early_write_back=args.early_write_back,
        look_ahead=args.look_ahead, prefetch_plans=args.prefetch_plans,
    )  # fmt: skip
    job = replace(job, **extra)  # --job: the fields no flag sets (seed, ...)
    data = splits(args, job)
    job, train, held_out = data.job, data.train, data.held_out
    job = replace(job, cache_rows=cache_rows_for(data.distinct_keys, args.cache_fraction))
    check_cache(train, job.workers, job.batch_size_per_worker, job.cache_rows, job.iterations,
                modes, job.epochs, distinct_keys=data.distinct_keys, sizes=data.sizes,
                look_ahead=job.look_ahead)  # fmt: skip
    console = Console()
    if not console.is_terminal:
        console.width = 100  # logs and CI: the summary table fits; --wide may wrap
    console.print(
        f"[bold]heraldps local[/]: {train.rows:,} training rows ({data_name(job.data)}), "
        f"{data.held_out_rows:,} held out; {job.workers} workers x {job.batch_size_per_worker}, "
        f"{args.shards} {args.store} shards, cache {job.cache_rows:,} rows per worker, "
        f"{job.optimizer}, modes {', '.join(modes)}{network_line(args)}"
    )
    with (
        stop_on_signals(),
        progress_display(console, modes, job.global_batch, args.progress_every) as display,
    ):
        results = run_local(
            job, modes, args.shards, train, held_out,
            Path(args.workdir) if args.workdir else None, display, args.store, args.cache_gb,
            args.link_mbit, args.ps_link_mbit, recovery=Recovery(
                checkpoint_every=args.checkpoint_every,
                checkpoint_dir=Path(args.checkpoint_dir) if args.checkpoint_dir else None,
                keep=args.keep_checkpoints, max_restarts=args.max_restarts,
                worker_timeout=args.worker_timeout,
            ), export=Path(args.export) if args.export else None,
        )  # fmt: skip
    if args.wide and not console.is_terminal:
        console.width = 200
    console.print(wide_table(results) if args.wide else summary_table(results))
    if not args.wide:
        console.print(SUMMARY_KEY, highlight=False)
    console.print(agreement_line(results), highlight=False)
    for mode, result in results.items():
        for r in result.restarts:
            line = (f"{mode}: restart after \"{r.failure}\": resumed at iteration "
                    f"{r.resumed_at} in {r.seconds_to_resume:.1f} s")  # fmt: skip
            console.print(line, highlight=False)
    config = {**asdict(job), "shards": args.shards, "cache_fraction": args.cache_fraction,
              **link_config(args)}  # fmt: skip
    if args.json:
        write_json(results, config, args.json)
        console.print(f"report: {args.json}", highlight=False)
    if args.export:
        console.print(f"models: {', '.join(str(Path(args.export) / m) for m in modes)}",
                      highlight=False)  # fmt: skip
    if args.plot:
        from launcher.plot import write_plot

        write_plot(results, args.plot)
        console.print(f"plot: {args.plot}", highlight=False)
    return 0


COMMAND = Command(
    name="local",
    help="train a CTR model on a local cluster (shards, scheduler, workers), mode by mode",
    description="Start PS shards, the scheduler and workers on 127.0.0.1 (or, with "
    "--link-mbit, each in its own network namespace behind a rate-limited link) and train "
    "each mode on the same batches; print traffic and quality per mode. Every flag is checked "
    "against the data before any process starts.",
    add_arguments=add_arguments,
    run=run,
    failure_code=1,
    interrupted="interrupted; every process was stopped",  # Ctrl-C, SIGTERM, SIGHUP
)
