"""The scheduler service's state: released plans, registered workers, the BSP barrier.

No gRPC here. Thread-safe: one lock and one condition variable; plan
watchers block on the condition until their next plan may flow (released,
and the previous iteration committed). In mode ``herald_pipelined`` plans flow
one iteration ahead: plan t+1 once t-1 is committed, so a worker holds it (and
fetches its early pulls) while it trains t; the plan's early marks are exactly
the rows t's commit cannot change, and t-1's commit has happened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from heraldps.datasets import SparseDataset
from heraldps.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable
from heraldps.modes import PIPELINED_MODE
from heraldps.plan import CommPlan
from scheduler_service.batch import Batch
from scheduler_service.scheduler import SampleScheduler, Scheduler


class UnknownWorker(InvalidArgument):
    """A worker id outside 0..num_workers-1."""

    reason = "UNKNOWN_WORKER"


class Barrier:
    """Plans in, reports in, commits out."""

    def __init__(
        self,
        scheduler: Scheduler | SampleScheduler,
        commit: Callable[[int], None],
        max_backlog: int = 4,
    ) -> None:
        self.scheduler = scheduler
        self._commit = commit
        self.max_backlog = max_backlog
        # How many iterations a plan may run ahead of the last commit: 1 is BSP's (plan
        # t+1 after t's commit); the pipelined mode's plan t+1 flows after t-1's.
        self.lead = 2 if scheduler.mode == PIPELINED_MODE else 1
        self.registered: set[int] = set()
        self._collective: dict[int, str] = {}  # worker -> its Collective service's address
        self.committed = -1
        self.finished = False
        self.final_flush = 0
        self._plans: dict[int, list[CommPlan]] = {}
        self._data: dict[int, SparseDataset] = {}  # samples of batches not yet released
        self._done: dict[int, set[int]] = {}
        self._loss: dict[int, tuple[float, int]] = {}
        self.last_loss = float("nan")
        self._samples: dict[int, int] = {}  # samples of each uncommitted batch
        self.samples_committed = 0  # samples of every committed batch (the data position)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    @property
    def num_workers(self) -> int:
        return self.scheduler.num_workers

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.num_workers:
            raise UnknownWorker(
                f"worker {worker} is unknown: this scheduler has workers 0..{self.num_workers - 1}"
            )

    def register(self, worker: int, collective_address: str = "") -> None:
        """Record a worker (again, after a restart); its all-reduce address if it has one."""
        self._check_worker(worker)
        with self._lock:
            self.registered.add(worker)
            self._collective[worker] = collective_address
            self._changed.notify_all()

    def collective_addresses(self, timeout: float) -> list[str]:
        """Every worker's all-reduce address, waiting up to ``timeout`` for the missing ones."""

        def complete() -> bool:
            return all(self._collective.get(w) for w in range(self.num_workers))

        with self._lock:
            if not self._changed.wait_for(complete, timeout=timeout):
                missing = [w for w in range(self.num_workers) if not self._collective.get(w)]
                raise Unavailable(
                    f"workers {missing} have not registered an all-reduce address yet; "
                    "ask again (they may still be starting)"
                )
            return [self._collective[w] for w in range(self.num_workers)]

    @property
    def backlog(self) -> int:
        return len(self._plans)

    def submit(self, batch: Batch) -> list[CommPlan]:
        """Plan a batch; return the plans it released (the previous iteration's)."""
        with self._lock:
            if self.finished:
                raise FailedPrecondition("training was finished; no more batches are accepted")
            expected = self.scheduler.next_iteration
            if self.backlog >= self.max_backlog:
                raise ResourceExhausted(
                    f"{self.backlog} iterations are planned but not committed (max "
                    f"{self.max_backlog}); retry after the workers catch up"
                )
            released = self.scheduler.submit(batch)
            self._samples[batch.iteration] = batch.samples
            if batch.data is not None:
                self._data[batch.iteration] = batch.data
            if expected is None:  # training may resume at any iteration (e.g. after Load)
                self.committed = batch.iteration - 1
            self._publish(released)
            return released

    def finish(self) -> list[CommPlan]:
        """No more batches: release the last plans (marked final_flush)."""
        with self._lock:
            if self.finished:
                return []
            released = self.scheduler.finish()
            for plan in released:
                plan.final_flush = True
            self._publish(released)
            self.finished = True
            self.final_flush = self.scheduler.counts.final_flush
            self._changed.notify_all()
            return released

    def _publish(self, released: list[CommPlan]) -> None:
        """Make plans visible to the watchers, each with its worker's samples if sent."""
        if released:
            data = self._data.pop(released[0].iteration, None)
            if data is not None:
                for plan in released:
                    plan.mini_batch = data.take(plan.samples)
            self._plans[released[0].iteration] = released
            self._changed.notify_all()

    def wake_all(self) -> None:
        """Wake every waiting watcher (shutdown)."""
        with self._lock:
            self._changed.notify_all()

    def next_plan(self, worker: int, iteration: int | None, timeout: float) -> CommPlan | None:
        """Block until ``worker``'s plan for ``iteration`` (None: the iteration in progress)
        may flow; None when training ended or ``timeout`` passed (the caller checks again)."""
        self._check_worker(worker)
        with self._lock:
            if worker not in self.registered:
                raise FailedPrecondition(f"worker {worker} must call RegisterWorker first")

            def wanted() -> int:
                return self.committed + 1 if iteration is None else iteration

            def ready() -> bool:
                it = wanted()
                return (it in self._plans and self.committed >= it - self.lead) or (
                    self.finished and it not in self._plans
                )

            if not self._changed.wait_for(ready, timeout=timeout):
                return None
            plans = self._plans.get(wanted())
            return None if plans is None else plans[worker]

    def report_done(
        self, worker: int, iteration: int, loss_sum: float = 0.0, samples: int = 0
    ) -> bool:
        """Record a worker's report; commit on the PS when it completes the iteration."""
        self._check_worker(worker)
        with self._lock:
            current = self.committed + 1
            if iteration != current:
                raise FailedPrecondition(
                    f"worker {worker} reported iteration {iteration}, but iteration {current} "
                    "is the one in progress"
                )
            if iteration not in self._plans:
                raise FailedPrecondition(f"iteration {iteration} has no released plans yet")
            done = self._done.setdefault(iteration, set())
            done.add(worker)
            loss, count = self._loss.get(iteration, (0.0, 0))
            self._loss[iteration] = (loss + loss_sum, count + samples)
            if len(done) < self.num_workers:
                return False
        # Every worker reported: commit outside the lock (it talks to the PS).
        self._commit(iteration)
        with self._lock:
            self.committed = iteration
            self.samples_committed += self._samples.pop(iteration, 0)
            loss, count = self._loss.pop(iteration)
            self.last_loss = loss / count if count else float("nan")
            del self._plans[iteration]
            del self._done[iteration]
            self._changed.notify_all()
        return True

    def resume_at(self, committed: int, samples_committed: int) -> None:
        """Start after a checkpoint: ``committed`` is done, its next batch comes first."""
        with self._lock:
            self.committed = committed
            self.samples_committed = samples_committed
            self.scheduler.next_iteration = committed + 1

    def samples_through(self, iteration: int) -> int:
        """Samples of every batch up to ``iteration`` (committed, or being committed)."""
        with self._lock:
            return self.samples_committed + self._samples.get(iteration, 0)

    def wait_committed(self, iteration: int, timeout: float) -> bool:
        """Block until ``iteration`` is committed; False when ``timeout`` passed first."""
        with self._lock:
            return self._changed.wait_for(lambda: self.committed >= iteration, timeout=timeout)

    def is_over(self, iteration: int | None) -> bool:
        with self._lock:
            it = self.committed + 1 if iteration is None else iteration
            return self.finished and it not in self._plans
