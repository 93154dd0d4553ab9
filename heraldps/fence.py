"""Fencing: which run's scheduler a shard serves (docs/failure-and-recovery.md#fencing).

A scheduler claims every shard at start (``ParameterServer.Claim``) with its run id and
an epoch above every epoch the shards have granted, renews the claim while it lives and
releases it when it stops. While a claim's lease runs, a shard refuses a Commit or Load
that does not carry that claim's fence, so a second scheduler (or a stale one) cannot roll
back or advance a live run's model. Shared by the shard (``ps_server.claim``), the client
(``heraldps.client.claims``) and the scheduler (``scheduler_service.claim``).
"""

from __future__ import annotations

from heraldps.errors import FailedPrecondition
from heraldps.v1 import ps_pb2

MAX_RUN_ID_CHARS = 128
MIN_LEASE_SECONDS = 1.0
MAX_LEASE_SECONDS = 3600.0


class ShardClaimed(FailedPrecondition):
    """The shard is held by another run's (or another epoch's) scheduler. ``metadata``:
    ``holder_run``, ``holder_epoch``, ``expires_in`` (seconds), ``max_epoch``."""

    reason = "SHARD_CLAIMED"


def describe(fence: ps_pb2.Fence | None) -> str:
    """``run 'job-a' (epoch 3)``, or what an unfenced caller is."""
    if fence is None or not fence.run_id:
        return "a client that names no run (no fence)"
    return f"run {fence.run_id[:MAX_RUN_ID_CHARS]!r} (epoch {fence.epoch})"


def same(a: ps_pb2.Fence | None, b: ps_pb2.Fence | None) -> bool:
    return a is not None and b is not None and (a.run_id, a.epoch) == (b.run_id, b.epoch)
