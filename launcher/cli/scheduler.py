"""``heraldps scheduler``: the Herald scheduler service."""

from __future__ import annotations

import argparse

from heraldps.modes import DEFAULT_MAX_BACKLOG, MAX_WORKERS
from launcher.cli.command import (
    Command,
    add_admission_arguments,
    add_early_write_back_argument,
    add_look_ahead_argument,
    add_prefetch_plans_argument,
    add_server_arguments,
    addresses,
    at_least,
    non_negative,
)
from launcher.cli.security_flags import (
    add_server_security_arguments,
    add_tls_arguments,
    add_token_argument,
    client_security,
    server_security,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers", type=at_least(1, MAX_WORKERS), required=True, help="number of workers N"
    )
    p.add_argument("--cache-rows", type=int, required=True, help="rows per worker cache")
    p.add_argument(
        "--expected-keys",
        type=at_least(0),
        default=0,
        help="distinct keys the run will see, when known (the job's first pass, a keyset): "
        "sizes the cache mirror up front so planning never stalls on its growth; 0: unknown "
        "(structures double as they fill)",
    )
    add_early_write_back_argument(p)
    add_look_ahead_argument(p)
    add_prefetch_plans_argument(p)
    p.add_argument(
        "--mode",
        default="herald",
        help="naive, on_demand, location_aware, herald, herald_pipelined (herald's plans, "
        "flowing one iteration ahead with early pulls marked), or het (plans carry samples "
        "only: worker caches decide by clocks; the scheduler is the BSP barrier)",
    )
    p.add_argument("--table", default="emb", help="embedding table the plans refer to")
    p.add_argument("--ps", default="", help="comma-separated PS shard addresses, in shard order")
    add_server_arguments(p, port=7100, threads=32)
    add_admission_arguments(
        p, streams=0, streams_help="plan (and other) streams open at once, at least "
        "--workers; one more is answered RESOURCE_EXHAUSTED (reason OVERLOADED); 0: workers + 16",
    )  # fmt: skip
    p.add_argument(
        "--max-backlog",
        type=int,
        default=DEFAULT_MAX_BACKLOG,
        help="planned, uncommitted iterations; SubmitBatch beyond it is RESOURCE_EXHAUSTED",
    )
    p.add_argument(
        "--no-shadow-naive",
        action="store_true",
        help="do not plan each batch a second time in naive mode for the vs-naive metrics "
        "(saves about half the planning CPU; heraldps_scheduler_naive_rows_total disappears)",
    )
    p.add_argument(
        "--worker-timeout",
        type=non_negative,
        default=60.0,
        help="seconds a worker may stay silent (not report the iteration in progress, counted "
        "from when the iteration could start or the worker last spoke) before the run is "
        "aborted: every worker and status query then answers ABORTED naming it; 0: wait "
        "forever. Set it above your slowest iteration",
    )
    p.add_argument(
        "--compress-plans",
        action="store_true",
        help="gzip the plan streams (plans carry the samples: about 2.3x smaller, for a few ms "
        "of CPU per plan); for a scheduler whose link is slow, not for loopback",
    )
    add_tls_arguments(p)
    add_server_security_arguments(p)
    add_token_argument(p, "to the PS shards; it commits, so the admin token")
    add_checkpoint_arguments(p)
    add_fence_arguments(p)


def add_fence_arguments(p: argparse.ArgumentParser) -> None:
    """Which run the shards serve (docs/failure-and-recovery.md#fencing)."""
    p.add_argument(
        "--run-id",
        default="",
        help="the run this scheduler claims the shards for; while it lives, a scheduler of "
        "another run cannot load into or commit on them. Default: --job-fingerprint, else a "
        "fresh random id. Keep it across restarts of one job's scheduler",
    )
    p.add_argument(
        "--claim-lease-seconds",
        type=float,
        default=30.0,
        help="how long the claim on the shards holds without renewal (renewed every third "
        "of it); a restarted scheduler of the same run waits at most this long for its "
        "crashed predecessor's claim",
    )
    p.add_argument(
        "--force-takeover",
        action="store_true",
        help="claim the shards even while another run's live scheduler holds them (logged); "
        "that scheduler's next commit is refused and its run aborts",
    )


def add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    """Checkpoints and resume (docs/failure-and-recovery.md#checkpoints-and-resume)."""
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="snapshot the PS (with every worker's dirty rows and the dense model) after "
        "every N-th iteration's commit, into --checkpoint-dir; 0: never",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="directory of the checkpoints (ckpt-<iteration>/ each, a manifest written last); "
        "every shard must be able to write it (a shared volume)",
    )
    p.add_argument(
        "--keep-checkpoints", type=int, default=2, help="complete checkpoints to keep (>= 1)"
    )
    p.add_argument(
        "--resume-from",
        default=None,
        help="before serving, load this checkpoint (or the newest complete one under this "
        "directory, e.g. --checkpoint-dir) into the shards and start at the iteration after "
        "it; none there: start at iteration 0",
    )
    p.add_argument(
        "--job-fingerprint",
        default="",
        help="identity of the job (any string, e.g. a hash of its config): written into each "
        "checkpoint, and a checkpoint with another one is refused on resume",
    )


def run(args: argparse.Namespace) -> int:
    from scheduler_service.checkpointer import CheckpointConfig
    from scheduler_service.server import SchedulerConfig, serve

    checkpoints = CheckpointConfig(
        every=args.checkpoint_every, directory=args.checkpoint_dir, keep=args.keep_checkpoints,
        resume_from=args.resume_from, fingerprint=args.job_fingerprint,
    )  # fmt: skip

    config = SchedulerConfig(
        workers=args.workers, cache_rows=args.cache_rows, mode=args.mode, table=args.table,
        expected_keys=args.expected_keys, early_write_back=args.early_write_back,
        look_ahead=args.look_ahead, prefetch_plans=args.prefetch_plans,
        ps=addresses(args.ps), host=args.host, port=args.port,
        metrics_port=args.metrics_port, max_backlog=args.max_backlog,
        max_message_mb=args.max_message_mb, threads=args.threads,
        grace_seconds=args.grace_seconds, port_file=args.port_file,
        shadow_naive=not args.no_shadow_naive, compress_plans=args.compress_plans,
        checkpoints=checkpoints,
        security=server_security(args), ps_security=client_security(args),
        max_concurrent_rpcs=args.max_concurrent_rpcs, max_streams=args.max_streams,
        stream_stall_seconds=args.stream_stall_seconds,
        worker_timeout=args.worker_timeout,
        run_id=args.run_id, claim_lease_seconds=args.claim_lease_seconds,
        force_takeover=args.force_takeover,
    )  # fmt: skip
    return serve(config)


COMMAND = Command(
    name="scheduler",
    help="run the Herald scheduler service (plans per worker, BSP barrier, PS commits)",
    description="Run the Herald scheduler: location-aware sample assignment, a "
    "communication plan per worker per iteration, the BSP barrier and the PS commits.",
    add_arguments=add_arguments,
    run=run,
)
