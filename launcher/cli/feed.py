"""``heraldps feed``: create a job's tables and feed its batches to a running cluster."""

from __future__ import annotations

import argparse

from launcher.cli.command import Command, addresses, port_number
from launcher.cli.security_flags import add_tls_arguments, add_token_argument, client_security


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, help="job JSON (its data may be bundled:criteo_head8k)")
    p.add_argument("--scheduler", required=True, help="scheduler address host:port")
    p.add_argument("--ps", required=True, help="comma-separated PS shard addresses, in shard order")
    p.add_argument(
        "--timeout-seconds",
        type=float,
        default=300.0,
        help="wait this long for the services, per RPC, and for progress",
    )
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="serve Prometheus /metrics here (0: free)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address /metrics binds (0.0.0.0: every interface, for a scraper elsewhere)",
    )
    add_tls_arguments(p)
    add_token_argument(p, "the admin token: it creates tables and submits batches")


def run(args: argparse.Namespace) -> int:
    from launcher.feed import FeedConfig, run_feed

    config = FeedConfig(
        job=args.job, scheduler=args.scheduler, ps=addresses(args.ps),
        timeout_seconds=args.timeout_seconds, metrics_port=args.metrics_port,
        metrics_host=args.metrics_host, security=client_security(args),
    )  # fmt: skip
    run_feed(config)
    print(f"heraldps feed: every iteration of {args.job} committed")
    return 0


COMMAND = Command(
    name="feed",
    help="create a job's tables and feed its batches to a running cluster (one-shot)",
    description="Wait for the PS shards and the scheduler, create the job's tables "
    "(idempotent), submit every global batch with its samples, Finish, and exit 0 once the "
    "scheduler has committed the last iteration. The feeder is the only reader of the data.",
    add_arguments=add_arguments,
    run=run,
    failure_code=1,
)
