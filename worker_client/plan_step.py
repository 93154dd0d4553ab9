"""Herald plan mode: execute a :class:`~heraldps.plan.CommPlan` exactly.

Evict, pull, train, update the rows only this worker trains with the shared
optimizer function, push gradients of co-trained rows, write back what the
plan lists. Anything in the plan that does not match the cache is a
:class:`PlanMismatch`: the worker and the scheduler's mirror have diverged,
and training must stop rather than silently train a different model. Every
check runs before the cache or the PS changes.

The sends of an iteration overlap (:class:`~worker_client.sends.Sends`): rows
the plan writes back that this iteration does not train (dirty since an earlier
one, so final already: early write-backs and most on-demand ones) leave right
after the pull requests (small, so they go first), on the outbound link, which
is idle while the worker pulls and computes, behind the previous iteration's
dense all-reduce if it still runs;
the gradient push and the dense push leave as soon as the backward pass has made
them, while the local optimizer runs; the other write-backs (which need those
local updates) follow; the step waits for all of them before it returns. A dense
all-reduce (every iteration's but the final flush's) leaves only after the
embedding sends, which the commit waits for, and runs on while the worker
reports, waits for its next plan and pulls; the next forward pass waits for it
(:meth:`~worker_client.step.Step.start_dense`). The PS
accepts them in any order within an iteration: pushes only add to the
iteration's buffer until the commit, and a write-back checks the row's
version, which nothing but a commit or a write-back of the same row changes. A
row dirty at this worker had no gradient pushed in the previous iteration, so
that iteration's commit (still running in ``herald_pipelined``) leaves it alone,
and no worker pulls it in this iteration (the scheduler would have had it
written back by the previous plan).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from heraldps.arrays import to_host
from heraldps.client.core import Pulled
from heraldps.errors import FailedPrecondition
from heraldps.job import EMBEDDING_TABLE
from heraldps.keyindex import KeyIndex
from heraldps.optim import scaled
from heraldps.plan import CommPlan, sub_sequence_mask
from heraldps.traffic import Traffic
from worker_client.cache import WriteBackRows
from worker_client.sends import Sends
from worker_client.step import Step


class PlanMismatch(FailedPrecondition):
    """A plan asks for something the worker's cache contradicts."""


@dataclass
class LaterGradients:
    """Gradients a plan left for the next one to send (``CommPlan.push_later``)."""

    iteration: int  # the plan that computed them; they go into iteration + 1's buffer
    keys: npt.NDArray[np.int64]
    grads: npt.NDArray[np.float32]


