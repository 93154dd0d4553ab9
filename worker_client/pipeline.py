"""Mode ``herald_pipelined`` on the worker: plans read ahead, early rows pulled ahead.

Herald's worker waits for the commit of iteration t before it pulls anything
for t+1. In ``herald_pipelined`` the scheduler lets plan t+1 flow once t-1 is
committed (so it arrives while t trains) and marks its early pulls
(``CommPlan.pull_early``): keys nobody pushes or writes back in t, whose rows
t's commit leaves as they are. So:

- :class:`PlanFeed` reads the plan stream on a background thread, decodes
  each plan as it arrives and keeps it until the worker asks for it;
  ``upcoming`` shows the next one already here;
- while it runs plan t, :class:`PipelinedPlanStep` looks for plan t+1 there,
  after its own late pulls of t are in (so the early pulls of t+1 never
  compete with them, nor with the other workers', which happen at the same
  moment, right after t-1's commit) and again after t's compute, and starts
  t+1's early pulls (``PSClient`` futures) the first time it finds it;
- the worker reports t with ``wait_for_commit``, so ``ReportDone`` returns once
  t is committed; only then does it run plan t+1, whose
  :meth:`PipelinedPlanStep.fetch` pulls the remaining (late) rows and joins
  them with the early ones, in the plan's pull order. Everything after that is
  :class:`~worker_client.plan_step.PlanStep`'s: the same checks, the same
  admission (after t+1's evictions), the same rows counted (a prefetched row
  is still one pull).

Why reading early is safe: an early row of t+1 is read while t runs, so
after t-1's commit (and every write-back of t-1 came before the reports that
committed it), and nothing changes it on the PS until t's commit is over.

With ``--prefetch-plans P`` plans t+1 .. t+P arrive while t runs (``PlanFeed.held``
shows them all), and each early key carries its lead n (``CommPlan.pull_early_from``):
no iteration from ``u - n`` to ``u - 1`` changes the row, so it is pulled once the
running iteration is ``u - n`` or later, by the same rule. A plan's early rows may
so come in several parts, joined in pull order when it runs.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.client import PSClient, rpc
from heraldps.client.core import Pulled
from heraldps.job import TrainingJob
from heraldps.plan import CommPlan, plan_from_proto, sub_sequence_mask
from heraldps.traffic import Traffic
from heraldps.v1 import scheduler_pb2
from worker_client.dense_sync import DenseSync
from worker_client.plan_step import PlanMismatch, PlanStep


@dataclass(frozen=True)
class Received:
    """A decoded plan and the bytes its samples took on the wire."""

    plan: CommPlan
    sample_bytes: int


def _decode(message: scheduler_pb2.CommPlan) -> Received:
    return Received(plan_from_proto(message), message.mini_batch.ByteSize())


_END = object()  # the stream ended


class PlanFeed:
    """A worker's plans in iteration order.

    Without ``read_ahead`` (every mode but ``herald_pipelined``) a plan is read and
    decoded when the worker asks for it. With it, a background thread reads and
    decodes the stream as plans arrive, and ``upcoming`` shows the next plan once
    it is here. An error of the stream reaches the worker after the plans before it.
    """

    def __init__(
        self, messages: Iterable[scheduler_pb2.CommPlan], read_ahead: bool = False
    ) -> None:
        self._messages = messages
        self._read_ahead = read_ahead
        self._arrived: collections.deque[Received | BaseException | object] = collections.deque()
        self._changed = threading.Condition()

    def __iter__(self) -> Iterator[Received]:
        if not self._read_ahead:
            for message in self._messages:
                yield _decode(message)
            return
        threading.Thread(target=self._read, name="plan-feed", daemon=True).start()
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._arrived))
                item = self._arrived.popleft()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, Received)
            yield item

    def upcoming(self) -> CommPlan | None:
        """The next plan if it has arrived (the worker has not asked for it yet), else None."""
        held = self.held()
        return held[0] if held else None

    def held(self) -> list[CommPlan]:
        """Every plan that has arrived and the worker has not asked for yet, in order
        (more than one with ``--prefetch-plans`` above 1)."""
        with self._changed:
            return [item.plan for item in self._arrived if isinstance(item, Received)]

    def _read(self) -> None:
        end: BaseException | object = _END
        try:
            for message in self._messages:
                received = _decode(message)
                with self._changed:
                    self._arrived.append(received)
                    self._changed.notify_all()
        except BaseException as exc:  # the stream's RpcError, a malformed plan
            end = exc
        with self._changed:
            self._arrived.append(end)
            self._changed.notify_all()


@dataclass
class _Prefetched:
    """The early pulls of one held plan started so far."""

    pull_early: npt.NDArray[np.int64]  # the plan's, to match the plan that runs
    started: npt.NDArray[np.bool_]  # which of them are pulled (or being pulled)
    parts: list[tuple[npt.NDArray[np.int64], Future[Pulled]]]  # (positions in pull_early, rows)


class PipelinedPlanStep(PlanStep):
    """A plan step that starts later plans' early pulls while it runs this one."""

    def __init__(
        self,
        job: TrainingJob,
        worker: int,
        ps: PSClient,
        cache_rows: int,
        xp: Any = np,
        dense: DenseSync | None = None,
    ) -> None:
        super().__init__(job, worker, ps, cache_rows, xp, dense)
        self.held: Callable[[], list[CommPlan]] = list
        self._early: dict[int, _Prefetched] = {}
        self._running = -1
        self._early_pulled = 0

    def follow(self, held: Callable[[], list[CommPlan]]) -> None:
        """Where to look for the plans after the running one (``PlanFeed.held``)."""
        self.held = held

    def prefetch(self, plan: CommPlan) -> None:
        """Start pulling the early rows of ``plan`` that may be read now, once each.

        Only while an earlier plan runs: a key ``pull_early_from`` says may be pulled n
        iterations ahead is pulled once the running iteration is ``plan.iteration - n`` or
        later (the one before it is committed then). Early keys must be a sub-sequence of
        the pulls, with one lead of 1 or more each, else ``PlanMismatch`` before anything
        is sent.
        """
        early = plan.pull_early
        if not early.shape[0] or plan.iteration <= self._running:
            return
        known = self._early.get(plan.iteration)
        if known is None:
            self._check_early(plan)
            known = _Prefetched(early, np.zeros(early.shape[0], dtype=bool), [])
            self._early[plan.iteration] = known
        readable = ~known.started & (plan.iteration - plan.early_leads() <= self._running)
        if not readable.any():
            return
        positions = np.flatnonzero(readable)
        known.started[positions] = True
        known.parts.append((positions, self.pull_rows(plan, early[positions])))

    def _check_early(self, plan: CommPlan) -> npt.NDArray[np.bool_]:
        """Which pulls are early; ``PlanMismatch`` unless they are ``pull_early`` in order,
        each with a lead of 1 or more (or none given)."""
        mask = sub_sequence_mask(plan.pull, plan.pull_early)
        if mask is None:
            raise PlanMismatch(
                f"plan {plan.iteration}'s early pulls are not a sub-sequence of its pulls "
                f"(worker {self.worker})"
            )
        leads = plan.pull_early_from
        if leads.shape[0] and (leads.shape[0] != plan.pull_early.shape[0] or leads.min() < 1):
            raise PlanMismatch(
                f"plan {plan.iteration} gives {leads.shape[0]} leads for "
                f"{plan.pull_early.shape[0]} early pulls, each must be 1 or more "
                f"(worker {self.worker})"
            )
        return mask

    def _prefetch_upcoming(self) -> None:
        """Start what may be pulled now of the held plans' early rows, nearest plan first."""
        for plan in self.held():
            self.prefetch(plan)

    def run(self, plan: CommPlan) -> tuple[Traffic, float]:
        self._running, self._early_pulled = plan.iteration, 0
        traffic, loss = super().run(plan)
        traffic.early_pulls = self._early_pulled
        return traffic, loss

    def computed(self) -> None:
        """After the backward pass: the held plans' early pulls start now at the latest."""
        self._prefetch_upcoming()

    def fetch(self, plan: CommPlan) -> Future[Pulled]:
        """The prefetched early rows joined with the rest, whose pulls start now (the
        previous iteration is committed when a plan runs), in ``plan.pull`` order; then the
        held plans' early pulls that may start now do."""
        pulled = self._join(plan)
        self._prefetch_upcoming()
        return pulled

    def _join(self, plan: CommPlan) -> Future[Pulled]:
        started = self._early.pop(plan.iteration, None)
        for old in [i for i in self._early if i < plan.iteration]:
            del self._early[old]  # a plan that never ran here (cannot happen in order)
        if started is None or not np.array_equal(started.pull_early, plan.pull_early):
            return super().fetch(plan)
        mask = self._check_early(plan)
        early_at = np.flatnonzero(mask)  # where each early key sits in plan.pull
        done = np.zeros(plan.pull.shape[0], dtype=bool)
        sources: list[npt.NDArray[np.int64]] = []
        parts: list[Future[Pulled]] = []
        for positions, future in started.parts:
            at = early_at[positions]
            done[at] = True
            sources.append(at)
            parts.append(future)
        self._early_pulled = int(np.count_nonzero(done))
        rest = np.flatnonzero(~done)
        if rest.shape[0]:
            sources.append(rest)
            parts.append(self.pull_rows(plan, plan.pull[rest]))

        def join(pulled: list[Pulled]) -> Pulled:
            first_values, _, first_state = pulled[0]
            n = plan.pull.shape[0]
            values = np.empty((n, first_values.shape[1]), dtype=np.float32)
            versions = np.empty(n, dtype=np.int64)
            state = np.empty((n, first_state.shape[1]), dtype=np.float32)
            for at, (part_values, part_versions, part_state) in zip(sources, pulled, strict=True):
                values[at], versions[at], state[at] = part_values, part_versions, part_state
            return values, versions, state

        return rpc.gather(parts, join)
