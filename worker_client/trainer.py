"""One worker's training step, in Herald plan mode or in HET mode.

Plan mode executes a :class:`~scheduler_service.plan.CommPlan` exactly:
evict, pull, train, update rows only this worker trains with the shared
optimizer function, push gradients of co-trained rows, write back what the
plan lists. Anything in the plan that does not match the cache is a
:class:`PlanMismatch`: the worker and the scheduler's mirror have diverged
and training must stop rather than silently train a different model.

HET mode (HET, sections 3.1-3.2) decides by clocks alone. A cached row is
valid while the PS clock is at most ``staleness`` ahead of the row's local
clock (``CheckValid``); invalid and missing rows are pulled. Gradients are
applied locally and accumulated; once a row carries more than ``staleness``
local updates, the accumulated gradient is pushed for the current iteration
and the row is released (HET's evict-then-fetch), so the PS sees every
update. With staleness 0 every gradient is pushed in the iteration that made
it and no stale row is ever read: exact synchronous training.

Dense parameters are pulled every iteration (after the previous commit) and
their gradients pushed every iteration; the PS applies them at commit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.client import PSClient
from heraldps.datasets import SparseDataset
from heraldps.errors import FailedPrecondition
from heraldps.keyindex import KeyIndex
from scheduler_service.plan import CommPlan
from worker_client.cache import EmbeddingCache
from worker_client.job import DENSE_TABLE, EMBEDDING_TABLE, TrainingJob
from worker_client.minibatch import MiniBatch, select
from worker_client.model import DeepFM, ModelConfig

Keys = npt.NDArray[np.int64]


class PlanMismatch(FailedPrecondition):
    """A plan asks for something the worker's cache contradicts."""


@dataclass
class Traffic:
    """Embedding rows one worker moved, counted from its own RPCs (the counting model).

    HET only: ``stale`` = cached rows whose CheckValid failed (refetched, part of
    ``pulls``); ``bound_releases`` = rows that reached the staleness bound, so their
    gradients were pushed (part of ``grad_pushes``) and the row released.
    """

    pulls: int = 0
    grad_pushes: int = 0
    write_backs: int = 0
    final_flush: int = 0
    version_checks: int = 0
    hits: int = 0
    stale: int = 0
    bound_releases: int = 0

    @property
    def pushes(self) -> int:
        """Gradient pushes plus write-backs, as the scheduler counts ``pushes``."""
        return self.grad_pushes + self.write_backs

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def model_for(job: TrainingJob, dataset: SparseDataset, xp: Any = np) -> DeepFM:
    config = ModelConfig(
        num_fields=len(dataset.sparse_columns),
        num_dense=len(dataset.dense_columns),
        embedding_dim=job.embedding_dim,
        hidden=job.hidden,
        seed=job.seed,
    )
    return DeepFM(config, xp)


def create_tables(ps: PSClient, job: TrainingJob, model: DeepFM) -> None:
    """The embedding table and the dense table, with the job's optimizer (idempotent)."""
    optimizer = job.make_optimizer()
    ps.create_table(EMBEDDING_TABLE, job.embedding_dim, optimizer, job.make_initializer())
    ps.create_dense(DENSE_TABLE, model.dense_size, optimizer, initial=model.init_dense())


