"""Asking a heraldps process's gRPC health service whether it is SERVING.

``heraldps health ADDR`` is what container healthchecks and Kubernetes probes
run, and ``heraldps feed`` uses ``wait_serving`` to wait for the shards and the
scheduler. One call, no waiting for the connection: a process that is not
listening yet is simply not healthy yet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from heraldps.errors import DeadlineExceeded, NotFound, Unavailable, Unimplemented, error_from_rpc
from heraldps.security import PLAIN, ClientSecurity, open_channel

SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass(frozen=True)
class Health:
    """The answer of one check: SERVING or not, and a line for a human."""

    serving: bool
    message: str


def check(
    address: str, service: str = "", timeout: float = 5.0, security: ClientSecurity = PLAIN
) -> Health:
    """Check ``service`` ("" = the whole server) at ``address`` once, within ``timeout`` s;
    over TLS when ``security`` says so (health needs no token)."""
    what = f"{address} ({service})" if service else address
    with open_channel(address, (), security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            return Health(False, f"{what}: {_explain(err, service, timeout)}")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return Health(reply.status == SERVING, f"{what}: {status}")


def _explain(err: grpc.RpcError, service: str, timeout: float) -> str:
    error = error_from_rpc(err)
    if isinstance(error, Unavailable):
        return (
            f"not reachable ({error.message}); is the process running and listening there, "
            "and does it serve TLS (then give --tls-ca, and for mutual TLS --tls-cert/--tls-key)?"
        )
    if isinstance(error, DeadlineExceeded):
        return f"no answer within {timeout:g} s; raise --timeout or check the process"
    if isinstance(error, NotFound):
        return f"the server does not know the service {service!r}; leave --service empty"
    if isinstance(error, Unimplemented):
        return "no gRPC health service there; is this a heraldps process?"
    return f"health check failed: {error.code.name} {error.message}"


def wait_serving(
    address: str,
    service: str,
    deadline: float,
    poll: float = 0.2,
    security: ClientSecurity = PLAIN,
) -> Health:
    """Check until SERVING or ``time.monotonic()`` passes ``deadline``; the last answer."""
    while True:
        remaining = deadline - time.monotonic()
        health = check(address, service, max(0.1, min(5.0, remaining)), security)
        if health.serving or time.monotonic() + poll > deadline:
            return health
        time.sleep(poll)
