"""``heraldps export``: a trained model out of the cluster, into a directory."""

from __future__ import annotations

import argparse

from launcher.cli.command import Command, addresses
from launcher.cli.security_flags import add_tls_arguments, add_token_argument, client_security


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="the run's job JSON (heraldps local: "
                   "WORKDIR/MODE/job.json)")  # fmt: skip
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint (ckpt-* folder) or a checkpoint directory (its newest complete one)",
    )
    source.add_argument(
        "--ps", default=None, help="comma-separated PS shard addresses of a live cluster"
    )
    p.add_argument("--out", required=True, help="the model directory to write (must be new)")
    p.add_argument("--timeout-seconds", type=float, default=300.0, help="per RPC (--ps)")
    add_tls_arguments(p)
    add_token_argument(p, "a token the shards accept (export reads every row)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from heraldps.client import PSClient
    from heraldps.errors import InvalidArgument
    from heraldps.job import TrainingJob
    from launcher.export import export_from_checkpoint, export_from_ps

    if (args.checkpoint is None) == (args.ps is None):  # both, from the environment
        raise InvalidArgument(
            "give one model source, --checkpoint or --ps (HERALDPS_CHECKPOINT or HERALDPS_PS), "
            "not both"
        )
    job = TrainingJob.load(args.job)
    if args.checkpoint is not None:
        out = export_from_checkpoint(job, Path(args.checkpoint), Path(args.out))
    else:
        shards = addresses(args.ps)
        with PSClient(list(shards), timeout=args.timeout_seconds,
                      security=client_security(args)) as ps:  # fmt: skip
            out = export_from_ps(job, ps, Path(args.out), {"ps": list(shards)})
    print(f"heraldps export: model written to {out}")
    return 0


COMMAND = Command(
    name="export",
    help="write a trained model (rows, dense parameters, job) to a directory",
    description="Read the model from a checkpoint (--checkpoint) or from live PS shards "
    "(--ps) and write it, with the job and a manifest of checksums, to a new directory "
    "(docs/serving.md). heraldps predict scores data with it.",
    add_arguments=add_arguments,
    run=run,
    failure_code=1,
)
