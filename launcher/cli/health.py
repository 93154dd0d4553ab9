"""``heraldps health ADDR``: is a heraldps process SERVING?"""

from __future__ import annotations

import argparse
import sys

from launcher.cli.command import Command
from launcher.cli.security_flags import add_tls_arguments, tls_files


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("address", metavar="ADDR", help="host:port of a PS shard or the scheduler")
    p.add_argument(
        "--service", default="", help="service name to check (empty: the server as a whole)"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    add_tls_arguments(p, permissions=False)  # a probe: it warns about nothing


def run(args: argparse.Namespace) -> int:
    from heraldps.healthcheck import check
    from heraldps.security import ClientSecurity

    health = check(args.address, args.service, args.timeout, ClientSecurity(tls_files(args)))
    print(health.message, file=sys.stdout if health.serving else sys.stderr)
    return 0 if health.serving else 1


COMMAND = Command(
    name="health",
    help="ask a heraldps process whether it is SERVING (exit 0) or not (exit 1)",
    description="Check the gRPC health service at ADDR once: exit 0 if it reports SERVING, "
    "1 otherwise (not reachable, NOT_SERVING, unknown service), with the reason on stderr. "
    "Container healthchecks and probes run this.",
    add_arguments=add_arguments,
    run=run,
    failure_code=1,
)