class PlanStep(Step):
    """One iteration under a Herald plan (modes naive, on_demand, location_aware, herald)."""

    later: LaterGradients | None = None  # left by the last plan, sent by this one

    def run(self, plan: CommPlan) -> tuple[Traffic, float]:
        cache, t = self.cache, plan.iteration
        traffic = Traffic()
        mb = self.mini_batch(plan)
        local, shared = self._split(plan, mb.keys)
        self._check_write_backs(plan)
        deferred = self._check_later(plan)
        sends = Sends()
        if plan.evict.shape[0]:
            self._check_evictions(plan)
            cache.evict(plan.evict)
        # The pull requests leave first: they are small, and behind the write-backs below
        # (megabytes on the same links) they would reach the shards only once those had.
        pulling = self._start_pull(plan) if plan.pull.shape[0] else None
        # Rows this iteration does not train are final already: they leave now, while the
        # outbound link would idle through the pulls and the forward and backward passes.
        trained_here = np.isin(plan.write_back, mb.keys)
        idle = plan.write_back[~trained_here]
        idle_rows = self._write_back_idle(sends, idle) if idle.shape[0] else None
        if self.later is not None:  # the last plan's pass-through gradients, into t's buffer
            later, self.later = self.later, None
            push = self.ps.push_gradients_async
            self._send_idle(sends, partial(push, EMBEDDING_TABLE, later.keys, later.grads, t,
                                           worker=self.worker))  # fmt: skip
        if pulling is not None:
            with self.timer("pull"):
                traffic.state_pulls += self._admit_pulled(plan, pulling)
            traffic.pulls += plan.pull.shape[0]
        slots = cache.slots(mb.keys)
        if np.any(slots < 0):
            raise PlanMismatch(
                f"plan {t} trains rows worker {self.worker} does not hold: "
                f"{mb.keys[slots < 0][:5].tolist()}"
            )
        traffic.hits += mb.keys.shape[0] - plan.pull.shape[0]
        loss, emb_grad, dense_grad = self.train(mb, slots, plan)
        self.computed()
        if shared.shape[0]:
            grads = to_host(emb_grad[self.xp.asarray(shared)])
            keys = plan.push_grads
            if deferred is not None:  # kept for the next plan, which sends them
                self.later = LaterGradients(t, keys[deferred], grads[deferred])
                keys, grads = keys[~deferred], grads[~deferred]
            if keys.shape[0]:
                sends.add(self.ps.push_gradients_async(EMBEDDING_TABLE, keys, grads, t,
                                                       worker=self.worker))  # fmt: skip
            traffic.grad_pushes += plan.push_grads.shape[0]
        waited = self.dense.wait_seconds
        host_grad = to_host(dense_grad)
        # At the end and at a checkpoint the dense update reaches the PS before the report.
        overlapped = self.dense.overlaps(plan.stores_dense)  # started after the sends below
        if not overlapped:
            sends.add(sends.in_thread(self.dense.update, host_grad, t, plan.stores_dense,
                                      plan.lr_scale))  # fmt: skip
        if local.shape[0]:
            with self.timer("optimizer"):
                cache.mark_trained(slots[local], emb_grad[self.xp.asarray(local)],
                                   scaled(self.optimizer, plan.lr_scale))  # fmt: skip
        traffic.write_backs += plan.write_back.shape[0]
        written = plan.write_back[trained_here]
        if plan.final_flush:  # every row still dirty, with the plan's write-backs: one request
            flush = np.setdiff1d(cache.dirty_keys(), plan.write_back, assume_unique=True)
            written = np.concatenate([written, flush])
            traffic.final_flush += flush.shape[0]
        rows = None
        if written.shape[0]:
            rows = cache.rows_for_write_back(written)
            sends.add(self._send_rows(rows))
        blocked = time.perf_counter()
        sends.wait()
        # Blocked on all sends at once: ``push``, less the all-reduce's wait for its peers.
        self.timer.add_blocked("push", time.perf_counter() - blocked,
                               self.dense.wait_seconds - waited)  # fmt: skip
        for sent in (idle_rows, rows):
            if sent is not None:
                cache.mark_written(sent)
        if overlapped:
            self.start_dense(host_grad, t, plan.stores_dense, plan.lr_scale)
        return traffic, loss

    def _send_rows(self, rows: WriteBackRows) -> Future[None]:
        """Write ``rows`` back (one request); the caller marks them written once it is done."""
        # No version pre-read (check_first): the scheduler's mirror rules conflicts out,
        # and each shard still refuses a row whose version moved, failing the run.
        return self.ps.write_back_async(EMBEDDING_TABLE, rows.keys, rows.values, rows.state,
                                        rows.base_versions, rows.new_versions,
                                        check_first=False)  # fmt: skip

    def _write_back_idle(self, sends: Sends, keys: npt.NDArray[np.int64]) -> WriteBackRows:
        """Send the cached rows ``keys``, which this iteration does not change, in idle
        link time (:meth:`_send_idle`)."""
        rows = self.cache.rows_for_write_back(keys)
        self._send_idle(sends, partial(self._send_rows, rows))
        return rows

    def _send_idle(self, sends: Sends, send: Callable[[], Future[None]]) -> None:
        """Start ``send``, joined to ``sends``: at once, or, while the previous iteration's
        dense update still runs, once it is done, so that it takes the link's idle time,
        not the all-reduce's."""
        ahead = self.dense.running()
        if ahead is None:
            sends.add(send())
        else:
            sends.add(Sends.in_thread(self._send_after, ahead, send))

    def _send_after(self, ahead: Future[None], send: Callable[[], Future[None]]) -> None:
        """On the send pool: wait for ``ahead`` (its error is the dense step's to raise),
        then ``send``."""
        concurrent.futures.wait([ahead])
        send().result()

    def _check_later(self, plan: CommPlan) -> npt.NDArray[np.bool_] | None:
        """Which of ``plan.push_grads`` wait for the next plan (None: none), after the
        checks: the last plan's gradients are for this iteration, and this plan's are a
        sub-sequence of its pushes and not at a checkpoint or the end, whose commit must
        hold every update; anything else is a mismatch."""
        t = plan.iteration
        if self.later is not None and self.later.iteration + 1 != t:
            raise PlanMismatch(
                f"plan {t} follows plan {self.later.iteration}, whose gradients worker "
                f"{self.worker} keeps for iteration {self.later.iteration + 1}"
            )
        if not plan.push_later.shape[0]:
            return None
        mask = sub_sequence_mask(plan.push_grads, plan.push_later)
        if plan.stores_dense or mask is None:
            raise PlanMismatch(
                f"plan {t}'s later pushes are not a sub-sequence of its pushes, or it ends a "
                f"checkpoint or the run (worker {self.worker})"
            )
        return mask

    def _split(
        self, plan: CommPlan, keys: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Rows of the mini-batch's gradients to apply locally and to push, in the plan's
        list order, found by key: the two lists must cover the mini-batch's distinct keys
        (``keys``), each once, in any order; anything else is a mismatch."""
        index = KeyIndex(keys.shape[0])
        index.insert(keys)
        local, shared = index.lookup(plan.update_local), index.lookup(plan.push_grads)
        rows = np.concatenate([local, shared])
        covered = rows.shape[0] == keys.shape[0] and bool((rows >= 0).all())
        if not covered or np.unique(rows).shape[0] != keys.shape[0]:
            raise PlanMismatch(
                f"plan {plan.iteration}'s update and push lists do not cover worker "
                f"{self.worker}'s mini-batch keys, each once"
            )
        return local, shared

    def computed(self) -> None:
        """Called once the backward pass is done, before anything is sent (a hook)."""

    def fetch(self, plan: CommPlan) -> Future[Pulled]:
        """Start pulling ``plan.pull``: the future resolves to values, versions and state
        in that order; the state only of the rows ``plan.state_wanted`` names, zeros for
        the others."""
        return self.pull_rows(plan, plan.pull)

    def pull_rows(self, plan: CommPlan, keys: npt.NDArray[np.int64]) -> Future[Pulled]:
        """Start pulling ``keys`` of ``plan``, with the state ``plan.state_wanted`` names."""
        return self.ps.pull_some_state_async(EMBEDDING_TABLE, keys, plan.state_wanted(keys))

    def _check_evictions(self, plan: CommPlan) -> None:
        """Evicted rows are held and clean (the scheduler wrote them back earlier)."""
        slots = self.cache.slots(plan.evict)
        if np.any(slots < 0):
            raise PlanMismatch(
                f"plan {plan.iteration} evicts keys worker {self.worker} does not hold: "
                f"{plan.evict[slots < 0][:5].tolist()}"
            )
        dirty = self.cache.dirty(slots)
        if np.any(dirty):
            raise PlanMismatch(
                f"plan {plan.iteration} evicts dirty rows of worker {self.worker} that were "
                f"never written back: {plan.evict[dirty][:5].tolist()}"
            )

    def _check_write_backs(self, plan: CommPlan) -> None:
        """Before anything changes: every row to write back will be dirty by then (dirty
        now and not evicted or refreshed, or updated locally in this iteration)."""
        if not plan.write_back.shape[0]:
            return
        slots = self.cache.slots(plan.write_back)
        dirty_now = np.zeros(slots.shape[0], dtype=bool)
        dirty_now[slots >= 0] = self.cache.dirty(slots[slots >= 0])
        dirty_now &= ~np.isin(plan.write_back, plan.evict) & ~np.isin(plan.write_back, plan.pull)
        ok = dirty_now | np.isin(plan.write_back, plan.update_local)
        if not np.all(ok):
            raise PlanMismatch(
                f"plan {plan.iteration} writes back rows worker {self.worker} will not hold "
                f"dirty: {plan.write_back[~ok][:5].tolist()}"
            )

    def _start_pull(self, plan: CommPlan) -> Future[Pulled]:
        """Check the plan's pulls against the cache (after its evictions) and start them:
        new rows (with room for them), or held clean ones at an older version than the
        PS's; :meth:`_admit_pulled` stores them once they are in."""
        cache = self.cache
        slots = cache.slots(plan.pull)
        held = slots >= 0
        if np.any(cache.dirty(slots[held])):
            raise PlanMismatch(
                f"plan {plan.iteration} pulls rows worker {self.worker} holds dirty (their "
                "local updates would be lost)"
            )
        new = int(np.count_nonzero(~held))
        if new > cache.free:
            raise PlanMismatch(
                f"plan {plan.iteration} pulls {new} new rows into a cache with {cache.free} "
                f"free of {cache.capacity}"
            )
        return self.fetch(plan)

    def _admit_pulled(self, plan: CommPlan, pulling: Future[Pulled]) -> int:
        """Wait for the pulled rows and admit them; the cache changes only if none of them
        is held at the version the PS sent (the scheduler would not pull it). Returns how
        many came with their state."""
        cache = self.cache
        values, versions, state = pulling.result()
        slots = cache.slots(plan.pull)
        held = slots >= 0
        current = versions[held] == cache.clocks(slots[held])
        if np.any(current):
            raise PlanMismatch(
                f"plan {plan.iteration} pulls rows worker {self.worker} already holds at the "
                f"latest version: {plan.pull[held][current][:5].tolist()}"
            )
        wanted = plan.state_wanted(plan.pull)
        cache.admit(plan.pull, values, state, versions, wanted)
        return int(np.count_nonzero(wanted))
