"""The scheduler service's state: released plans, registered workers, the BSP barrier.

No gRPC here. Thread-safe: one lock and one condition variable; plan
watchers block on the condition until their next plan may flow (released,
and the previous iteration committed). In mode ``herald_pipelined`` plans flow
one iteration ahead: plan t+1 once t-1 is committed, so a worker holds it (and
fetches its early pulls) while it trains t; the plan's early marks are exactly
the rows t's commit cannot change, and t-1's commit has happened. With
``--prefetch-plans P`` plans t+1 .. t+P flow once t-1 is committed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from heraldps.data.dataset import SparseDataset
from heraldps.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    HeraldError,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from heraldps.modes import DEFAULT_MAX_BACKLOG
from heraldps.plan import CommPlan
from scheduler_service.batch import Batch
from scheduler_service.scheduler import SampleScheduler, Scheduler


class UnknownWorker(InvalidArgument):
    """A worker id outside 0..num_workers-1."""

    reason = "UNKNOWN_WORKER"


class DuplicateReport(AlreadyExists):
    """A worker reported an iteration it had already reported: the report counts once, and
    the duplicate changes nothing (no second commit, no second checkpoint, no loss twice)."""

    reason = "DUPLICATE_REPORT"


class RunAborted(Aborted):
    """The run cannot go on: a worker fell silent, or a commit on the PS failed. Every
    later call of the barrier answers it (the run restarts from a checkpoint)."""

    reason = "RUN_ABORTED"


class Barrier:
    """Plans in, reports in, commits out.

    Liveness: the iteration in progress has a clock, started when its plans may flow
    (they are released and the iteration before is committed). ``overdue`` names the
    workers that have not reported it within a timeout, counted for each from that
    start or from when it last spoke (registered, received the plan of that iteration),
    whichever is later, or the commit that has not finished; ``fail`` then aborts the run. A worker
    that never registered is starting (a pod being scheduled, a slow import), not silent:
    whoever started it sees it fail.
    """

    def __init__(
        self,
        scheduler: Scheduler | SampleScheduler,
        commit: Callable[[int], None],
        max_backlog: int = DEFAULT_MAX_BACKLOG,
    ) -> None:
        self.scheduler = scheduler
        self._commit = commit
        self.max_backlog = max_backlog
        # How many iterations a plan may run ahead of the last commit: 1 is BSP's (plan
        # t+1 after t's commit); the pipelined mode's plan t+1 flows after t-1's, and with
        # --prefetch-plans P its plan t+P does.
        self.lead = scheduler.plans_ahead
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
        self.loss_sum_committed = 0.0  # loss over every sample of every committed iteration
        self.loss_samples_committed = 0
        self._samples: dict[int, int] = {}  # samples of each uncommitted batch
        self.samples_committed = 0  # samples of every committed batch (the data position)
        self.can_checkpoint = False  # the server has a --checkpoint-dir (SubmitBatch.checkpoint)
        self._checkpoints: set[int] = set()  # iterations the feeder asked a checkpoint of
        self.failure: RunAborted | None = None
        self._since: float | None = None  # when the iteration in progress could start
        self._heard: dict[int, float] = {}  # worker -> when it last spoke (monotonic)
        self._committing_since: float | None = None  # the last report of an iteration
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    @property
    def num_workers(self) -> int:
        return self.scheduler.num_workers

    def check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.num_workers:
            raise UnknownWorker(
                f"worker {worker} is unknown: this scheduler has workers 0..{self.num_workers - 1}"
            )

    def register(self, worker: int, collective_address: str = "") -> None:
        """Record a worker (again, after a restart); its all-reduce address if it has one."""
        self.check_worker(worker)
        with self._lock:
            self.registered.add(worker)
            self._collective[worker] = collective_address
            self._heard[worker] = time.monotonic()
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
            self.check_running()
            if self.finished:
                raise FailedPrecondition("training was finished; no more batches are accepted")
            expected = self.scheduler.next_iteration
            if batch.checkpoint and not self.can_checkpoint:
                raise FailedPrecondition(
                    f"batch {batch.iteration} asks for a checkpoint, but this scheduler has no "
                    "--checkpoint-dir: start it with one, or submit the batch without it"
                )
            if self.backlog >= self.max_backlog:
                raise ResourceExhausted(
                    f"{self.backlog} iterations are planned but not committed (max "
                    f"{self.max_backlog}); retry after the workers catch up"
                )
            released = self.scheduler.submit(batch)
            self._samples[batch.iteration] = batch.samples
            if batch.checkpoint:
                self._checkpoints.add(batch.iteration)
            if batch.data is not None:
                self._data[batch.iteration] = batch.data
            if expected is None:  # training may resume at any iteration (e.g. after Load)
                self.committed = batch.iteration - 1
            self._publish(released)
            return released

    def finish(self) -> list[CommPlan]:
        """No more batches: release the last plans (the last iteration's marked
        final_flush)."""
        with self._lock:
            if self.finished:
                return []
            released = self.scheduler.finish()
            # The plans of the batches the scheduler still held come first (look-ahead);
            # only the last iteration's end the run.
            last = max((plan.iteration for plan in released), default=-1)
            for plan in released:
                plan.final_flush = plan.iteration == last
            self._publish(released)
            self.finished = True
            self.final_flush = self.scheduler.counts.final_flush
            self._changed.notify_all()
            return released

    def _publish(self, released: list[CommPlan]) -> None:
        """Make plans visible to the watchers, each with its worker's samples if sent.
        ``released`` holds one iteration's plans, or several (a flushed batch's, or the
        last ones, with those the scheduler held: look-ahead), in iteration order."""
        for iteration in sorted({plan.iteration for plan in released}):
            plans = [plan for plan in released if plan.iteration == iteration]
            data = self._data.pop(iteration, None)
            if data is not None:
                for plan in plans:
                    plan.mini_batch = data.take(plan.samples)
            self._plans[iteration] = plans
        if released:
            self._start_clock()
            self._changed.notify_all()

    def lr_scale(self, iteration: int) -> float:
        """The learning-rate multiplier of ``iteration`` (1.0 for one never planned here):
        the commit hands it to the shards, as the plans handed it to the workers."""
        with self._lock:
            plans = self._plans.get(iteration)
            return plans[0].lr_scale if plans else 1.0

    def wake_all(self) -> None:
        """Wake every waiting watcher (shutdown)."""
        with self._lock:
            self._changed.notify_all()

    def next_plan(self, worker: int, iteration: int | None, timeout: float) -> CommPlan | None:
        """Block until ``worker``'s plan for ``iteration`` (None: the iteration in progress)
        may flow; None when training ended or ``timeout`` passed (the caller checks again)."""
        self.check_worker(worker)
        with self._lock:
            if worker not in self.registered:
                raise FailedPrecondition(f"worker {worker} must call RegisterWorker first")

            def wanted() -> int:
                return self.committed + 1 if iteration is None else iteration

            def ready() -> bool:
                it = wanted()
                return (
                    (it in self._plans and self.committed >= it - self.lead)
                    or (self.finished and it not in self._plans)
                    or self.failure is not None
                )

            if not self._changed.wait_for(ready, timeout=timeout):
                return None
            self.check_running()
            plans = self._plans.get(wanted())
            if plans is not None and wanted() == self.committed + 1:
                # Only the plan of the iteration in progress: plans further ahead
                # (herald_pipelined) reach a worker's stream whatever its training does.
                self._heard[worker] = time.monotonic()
            return None if plans is None else plans[worker]

    def report_done(
        self, worker: int, iteration: int, loss_sum: float = 0.0, samples: int = 0
    ) -> bool:
        """Record a worker's report; commit on the PS when it completes the iteration."""
        self.check_worker(worker)
        with self._lock:
            self.check_running()
            current = self.committed + 1
            if iteration < current:  # committed, so this worker's report was counted
                raise DuplicateReport(
                    f"worker {worker} reported iteration {iteration} again; it is already "
                    "committed, and this report changed nothing"
                )
            if iteration != current:
                raise FailedPrecondition(
                    f"worker {worker} reported iteration {iteration}, but iteration {current} "
                    "is the one in progress"
                )
            if iteration not in self._plans:
                raise FailedPrecondition(f"iteration {iteration} has no released plans yet")
            done = self._done.setdefault(iteration, set())
            if worker in done:  # also while the first report's commit is running
                raise DuplicateReport(
                    f"worker {worker} already reported iteration {iteration}; a report counts "
                    "once, and this one changed nothing"
                )
            done.add(worker)
            loss, count = self._loss.get(iteration, (0.0, 0))
            self._loss[iteration] = (loss + loss_sum, count + samples)
            if len(done) < self.num_workers:
                return False
            self._committing_since = time.monotonic()
        # Every worker reported: commit outside the lock (it talks to the PS). The PS
        # client has retried what may be retried (Commit is idempotent): an error now
        # ends the run, clearly, instead of leaving the barrier half-way.
        try:
            self._commit(iteration)
        except HeraldError as exc:
            where = f" ({exc.address})" if exc.address else ""
            failure = RunAborted(
                f"committing iteration {iteration} on the PS failed{where}: "
                f"{exc.code.name} {exc.message}; the run is aborted (restart it from the "
                "last checkpoint)"
            )
            self.fail(failure)
            raise failure from exc
        with self._lock:
            self.committed = iteration
            self.samples_committed += self._samples.pop(iteration, 0)
            loss, count = self._loss.pop(iteration)
            self.last_loss = loss / count if count else float("nan")
            self.loss_sum_committed += loss
            self.loss_samples_committed += count
            self._checkpoints.discard(iteration)
            del self._plans[iteration]
            del self._done[iteration]
            self._since = self._committing_since = None
            self._start_clock()
            self._changed.notify_all()
        return True

    def _start_clock(self) -> None:
        """Start the liveness clock of the iteration in progress once it can start."""
        if self._since is None and self.committed + 1 in self._plans:
            self._since = time.monotonic()

    def committed_on_ps(self) -> None:
        """The PS has committed the iteration in progress: stop the commit's liveness clock.
        What the commit callback does next (a checkpoint's snapshot) is not judged by
        ``--worker-timeout``; it has its own deadline and failing it costs only the
        checkpoint."""
        with self._lock:
            self._committing_since = None

    def check_running(self) -> None:
        """Raise :class:`RunAborted` if the run was aborted."""
        if self.failure is not None:  # a fresh exception each time: tracebacks never pile up
            raise RunAborted(self.failure.message)

    def wait_aborted(self, timeout: float) -> RunAborted | None:
        """The run's failure once it is aborted, waiting up to ``timeout`` s (None: running)."""
        with self._lock:
            self._changed.wait_for(lambda: self.failure is not None, timeout)
            return self.failure

    def fail(self, failure: RunAborted) -> None:
        """Abort the run: every waiting and later call answers ``failure`` (the first one)."""
        with self._lock:
            if self.failure is None:
                self.failure = failure
            self._changed.notify_all()

    def overdue(self, timeout: float, now: float | None = None) -> RunAborted | None:
        """Why the iteration in progress is overdue (silent workers, or its commit), or
        None while it is within ``timeout`` seconds (see the class docstring)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self.failure is not None or self._since is None:
                return None
            iteration = self.committed + 1
            done = self._done.get(iteration, set())
            silent = []
            for w, heard in sorted(self._heard.items()):
                if w not in done and now > max(self._since, heard) + timeout:
                    silent.append(w)
            if silent:
                names = ", ".join(str(w) for w in silent)
                what = f"worker {names} has" if len(silent) == 1 else f"workers {names} have"
                logs = (
                    "the worker's log"
                    if len(silent) == 1
                    else "their logs: several at once may all wait on one frozen PS shard"
                )
                return RunAborted(
                    f"{what} not reported iteration {iteration} within {timeout:g} s "
                    "(--worker-timeout): frozen, hung, or cut off from the scheduler or the "
                    f"PS; the run is aborted (see {logs}; restart the run from the last "
                    "checkpoint)"
                )
            committing = self._committing_since
            if committing is not None and now > committing + timeout:
                return RunAborted(
                    f"every worker reported iteration {iteration}, but its commit on the PS "
                    f"has not finished within {timeout:g} s (--worker-timeout): a PS shard "
                    "is frozen or unreachable; the run is aborted"
                )
            return None

    def resume_at(
        self, committed: int, samples_committed: int, loss_sum: float = 0.0, loss_samples: int = 0
    ) -> None:
        """Start after a checkpoint: ``committed`` is done, its next batch comes first; the
        loss summed so far goes on from the checkpoint's (``committed_loss_sum``)."""
        with self._lock:
            self.committed = committed
            self.samples_committed = samples_committed
            self.loss_sum_committed, self.loss_samples_committed = loss_sum, loss_samples
            self.scheduler.next_iteration = committed + 1

    def samples_through(self, iteration: int) -> int:
        """Samples of every batch up to ``iteration`` (committed, or being committed)."""
        with self._lock:
            return self.samples_committed + self._samples.get(iteration, 0)

    def loss_through(self, iteration: int) -> tuple[float, int]:
        """The loss summed over every sample up to ``iteration`` (committed, or being
        committed), and those samples: what a checkpoint of ``iteration`` records."""
        with self._lock:
            loss, count = self._loss.get(iteration, (0.0, 0))
            return self.loss_sum_committed + loss, self.loss_samples_committed + count

    def checkpoint_requested(self, iteration: int) -> bool:
        """Whether the feeder asked for a checkpoint of ``iteration`` (SubmitBatch)."""
        with self._lock:
            return iteration in self._checkpoints

    def wait_committed(self, iteration: int, timeout: float) -> bool:
        """Block until ``iteration`` is committed; False when ``timeout`` passed first."""
        with self._lock:
            committed = self._changed.wait_for(
                lambda: self.committed >= iteration or self.failure is not None, timeout=timeout
            )
            self.check_running()
            return committed

    def is_over(self, iteration: int | None) -> bool:
        with self._lock:
            it = self.committed + 1 if iteration is None else iteration
            return self.finished and it not in self._plans
