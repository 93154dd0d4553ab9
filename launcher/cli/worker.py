"""``heraldps worker``: one training worker."""

from __future__ import annotations

import argparse

from launcher.cli.command import Command, addresses, port_number
from launcher.cli.security_flags import add_tls_arguments, add_token_argument, client_security


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
        "--metrics-port",
        type=port_number,
        default=None,
        help="serve Prometheus /metrics here (0: free)",
    )
    p.add_argument(
        "--advertise-host",
        default="127.0.0.1",
        help="address other workers reach this worker's dense all-reduce server at (its pod "
        "IP or service name; a loopback address binds loopback only, any other binds 0.0.0.0)",
    )
    p.add_argument(
        "--collective-port",
        type=port_number,
        default=0,
        help="port of this worker's dense all-reduce server (0: a free one)",
    )
    add_tls_arguments(p)
    add_token_argument(p, "the worker token; the all-reduce peers must present it too")


def run(args: argparse.Namespace) -> int:
    from worker_client.worker import WorkerConfig, run_worker

    config = WorkerConfig(
        job=args.job, worker_id=args.worker_id, scheduler=args.scheduler,
        ps=addresses(args.ps), report=args.report,
        timeout_seconds=args.timeout_seconds, prefetch=args.prefetch,
        metrics_port=args.metrics_port, advertise_host=args.advertise_host,
        collective_port=args.collective_port, security=client_security(args),
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
