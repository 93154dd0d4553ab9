"""The shard's side of fencing (``heraldps.fence``): who holds this shard, and whether a
Commit or Load may change it.

In memory only: a restarted shard is unclaimed until its holder's next renewal (which
claims it again with the same fence), and it holds nothing a claim protects until then
but what it loaded from its own store.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

from heraldps.errors import InvalidArgument
from heraldps.fence import (
    MAX_LEASE_SECONDS,
    MAX_RUN_ID_CHARS,
    MIN_LEASE_SECONDS,
    ShardClaimed,
    describe,
    same,
)
from heraldps.v1 import ps_pb2

log = logging.getLogger(__name__)


@dataclass
class _Holder:
    fence: ps_pb2.Fence
    lease: float
    expires: float  # monotonic

    def left(self, now: float) -> float:
        return self.expires - now

    def to_proto(self, now: float) -> ps_pb2.ShardClaim:
        return ps_pb2.ShardClaim(
            fence=self.fence, expires_in_seconds=self.left(now), lease_seconds=self.lease
        )


class ShardClaims:
    """The claim on one shard; thread-safe."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self._holder: _Holder | None = None
        self.max_epoch = 0  # the largest epoch ever granted here
        self._lock = threading.Lock()

    def _refusal(self, holder: _Holder, now: float, what: str, caller: str) -> ShardClaimed:
        left = holder.left(now)
        return ShardClaimed(
            f"{what} refused: shard {self.shard} is held by {describe(holder.fence)}, whose "
            f"lease runs {left:.1f} s more; this call comes from {caller}. Only the scheduler "
            "of the run that claimed the shards changes their state: stop the other "
            "scheduler first, or take the shards over with --force-takeover",
            metadata={
                "holder_run": holder.fence.run_id,
                "holder_epoch": str(holder.fence.epoch),
                "expires_in": f"{left:.3f}",
                "max_epoch": str(self.max_epoch),
            },
        )

    def check(self, fence: ps_pb2.Fence | None, what: str) -> None:
        """ShardClaimed unless ``fence`` may change this shard now: no live holder, or the
        holder's own fence."""
        now = time.monotonic()
        with self._lock:
            holder = self._holder
            if holder is None or holder.left(now) <= 0 or same(holder.fence, fence):
                return
            raise self._refusal(holder, now, what, describe(fence))

    def claim(self, request: ps_pb2.ClaimRequest) -> ps_pb2.ClaimResponse:
        """Grant, renew or release a claim (see ``ParameterServer.Claim``)."""
        fence = request.fence
        _check_request(request)
        now = time.monotonic()
        with self._lock:
            holder = self._holder
            previous = None if holder is None else holder.to_proto(now)
            if request.release:
                if holder is not None and same(holder.fence, fence):
                    self._holder = None
                    log.info("claim of %s released", describe(fence))
                return ps_pb2.ClaimResponse(holder=None, previous=previous)
            if holder is not None and same(holder.fence, fence):  # a renewal
                holder.expires = now + request.lease_seconds
                holder.lease = request.lease_seconds
                return ps_pb2.ClaimResponse(holder=holder.to_proto(now))
            live = holder is not None and holder.left(now) > 0
            if live and not request.force:
                assert holder is not None
                raise self._refusal(holder, now, "claim", describe(fence))
            if fence.epoch <= self.max_epoch:
                raise ShardClaimed(
                    f"claim refused: shard {self.shard} already granted epoch "
                    f"{self.max_epoch}, so {describe(fence)} is stale; a new claim names a "
                    "larger epoch (the scheduler reads max_epoch from GetShardInfo)",
                    metadata={"max_epoch": str(self.max_epoch)},
                )
            if live:
                assert holder is not None
                log.warning("claim: %s took over shard %d from %s, whose lease ran %.1f s "
                            "more (forced)", describe(fence), self.shard, describe(holder.fence),
                            holder.left(now))  # fmt: skip
            else:
                log.info("claim: %s holds shard %d (lease %g s)", describe(fence), self.shard,
                         request.lease_seconds)  # fmt: skip
            self._holder = _Holder(fence, request.lease_seconds, now + request.lease_seconds)
            self.max_epoch = max(self.max_epoch, fence.epoch)
            return ps_pb2.ClaimResponse(holder=self._holder.to_proto(now), previous=previous)

    def info(self) -> tuple[ps_pb2.ShardClaim | None, int]:
        """The holder (None: none) and the largest epoch granted, for GetShardInfo."""
        now = time.monotonic()
        with self._lock:
            holder = None if self._holder is None else self._holder.to_proto(now)
            return holder, self.max_epoch


def _check_request(request: ps_pb2.ClaimRequest) -> None:
    fence = request.fence
    if not fence.run_id or len(fence.run_id) > MAX_RUN_ID_CHARS or fence.epoch < 1:
        raise InvalidArgument(
            f"claim: fence needs a run_id of 1..{MAX_RUN_ID_CHARS} characters and an epoch "
            f">= 1, got {len(fence.run_id)} characters and epoch {fence.epoch}"
        )
    lease = request.lease_seconds
    if not request.release and not (
        math.isfinite(lease) and MIN_LEASE_SECONDS <= lease <= MAX_LEASE_SECONDS
    ):
        raise InvalidArgument(
            f"claim: lease_seconds must be in [{MIN_LEASE_SECONDS:g}, {MAX_LEASE_SECONDS:g}], "
            f"got {lease}"
        )
