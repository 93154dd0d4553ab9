"""The scheduler's claim on its shards (``heraldps.fence``): taken before its first Load or
Commit, renewed every third of the lease, released when it stops.

A claim someone else holds may be a dead scheduler's (one restarted after a crash could not
release it): wait for its lease to run out, once. If its holder renews it meanwhile, that
scheduler is alive, and the start is refused, the message naming both runs, whichever run
the holder serves: a live run's shards are never loaded into or committed on by another
scheduler, even one of the same job. ``--force-takeover`` takes the shards at once; the old
scheduler's next Commit (or renewal) is refused, and its run aborts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition, HeraldError
from heraldps.fence import ShardClaimed

log = logging.getLogger(__name__)

STALE_EPOCH_TRIES = 3  # two schedulers claiming at once: read max_epoch again
RELEASE_WAIT_SECONDS = 2.0


class ShardLease:
    """One scheduler's claim on every shard of ``ps``."""

    def __init__(
        self,
        ps: PSClient,
        run_id: str,
        lease_seconds: float,
        force: bool,
        on_lost: Callable[[str], None],
    ) -> None:
        self.ps, self.run_id, self.lease, self.force = ps, run_id, lease_seconds, force
        self.on_lost = on_lost  # the claim was taken over: abort the run
        self.epoch = 0  # 0: not claimed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="claim-renewal", daemon=True)

    def acquire(self) -> None:
        """Claim every shard now, unless already done (see the module docstring)."""
        with self._lock:
            if self.epoch or self._stop.is_set():
                return
            self.epoch = self._claim()
            self._renewer.start()

    def _claim(self) -> int:
        deadline: float | None = None  # for a predecessor's lease of this run
        stale = 0
        while True:
            epoch = self.ps.max_claim_epoch() + 1
            try:
                answers = self.ps.claim(self.run_id, epoch, self.lease, self.force)
            except FailedPrecondition as exc:
                if exc.reason != ShardClaimed.reason:
                    raise
                self._release_quietly(epoch)  # the shards that granted it
                holder = exc.metadata.get("holder_run")
                if holder is None:
                    if (stale := stale + 1) < STALE_EPOCH_TRIES:
                        continue  # another claim got that epoch first
                    raise
                left = float(exc.metadata.get("expires_in", "0"))
                if deadline is None:
                    deadline = time.monotonic() + left + 1.0
                    log.info("shards held by run %r (epoch %s): waiting %.1f s for its lease "
                             "to run out (a crashed scheduler's) or be renewed (a live one's)",
                             holder, exc.metadata.get("holder_epoch"), left)  # fmt: skip
                if time.monotonic() > deadline:
                    same = " (two schedulers of one run)" if holder == self.run_id else ""
                    raise ShardClaimed(
                        f"{exc.message}. Its scheduler renewed the claim while this one (run "
                        f"{self.run_id!r}) waited for the lease: it is alive{same}",
                        metadata=exc.metadata,
                    ) from None
                time.sleep(min(max(left, 0.0) + 0.1, 1.0))
                continue
            for shard, answer in enumerate(answers):
                old = answer.previous
                if old.fence.run_id and old.expires_in_seconds > 0:
                    log.warning("--force-takeover: took over shard %d from run %r (epoch %d), "
                                "whose lease ran %.1f s more; its scheduler's commits are now "
                                "refused", shard, old.fence.run_id, old.fence.epoch,
                                old.expires_in_seconds)  # fmt: skip
            log.info("claimed %d shards for run %r, epoch %d (lease %g s)",
                     len(answers), self.run_id, epoch, self.lease)  # fmt: skip
            return epoch

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                self.ps.renew_claim(self.lease)
            except HeraldError as exc:
                if exc.reason == ShardClaimed.reason:
                    log.error("lost the claim on the shards: %s", exc)
                    self.on_lost(str(exc))
                    return
                log.warning("renewing the claim on the shards failed (%s); trying again", exc)

    def _release_quietly(self, epoch: int) -> None:
        try:
            self.ps.release_claim(self.run_id, epoch)
        except (HeraldError, ValueError) as exc:  # ValueError: the channels closed meanwhile
            log.warning("releasing the claim on the shards failed: %s", exc)

    def release(self) -> None:
        """Stop renewing and give the shards up (bounded: a frozen shard's lease runs out)."""
        with self._lock:
            self._stop.set()
            epoch, self.epoch = self.epoch, 0
        if epoch:
            done = threading.Thread(target=self._release_quietly, args=(epoch,), daemon=True)
            done.start()
            done.join(RELEASE_WAIT_SECONDS)