class WorkerTrainer:
    """A worker's cache, model and PS connection; one call per iteration."""

    def __init__(
        self,
        job: TrainingJob,
        dataset: SparseDataset,
        worker: int,
        ps: PSClient,
        cache_rows: int,
        xp: Any = np,
    ) -> None:
        self.job = job
        self.worker = worker
        self.ps = ps
        self.xp = xp
        self.model = model_for(job, dataset, xp)
        self.optimizer = job.make_optimizer()
        self.dense = job.dense_parameter(self.model.dense_size)
        self.cache = EmbeddingCache(
            cache_rows,
            job.embedding_dim,
            self.optimizer.state_width(job.embedding_dim),
            job.policy,
            xp,
        )

    # ----- shared pieces ------------------------------------------------------
    def _host(self, array: Any) -> np.ndarray:
        return array.get() if hasattr(array, "get") else np.asarray(array)

    def _train(self, mb: MiniBatch, slots: npt.NDArray[np.int64]) -> tuple[float, Any, Any]:
        xp = self.xp
        dense = xp.asarray(self.ps.pull_dense(self.dense))
        emb = self.cache.values[xp.asarray(slots)]
        self.cache.touch(slots)
        return self.model.forward_backward(
            dense,
            emb,
            xp.asarray(mb.field_rows),
            xp.asarray(mb.dense),
            xp.asarray(mb.labels),
            loss_scale=float(self.job.global_batch),
        )

    def _apply_locally(self, slots: npt.NDArray[np.int64], grads: Any) -> None:
        """The PS's optimizer function on cached rows: equal to the server's update."""
        xp, cache = self.xp, self.cache
        device_slots = xp.asarray(slots)
        values = cache.values[device_slots]
        state = cache.state[device_slots]
        self.optimizer.apply(values, state, grads)
        cache.values[device_slots] = values
        cache.state[device_slots] = state
        cache.clock[slots] += 1

    def _pull(self, keys: Keys) -> tuple[np.ndarray, Keys, np.ndarray]:
        values, versions, state = self.ps.pull_with_state(EMBEDDING_TABLE, keys)
        return values, versions, state

    def _write_back(self, keys: Keys) -> None:
        cache, xp = self.cache, self.xp
        slots = cache.slots(keys)
        device_slots = xp.asarray(slots)
        self.ps.write_back(
            EMBEDDING_TABLE,
            keys,
            self._host(cache.values[device_slots]),
            self._host(cache.state[device_slots]),
            cache.start[slots],
            cache.clock[slots],
        )
        cache.start[slots] = cache.clock[slots]
        cache.dirty[slots] = False

    # ----- Herald plan mode ---------------------------------------------------
    def run_plan(self, plan: CommPlan, batch: SparseDataset) -> tuple[Traffic, float]:
        """Execute ``plan`` on ``batch`` (the global batch of ``plan.iteration``)."""
        cache, t = self.cache, plan.iteration
        traffic = Traffic()
        self._check_write_backs(plan)
        if plan.evict.shape[0]:
            slots = cache.slots(plan.evict)
            if np.any(slots < 0):
                raise PlanMismatch(
                    f"plan {t} evicts keys worker {self.worker} does not hold: "
                    f"{plan.evict[slots < 0][:5].tolist()}"
                )
            if np.any(cache.dirty[slots]):
                raise PlanMismatch(
                    f"plan {t} evicts dirty rows of worker {self.worker} that were never "
                    f"written back: {plan.evict[cache.dirty[slots]][:5].tolist()}"
                )
            cache.remove(plan.evict)
        if plan.pull.shape[0]:
            self._pull_planned(plan)
            traffic.pulls += plan.pull.shape[0]
        mb = select(batch, plan.samples)
        slots = cache.slots(mb.keys)
        if np.any(slots < 0) or mb.keys.shape[0] != (
            plan.update_local.shape[0] + plan.push_grads.shape[0]
        ):
            raise PlanMismatch(
                f"plan {t} trains rows worker {self.worker} does not hold, or its update and "
                "push lists do not cover the mini-batch's keys"
            )
        traffic.hits += mb.keys.shape[0] - plan.pull.shape[0]
        loss, emb_grad, dense_grad = self._train(mb, slots)
        position = KeyIndex(mb.keys.shape[0])
        position.insert(mb.keys)  # key -> its row in the mini-batch's gradients
        if plan.update_local.shape[0]:
            local = position.lookup(plan.update_local)
            local_slots = slots[local]
            self._apply_locally(local_slots, emb_grad[self.xp.asarray(local)])
            cache.dirty[local_slots] = True
        if plan.push_grads.shape[0]:
            shared = position.lookup(plan.push_grads)
            grads = self._host(emb_grad[self.xp.asarray(shared)])
            self.ps.push_gradients(EMBEDDING_TABLE, plan.push_grads, grads, t)
            traffic.grad_pushes += plan.push_grads.shape[0]
        self.ps.push_dense_gradients(self.dense, self._host(dense_grad), t)
        if plan.write_back.shape[0]:
            self._write_back(plan.write_back)
            traffic.write_backs += plan.write_back.shape[0]
        if plan.final_flush:
            dirty = np.sort(cache.keys[cache.occupied & cache.dirty])
            if dirty.shape[0]:
                self._write_back(dirty)
            traffic.final_flush += dirty.shape[0]
        return traffic, loss

    def _check_write_backs(self, plan: CommPlan) -> None:
        """Before anything changes: every row to write back will be dirty by then (dirty
        now and not evicted or refreshed, or updated locally in this iteration)."""
        if not plan.write_back.shape[0]:
            return
        cache = self.cache
        slots = cache.slots(plan.write_back)
        dirty_now = np.zeros(slots.shape[0], dtype=bool)
        dirty_now[slots >= 0] = cache.dirty[slots[slots >= 0]]
        dirty_now &= ~np.isin(plan.write_back, plan.evict) & ~np.isin(plan.write_back, plan.pull)
        ok = dirty_now | np.isin(plan.write_back, plan.update_local)
        if not np.all(ok):
            raise PlanMismatch(
                f"plan {plan.iteration} writes back rows worker {self.worker} will not hold "
                f"dirty: {plan.write_back[~ok][:5].tolist()}"
            )

    def _pull_planned(self, plan: CommPlan) -> None:
        cache = self.cache
        slots = cache.slots(plan.pull)
        held = slots >= 0
        if np.any(cache.dirty[slots[held]]):
            raise PlanMismatch(
                f"plan {plan.iteration} pulls rows worker {self.worker} holds dirty (their "
                "local updates would be lost)"
            )
        if int(np.count_nonzero(~held)) > cache.free:
            raise PlanMismatch(
                f"plan {plan.iteration} pulls {int(np.count_nonzero(~held))} new rows into a "
                f"cache with {cache.free} free of {cache.capacity}"
            )
        values, versions, state = self._pull(plan.pull)
        if np.any(held):
            current = versions[held] == cache.clock[slots[held]]
            if np.any(current):
                raise PlanMismatch(
                    f"plan {plan.iteration} pulls rows worker {self.worker} already holds at "
                    f"the latest version: {plan.pull[held][current][:5].tolist()}"
                )
            cache.refresh(slots[held], values[held], state[held], versions[held])
        new = ~held
        cache.insert(plan.pull[new], values[new], state[new], versions[new])

    # ----- HET mode -------------------------------------------------------------
    def run_het(
        self, iteration: int, samples: Keys, batch: SparseDataset, final: bool
    ) -> tuple[Traffic, float]:
        """One BSP iteration of a HET worker with staleness ``job.staleness``."""
        cache, xp, s, t = self.cache, self.xp, self.job.staleness, iteration
        traffic = Traffic()
        mb = select(batch, samples)
        slots = cache.slots(mb.keys)
        cached = slots >= 0
        stale = np.zeros(mb.keys.shape[0], dtype=bool)
        if np.any(cached):
            clocks = self.ps.versions(EMBEDDING_TABLE, mb.keys[cached])
            traffic.version_checks += clocks.shape[0]
            stale[cached] = clocks > cache.clock[slots[cached]] + s  # CheckValid fails
            traffic.stale += int(np.count_nonzero(stale))
            # A stale row's own unpushed updates go to the PS before it is refetched.
            self._push_pending(slots[stale], t, traffic)
        missing = ~cached
        room = int(np.count_nonzero(missing)) - cache.free
        if room > 0:
            victims = cache.victims(room, keep=slots[cached])
            self._push_pending(cache.slots(victims), t, traffic)
            cache.remove(victims)
        fetch = missing | stale
        if np.any(fetch):
            values, versions, state = self._pull(mb.keys[fetch])
            traffic.pulls += int(np.count_nonzero(fetch))
            refetched = stale[fetch]
            cache.refresh(slots[stale], values[refetched], state[refetched], versions[refetched])
            new = ~refetched
            slots[missing] = cache.insert(mb.keys[missing], values[new], state[new], versions[new])
        traffic.hits += int(np.count_nonzero(~fetch))
        loss, emb_grad, dense_grad = self._train(mb, slots)
        if s == 0:
            self.ps.push_gradients(EMBEDDING_TABLE, mb.keys, self._host(emb_grad), t)
            traffic.grad_pushes += mb.keys.shape[0]
            cache.remove(mb.keys)  # every copy is stale after the commit
        else:
            device_slots = xp.asarray(slots)
            cache.pending[device_slots] += emb_grad
            self._apply_locally(slots, emb_grad)
            cache.dirty[slots] = True
            over = slots[cache.clock[slots] - cache.start[slots] > s]
            self._push_pending(over, t, traffic)
            traffic.bound_releases += over.shape[0]
            cache.remove(cache.keys[over])
        self.ps.push_dense_gradients(self.dense, self._host(dense_grad), t)
        if final:
            leftover = np.flatnonzero(cache.occupied & cache.dirty)
            flushed = Traffic()
            self._push_pending(leftover, t, flushed)
            traffic.final_flush += flushed.grad_pushes
        return traffic, loss

    def _push_pending(self, slots: npt.NDArray[np.int64], iteration: int, traffic: Traffic) -> None:
        """Push the accumulated gradients of those ``slots`` that have any (the dirty ones)."""
        cache = self.cache
        slots = slots[cache.dirty[slots]]
        if not slots.shape[0]:
            return
        grads = self._host(cache.pending[self.xp.asarray(slots)])
        self.ps.push_gradients(EMBEDDING_TABLE, cache.keys[slots], grads, iteration)
        cache.pending[self.xp.asarray(slots)] = 0
        cache.dirty[slots] = False
        traffic.grad_pushes += slots.shape[0]
