"""``heraldps worker``: one training worker."""

from __future__ import annotations

import argparse

from launcher.cli.command import Command, addresses


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--job", required=True, help="job JSON (model, optimizer; as heraldps local writes it)"
    )
    p.add_argument("--worker-id", type=int, required=True, help="this worker's id, 0..N-1")
    p.add_argument("--scheduler", required=True, help="scheduler address host:port")
    p.add_argument("--ps", required=True, help="comma-separated PS shard addresses, in shard order")
    p.add_argument("--report", default=None, help="write per-iteration traffic and loss here")
    p.add_argument(
        "--timeout-seconds", type=float, default=120.0, help="deadline of each RPC, seconds"
    )
    p.add_argument(
        "--prefetch", default=None, help="keyset file to load into the PS caches before training"
    )
    p.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0: free)"
    )
    p.add_argument(
        "--advertise-host",
        default="127.0.0.1",
        help="address other workers reach this worker at (its all-reduce server)",
    )


def run(args: argparse.Namespace) -> int:
    from worker_client.worker import WorkerConfig, run_worker

    config = WorkerConfig(
        job=args.job, worker_id=args.worker_id, scheduler=args.scheduler,
        ps=addresses(args.ps), report=args.report,
        timeout_seconds=args.timeout_seconds, prefetch=args.prefetch,
        metrics_port=args.metrics_port, advertise_host=args.advertise_host,
    )  # fmt: skip
    return run_worker(config)


COMMAND = Command(
    name="worker",
    help="run one training worker (follows the scheduler's plans)",
    description="Run one worker: register with the scheduler, execute each plan (or train as "
    "a HET worker), report every iteration. The samples arrive with the plans.",
    add_arguments=add_arguments,
    run=run,
    failure_code=1,
)
