"""Mode ``herald_pipelined`` on the worker: plans read ahead, early rows pulled ahead.

Herald's worker waits for the commit of iteration t before it pulls anything
for t+1. In ``herald_pipelined`` the scheduler lets plan t+1 flow once t-1 is
committed (so it arrives while t trains) and marks its early pulls
(``CommPlan.pull_early``): keys nobody pushes or writes back in t, whose rows
t's commit leaves as they are. So:

- :class:`PlanFeed` reads the plan stream on a background thread and, when a
  plan arrives while the worker still runs the previous one, hands it to
  :meth:`PipelinedPlanStep.prefetch`, which starts the early pulls at once
  (``PSClient`` futures);
- the worker reports t with ``wait_for_commit``, so ``ReportDone`` returns once
  t is committed; only then does it run plan t+1, whose
  :meth:`PipelinedPlanStep.fetch` pulls the remaining (late) rows and joins
  them with the early ones, in the plan's pull order. Everything after that is
  :class:`~worker_client.plan_step.PlanStep`'s: the same checks, the same
  admission (after t+1's evictions), the same rows counted (a prefetched row
  is still one pull).

Why reading early is safe: an early row is read after t-1's commit (the plan
flowed after it, and every write-back of t-1 came before its reports) and
nothing changes it on the PS until t's commit is over.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.client import PSClient
from heraldps.client.core import Pulled
from heraldps.plan import CommPlan, plan_from_proto
from heraldps.traffic import Traffic
from heraldps.v1 import scheduler_pb2
from worker_client.job import EMBEDDING_TABLE, TrainingJob
from worker_client.plan_step import PlanMismatch, PlanStep


@dataclass(frozen=True)
class Received:
    """A decoded plan and the bytes its samples took on the wire."""

    plan: CommPlan
    sample_bytes: int


def _decode(message: scheduler_pb2.CommPlan) -> Received:
    return Received(plan_from_proto(message), message.mini_batch.ByteSize())


class PlanFeed:
    """A worker's plans in iteration order.

    Without ``ahead`` (every mode but ``herald_pipelined``) a plan is read and
    decoded when the worker asks for it. With ``ahead``, a background thread reads
    and decodes the stream as plans arrive; a plan that arrives while the worker is
    still busy with the previous one is passed to ``ahead`` first (the pipelined
    step starts its early pulls there). Errors of the stream or of ``ahead`` are
    raised to the worker in stream order, after the plans before them.
    """

    def __init__(
        self,
        messages: Iterable[scheduler_pb2.CommPlan],
        ahead: Callable[[CommPlan], None] | None = None,
    ) -> None:
        self._messages = messages
        self._ahead = ahead
        self._lock = threading.Lock()
        self._worker_waits = False  # the worker is blocked asking for the next plan

    def __iter__(self) -> Iterator[Received]:
        if self._ahead is None:
            for message in self._messages:
                yield _decode(message)
            return
        arrived: queue.SimpleQueue[Received | BaseException | None] = queue.SimpleQueue()
        self._worker_waits = True  # for the first plan
        threading.Thread(target=self._read, args=(arrived,), name="plan-feed", daemon=True).start()
        while True:
            with self._lock:
                self._worker_waits = True
            item = arrived.get()
            with self._lock:
                self._worker_waits = False
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _read(self, arrived: queue.SimpleQueue[Received | BaseException | None]) -> None:
        assert self._ahead is not None
        try:
            for message in self._messages:
                received = _decode(message)
                with self._lock:
                    early = not self._worker_waits
                if early:
                    self._ahead(received.plan)
                arrived.put(received)
        except BaseException as exc:  # the stream's RpcError, a malformed plan, a mismatch
            arrived.put(exc)
            return
        arrived.put(None)


class PipelinedPlanStep(PlanStep):
    """A plan step whose plan's early rows may already be on their way (``prefetch``)."""

    def __init__(
        self, job: TrainingJob, worker: int, ps: PSClient, cache_rows: int, xp: Any = np
    ) -> None:
        super().__init__(job, worker, ps, cache_rows, xp)
        self._lock = threading.Lock()
        self._early: dict[int, tuple[npt.NDArray[np.int64], Future[Pulled]]] = {}
        self._early_pulled = 0

    def prefetch(self, plan: CommPlan) -> None:
        """Start pulling ``plan``'s early rows now (any thread).

        Call it once the iteration two before ``plan`` is committed, as the scheduler's
        plan flow guarantees on arrival. Early keys must be a sub-sequence of the pulls,
        else ``PlanMismatch`` before anything is sent.
        """
        early = plan.pull_early
        if not early.shape[0]:
            return
        self._check_early(plan)
        future = self.ps.pull_with_state_async(EMBEDDING_TABLE, early)
        with self._lock:
            self._early[plan.iteration] = (early, future)

    def _check_early(self, plan: CommPlan) -> npt.NDArray[np.bool_]:
        """Which pulls are early; ``PlanMismatch`` unless they are ``pull_early`` in order."""
        mask = np.isin(plan.pull, plan.pull_early)
        if not np.array_equal(plan.pull[mask], plan.pull_early):
            raise PlanMismatch(
                f"plan {plan.iteration}'s early pulls are not a sub-sequence of its pulls "
                f"(worker {self.worker})"
            )
        return mask

    def run(self, plan: CommPlan) -> tuple[Traffic, float]:
        self._early_pulled = 0
        traffic, loss = super().run(plan)
        traffic.early_pulls = self._early_pulled
        return traffic, loss

    def fetch(self, plan: CommPlan) -> Pulled:
        """The prefetched early rows joined with the late ones, pulled now (the previous
        iteration is committed when a plan runs), in ``plan.pull`` order."""
        with self._lock:
            started = self._early.pop(plan.iteration, None)
        if started is None or not np.array_equal(started[0], plan.pull_early):
            return super().fetch(plan)
        mask = self._check_early(plan)
        late_keys = plan.pull[~mask]
        late = (
            self.ps.pull_with_state_async(EMBEDDING_TABLE, late_keys)
            if late_keys.shape[0]
            else None
        )
        early_values, early_versions, early_state = started[1].result()
        n = plan.pull.shape[0]
        values = np.empty((n, early_values.shape[1]), dtype=np.float32)
        versions = np.empty(n, dtype=np.int64)
        state = np.empty((n, early_state.shape[1]), dtype=np.float32)
        values[mask], versions[mask], state[mask] = early_values, early_versions, early_state
        if late is not None:
            late_values, late_versions, late_state = late.result()
            values[~mask], versions[~mask], state[~mask] = late_values, late_versions, late_state
        self._early_pulled = int(np.count_nonzero(mask))
        return values, versions, state
