"""HET mode (HET, sections 3.1-3.2): the cache decides by clocks, the plan brings samples.

A cached row is valid while the PS clock is at most ``staleness`` ahead of the
row's local clock (CheckValid); invalid and missing rows are pulled. Gradients
are applied locally and accumulated; once a row carries more than
``staleness`` local updates, the accumulated gradient is pushed for the
current iteration and the row is released (HET's evict-then-fetch), so the PS
sees every update. With staleness 0 every gradient is pushed in the iteration
that made it and no stale row is ever read: exact synchronous training.

A pushed sum carries the number of local steps it spans (AdaGrad, Adam), and
the PS applies it as that many optimizer steps of the mean gradient, at most one
per iteration since the row last changed (``PushGradientsRequest.steps``):
otherwise an adaptive optimizer takes one step where synchronous training took
k, and its rows fall behind (docs/workers.md, "Staleness and adaptive
optimizers").
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.arrays import to_host
from heraldps.job import EMBEDDING_TABLE
from heraldps.optim import scaled
from heraldps.plan import CommPlan
from heraldps.traffic import Traffic
from worker_client.step import Step


class HETStep(Step):
    """One BSP iteration of a HET worker with staleness ``job.staleness``."""

    def run(self, plan: CommPlan) -> tuple[Traffic, float]:
        cache, s, t = self.cache, self.job.staleness, plan.iteration
        traffic = Traffic()
        mb = self.mini_batch(plan)
        keys = mb.keys
        slots = cache.slots(keys)
        cached = slots >= 0
        stale = np.zeros(keys.shape[0], dtype=bool)
        if np.any(cached):
            with self.timer("pull"):  # the clock check (CheckValid)
                clocks = self.ps.versions(EMBEDDING_TABLE, keys[cached])
            traffic.version_checks += clocks.shape[0]
            stale[cached] = clocks > cache.clocks(slots[cached]) + s  # CheckValid fails
            traffic.stale += int(np.count_nonzero(stale))
            # A stale row's own unpushed updates go to the PS before it is refetched.
            self._push_pending(slots[stale], t, traffic)
        missing = ~cached
        room = int(np.count_nonzero(missing)) - cache.free
        if room > 0:
            victims = cache.victims(room, keep=slots[cached])
            self._push_pending(cache.slots(victims), t, traffic)
            cache.evict(victims)
        fetch = missing | stale
        if np.any(fetch):
            with self.timer("pull"):
                values, versions, state = self.ps.pull_with_state(EMBEDDING_TABLE, keys[fetch])
            slots[fetch] = cache.admit(keys[fetch], values, state, versions)
            traffic.pulls += int(np.count_nonzero(fetch))
            traffic.state_pulls += int(np.count_nonzero(fetch))
        traffic.hits += int(np.count_nonzero(~fetch))
        loss, emb_grad, dense_grad = self.train(mb, slots, plan)
        if s == 0:
            with self.timer("push"):
                self.ps.push_gradients(EMBEDDING_TABLE, keys, to_host(emb_grad), t,
                                       worker=self.worker)  # fmt: skip
            traffic.grad_pushes += keys.shape[0]
            cache.evict(keys)  # every copy is stale after the commit
        else:
            with self.timer("optimizer"):
                cache.add_pending(slots, emb_grad)
                cache.mark_trained(slots, emb_grad, scaled(self.optimizer, plan.lr_scale))
            over = slots[cache.updates_since_fetch(slots) > s]
            self._push_pending(over, t, traffic)
            traffic.bound_releases += over.shape[0]
            cache.evict(cache.keys_at(over))
        self.push_dense(dense_grad, t, plan.stores_dense, plan.lr_scale)
        if plan.final_flush:
            flushed = Traffic()
            self._push_pending(cache.dirty_slots(), t, flushed)
            traffic.final_flush += flushed.grad_pushes
        elif plan.checkpoint:  # the PS must hold every update: push, then refetch later
            dirty = cache.dirty_slots()
            self._push_pending(dirty, t, traffic)
            cache.evict(cache.keys_at(dirty))
        return traffic, loss

    def _push_pending(self, slots: npt.NDArray[np.int64], iteration: int, traffic: Traffic) -> None:
        """Push the accumulated gradients of those ``slots`` that have any (the dirty ones),
        each with the number of local steps it sums: the PS applies it as that many steps,
        so adaptive optimizer state advances as in synchronous training."""
        pending = self.cache.take_pending(slots)
        if pending.keys.shape[0]:
            steps = pending.steps if self.job.pushes_steps else None  # as row_bytes counts
            with self.timer("push"):
                self.ps.push_gradients(EMBEDDING_TABLE, pending.keys, pending.grads, iteration,
                                       steps, self.worker)  # fmt: skip
            traffic.grad_pushes += pending.keys.shape[0]
