"""Claiming every shard for one run (``heraldps.fence``): the scheduler's fence."""

from __future__ import annotations

import math

from heraldps.client.arguments import integer
from heraldps.client.core import ShardClient
from heraldps.errors import FailedPrecondition, InvalidArgument, shown
from heraldps.fence import MAX_LEASE_SECONDS, MAX_RUN_ID_CHARS, MIN_LEASE_SECONDS
from heraldps.v1 import ps_pb2


class Claims(ShardClient):
    """Claim, renew and release the shards; once claimed, commit and load carry the fence."""

    def max_claim_epoch(self) -> int:
        """The largest epoch any shard has granted (0: none)."""
        infos = self._all_shards("GetShardInfo", ps_pb2.GetShardInfoRequest())
        return max(int(info.max_epoch) for info in infos)

    def claim(
        self, run_id: str, epoch: int, lease_seconds: float, force: bool = False
    ) -> list[ps_pb2.ClaimResponse]:
        """Claim every shard for ``run_id`` at ``epoch`` (above ``max_claim_epoch``). A
        refusal raises (``ShardClaimed``'s reason, FAILED_PRECONDITION); shards that granted
        it stay claimed: release them, or claim again with a larger epoch."""
        fence = _fence(run_id, epoch, "claim")
        if not isinstance(force, bool):
            raise InvalidArgument(f"claim: force must be True or False, got {shown(force)}")
        request = ps_pb2.ClaimRequest(
            fence=fence, lease_seconds=_lease(lease_seconds, "claim"), force=force
        )
        answers = self._all_shards("Claim", request)
        self.fence = fence
        return answers

    def renew_claim(self, lease_seconds: float) -> None:
        """Extend this client's claim on every shard (claims a restarted shard again)."""
        if self.fence is None:
            raise FailedPrecondition("renew_claim before claim: claim the shards first")
        request = ps_pb2.ClaimRequest(
            fence=self.fence, lease_seconds=_lease(lease_seconds, "renew_claim")
        )
        self._all_shards("Claim", request)

    def release_claim(self, run_id: str, epoch: int) -> None:
        """Give up the claim ``(run_id, epoch)`` on every shard; the fence stays off."""
        fence = _fence(run_id, epoch, "release_claim")
        self.fence = None
        self._all_shards("Claim", ps_pb2.ClaimRequest(fence=fence, release=True))


def _fence(run_id: str, epoch: int, what: str) -> ps_pb2.Fence:
    """A run id of 1 to ``MAX_RUN_ID_CHARS`` characters and an epoch >= 1, as shards demand."""
    if not isinstance(run_id, str) or not 1 <= len(run_id) <= MAX_RUN_ID_CHARS:
        raise InvalidArgument(
            f"{what}: run_id must be a string of 1 to {MAX_RUN_ID_CHARS} characters, got "
            f"{shown(run_id)}"
        )
    return ps_pb2.Fence(run_id=run_id, epoch=integer(epoch, f"{what}: epoch", 1))


def _lease(seconds: float, what: str) -> float:
    """Lease seconds in ``MIN_LEASE_SECONDS..MAX_LEASE_SECONDS``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgument(f"{what}: lease_seconds must be a number, got {shown(seconds)}")
    if not (math.isfinite(seconds) and MIN_LEASE_SECONDS <= seconds <= MAX_LEASE_SECONDS):
        raise InvalidArgument(
            f"{what}: lease_seconds must be in [{MIN_LEASE_SECONDS:g}, {MAX_LEASE_SECONDS:g}], "
            f"got {seconds}"
        )
    return float(seconds)
