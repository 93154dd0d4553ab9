"""Claiming every shard for one run (``heraldps.fence``): the scheduler's fence."""

from __future__ import annotations

from heraldps.client.core import ShardClient
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
        fence = ps_pb2.Fence(run_id=run_id, epoch=epoch)
        request = ps_pb2.ClaimRequest(fence=fence, lease_seconds=lease_seconds, force=force)
        answers = self._all_shards("Claim", request)
        self.fence = fence
        return answers

    def renew_claim(self, lease_seconds: float) -> None:
        """Extend this client's claim on every shard (claims a restarted shard again)."""
        if self.fence is None:
            raise RuntimeError("renew_claim before claim")
        request = ps_pb2.ClaimRequest(fence=self.fence, lease_seconds=lease_seconds)
        self._all_shards("Claim", request)

    def release_claim(self, run_id: str, epoch: int) -> None:
        """Give up the claim ``(run_id, epoch)`` on every shard; the fence stays off."""
        fence = ps_pb2.Fence(run_id=run_id, epoch=epoch)
        self.fence = None
        self._all_shards("Claim", ps_pb2.ClaimRequest(fence=fence, release=True))
