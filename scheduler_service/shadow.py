"""Herald Table 1's baseline, live: what naive would move on the batches being trained.

A second :class:`~scheduler_service.scheduler.Scheduler` in mode ``naive``
(sequential partition, every update written back at once) is fed the same
batches as the service's own scheduler. Only its counts are kept (its plans
are dropped), so the service can export the naive row counts next to what
the workers really moved, and a dashboard can show traffic relative to
naive while a single mode trains. It costs a second mirror: about the
scheduler's own planning time and memory again.
"""

from __future__ import annotations

import logging
import threading

from heraldps.errors import HeraldError
from heraldps.traffic import Traffic
from scheduler_service.batch import Batch
from scheduler_service.scheduler import Scheduler

log = logging.getLogger(__name__)


class NaiveShadow:
    """Plans every batch in mode naive, in iteration order, and keeps the counts.

    Batches may arrive out of order from concurrent ``SubmitBatch`` calls that the
    service already accepted in order; they wait until their turn. If the naive plan
    is impossible (a sequential mini-batch larger than the cache, which location-aware
    assignment or HET may avoid), the shadow stops and :attr:`failed` says why.
    """

    def __init__(self, num_workers: int, capacity: int) -> None:
        self._scheduler = Scheduler(num_workers, capacity, "naive")
        self._waiting: dict[int, Batch] = {}
        self._lock = threading.Lock()
        self.failed: str | None = None

    @property
    def counts(self) -> Traffic:
        return self._scheduler.counts

    def submit(self, batch: Batch) -> None:
        with self._lock:
            if self.failed is not None:
                return
            self._waiting[batch.iteration] = batch
            expected = self._scheduler.next_iteration
            if expected is None:
                expected = min(self._waiting)
            while expected in self._waiting:
                self._plan(self._waiting.pop(expected))
                expected += 1

    def finish(self) -> None:
        with self._lock:
            if self.failed is None:
                self._scheduler.finish()

    def _plan(self, batch: Batch) -> None:
        try:
            self._scheduler.submit(batch)
        except HeraldError as err:
            self.failed = str(err)
            self._waiting.clear()
            log.warning("naive shadow stopped (naive traffic is no longer exported): %s", err)
