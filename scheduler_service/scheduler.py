"""The fast scheduler: a pipeline of stages over an exact mirror of every worker cache.

``Batch`` -> ``Partitioner`` (sequential / location-aware, Herald Algorithm 1)
-> ``CacheMirror.apply`` (LRU touches, pulls, evictions) -> ``SyncPlanner``
(naive / on-demand write-backs) -> one ``CommPlan`` per worker. A plan is
released one batch late: its write-backs depend on who needs which row in
the next batch (on-demand synchronisation, Herald section 3.1).

Modes (Herald Table 1): ``naive`` = sequential + naive, ``on_demand`` =
sequential + on-demand, ``location_aware`` = location-aware + naive,
``herald`` = location-aware + on-demand.
"""

from __future__ import annotations

import abc

import numpy as np
import numpy.typing as npt

from heraldps import hostmem
from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.keyindex import KeyIndex, empty_slot_table
from scheduler_service import kernels
from scheduler_service.batch import Batch
from scheduler_service.plan import CommPlan, TrafficCounts

MAX_WORKERS = 64  # one bit per worker in the mirror's holder masks
STRIDE = 64  # (kid, worker) packed as kid * STRIDE + worker
_RECORD_FIELDS = 6
DENSE_SLOT_WORKERS = 16  # up to this many workers, cache slots live in the key's record


class CacheMirror:
    """Exact model of every worker's LRU cache: which rows, in which order, valid or dirty."""

    def __init__(self, num_workers: int, capacity: int) -> None:
        if not 1 <= num_workers <= MAX_WORKERS:
            raise InvalidArgument(f"workers must be in 1..{MAX_WORKERS}, got {num_workers}")
        if capacity < 1:
            raise InvalidArgument(f"cache capacity must be >= 1 row, got {capacity}")
        self.num_workers = num_workers
        self.capacity = capacity
        self.index = KeyIndex()
        self.kid_key = np.empty(0, np.int64)
        # One record per key, so every stage touches one place in memory per key:
        # holders, present, trainers (masks), stamp, seen (scratch stamps),
        # dirty_owner, then (up to 16 workers) the key's cache slot in each
        # worker as int32.
        self.dense = num_workers <= DENSE_SLOT_WORKERS
        self._record_width = _RECORD_FIELDS + (DENSE_SLOT_WORKERS // 2 if self.dense else 0)
        self._set_records(np.zeros((0, self._record_width), np.int64))
        self.slot_kid = np.empty(0, np.int64)
        self.prev = np.empty(0, np.int64)
        self.nxt = np.empty(0, np.int64)
        self.head = np.full(num_workers, -1, np.int64)
        self.tail = np.full(num_workers, -1, np.int64)
        self.used = np.zeros(num_workers, np.int64)
        self.pool = np.zeros(1, np.int64)
        self.table = empty_slot_table(1024)
        self.samples_seen = 0
        self.batches_seen = 0

    def kids(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Dense ids of ``keys``, registering new ones."""
        known = len(self.index)
        kids = self.index.insert(keys)
        n = len(self.index)
        if n > self.holders.shape[0]:
            cap = max(n, 2 * self.holders.shape[0], 1024)
            old = self._records.shape[0]
            records = hostmem.grown(self._records, cap)
            records[old:, 3:6] = -1  # stamp, seen: never; dirty_owner: nobody
            self._set_records(records)
            self.kid_key = hostmem.grown(self.kid_key, cap, 0)
        fresh = kids >= known
        self.kid_key[kids[fresh]] = keys[fresh]
        return kids

    def _set_records(self, records: npt.NDArray[np.int64]) -> None:
        self._records = records
        as_unsigned = records.view(np.uint64)
        self.holders, self.present = as_unsigned[:, 0], as_unsigned[:, 1]
        self.trainers = as_unsigned[:, 2]
        self.stamp, self.seen, self.dirty_owner = records[:, 3], records[:, 4], records[:, 5]
        if self.dense:
            first = 2 * _RECORD_FIELDS
            self.slots = records.view(np.int32)[:, first : first + self.num_workers]
        else:
            self.slots = np.zeros((1, 1), np.int32)

    def reserve_entries(self, new_entries: int) -> None:
        """Room for ``new_entries`` more cache entries in the slot pool and the table."""
        need = int(self.pool[0]) + new_entries
        if need > self.slot_kid.shape[0]:
            cap = max(need, 2 * self.slot_kid.shape[0], 1024)
            self.slot_kid = hostmem.grown(self.slot_kid, cap, -1)
            self.prev = hostmem.grown(self.prev, cap, -1)
            self.nxt = hostmem.grown(self.nxt, cap, -1)
        if not self.dense and 2 * need > self.table.shape[0]:
            size = self.table.shape[0]
            while size < 2 * need:
                size *= 2
            table = empty_slot_table(size)
            kernels.rehash(self.table, table)
            self.table = table

    def dirty_rows(self) -> int:
        return int((self.dirty_owner[: len(self.index)] >= 0).sum())


# ----- stages ---------------------------------------------------------------------
class Partitioner(abc.ABC):
    """Decides which worker trains each sample of a batch."""

    @abc.abstractmethod
    def assign(
        self, batch: Batch, kids: npt.NDArray[np.int64], mirror: CacheMirror
    ) -> npt.NDArray[np.int64]:
        """Worker of every sample; each worker gets exactly ``samples_per_worker``."""


class SequentialPartitioner(Partitioner):
    """Sample i goes to worker i // m (a plain data loader)."""

    def assign(
        self, batch: Batch, kids: npt.NDArray[np.int64], mirror: CacheMirror
    ) -> npt.NDArray[np.int64]:
        return np.arange(batch.samples, dtype=np.int64) // batch.samples_per_worker


class LocationAwarePartitioner(Partitioner):
    """Herald Algorithm 1, scored on the mirror's valid copies at the start of the batch."""

    def assign(
        self, batch: Batch, kids: npt.NDArray[np.int64], mirror: CacheMirror
    ) -> npt.NDArray[np.int64]:
        assign: npt.NDArray[np.int64] = kernels.location_aware_assign(
            batch.offsets, kids, mirror.holders, mirror.seen, mirror.samples_seen,
            batch.num_workers, batch.samples_per_worker,
        )  # fmt: skip
        return assign


class SyncPlanner(abc.ABC):
    """Decides when a row a single worker updated goes back to the PS."""

    on_demand: bool


class NaiveSync(SyncPlanner):
    """Every updated row is written back in the iteration that updated it."""

    on_demand = False


class OnDemandSync(SyncPlanner):
    """Rows stay dirty on their worker until another worker needs them, or eviction."""

    on_demand = True


MODES: dict[str, tuple[type[Partitioner], type[SyncPlanner]]] = {
    "naive": (SequentialPartitioner, NaiveSync),
    "on_demand": (SequentialPartitioner, OnDemandSync),
    "location_aware": (LocationAwarePartitioner, NaiveSync),
    "herald": (LocationAwarePartitioner, OnDemandSync),
}


class Scheduler:
    """Plans batches in order; ``submit`` returns the previous batch's final plans."""

    def __init__(self, num_workers: int, capacity: int, mode: str = "herald") -> None:
        if mode not in MODES:
            raise InvalidArgument(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        partitioner, planner = MODES[mode]
        self.mode = mode
        self.partitioner = partitioner()
        self.planner = planner()
        self.mirror = CacheMirror(num_workers, capacity)
        self.counts = TrafficCounts()
        self.next_iteration: int | None = None
        self._pending: list[CommPlan] = []

    @property
    def num_workers(self) -> int:
        return self.mirror.num_workers

    def submit(self, batch: Batch) -> list[CommPlan]:
        mirror = self.mirror
        n = mirror.num_workers
        if batch.num_workers != n:
            raise InvalidArgument(f"batch is split over {batch.num_workers} workers, not {n}")
        if self.next_iteration is not None and batch.iteration != self.next_iteration:
            raise FailedPrecondition(
                f"batch for iteration {batch.iteration} is out of order: the scheduler "
                f"expects iteration {self.next_iteration}"
            )
        kids = mirror.kids(batch.keys)
        # The stamps only tell scratch entries of this batch from older ones, so
        # they advance even when the batch is then rejected.
        assign = self.partitioner.assign(batch, kids, mirror)
        mirror.samples_seen += batch.samples
        batch_keys, wl_offsets, wl_kids = kernels.worker_lists(
            batch.offsets, kids, assign, n, mirror.stamp, mirror.trainers, mirror.batches_seen
        )
        mirror.batches_seen += 1
        sizes = np.diff(wl_offsets)
        if sizes.max(initial=0) > mirror.capacity:
            w = int(sizes.argmax())
            raise InvalidArgument(
                f"worker {w}'s mini-batch of iteration {batch.iteration} needs {int(sizes[w])} "
                f"rows, more than its cache of {mirror.capacity}; raise the cache size or "
                "lower the batch size"
            )
        # Validated: from here on the mirror changes.
        mirror.reserve_entries(int(wl_kids.shape[0]))
        ev_offsets, evicted, pl_offsets, pulled, dirty_evicted, hits = kernels.cache_ops(
            wl_offsets, wl_kids, n, mirror.capacity, mirror.holders, mirror.present,
            mirror.dirty_owner,
            mirror.slot_kid, mirror.prev, mirror.nxt, mirror.head, mirror.tail, mirror.used,
            mirror.pool, mirror.table, mirror.slots, mirror.dense, STRIDE,
        )  # fmt: skip
        ordered, co_start = kernels.split_co_trained(wl_offsets, wl_kids, mirror.trainers)
        wb_prev, wb_now = kernels.settle(
            batch_keys, mirror.trainers, mirror.holders, mirror.dirty_owner, dirty_evicted,
            self.planner.on_demand, STRIDE,
        )  # fmt: skip
        self.counts.hits += int(hits)

        keys_of = mirror.kid_key
        evict_keys, pull_keys, trained_keys = keys_of[evicted], keys_of[pulled], keys_of[ordered]
        samples_order = np.argsort(assign, kind="stable")
        m = batch.samples_per_worker
        now_by_worker = _split_packed(wb_now, n, keys_of)
        plans = [
            CommPlan(
                iteration=batch.iteration,
                worker=w,
                samples=samples_order[w * m : (w + 1) * m],
                evict=evict_keys[ev_offsets[w] : ev_offsets[w + 1]],
                pull=pull_keys[pl_offsets[w] : pl_offsets[w + 1]],
                update_local=trained_keys[wl_offsets[w] : co_start[w]],
                push_grads=trained_keys[co_start[w] : wl_offsets[w + 1]],
                write_back=now_by_worker[w],
            )
            for w in range(n)
        ]
        released = self._release(_split_packed(wb_prev, n, keys_of))
        self._pending = plans
        self.next_iteration = batch.iteration + 1
        self.counts.iterations += 1
        return released

    def finish(self) -> list[CommPlan]:
        """Release the last plans; rows still dirty are counted as the final flush."""
        released = self._release([np.empty(0, np.int64)] * self.num_workers)
        self.counts.final_flush = self.mirror.dirty_rows()
        return released

    def _release(self, extra: list[npt.NDArray[np.int64]]) -> list[CommPlan]:
        for plan in self._pending:
            plan.write_back = np.sort(np.concatenate([plan.write_back, extra[plan.worker]]))
            self.counts.add_plan(plan)
        released, self._pending = self._pending, []
        return released


def _split_packed(
    packed: npt.NDArray[np.int64], num_workers: int, keys_of: npt.NDArray[np.int64]
) -> list[npt.NDArray[np.int64]]:
    """``kid * STRIDE + worker`` entries -> sorted keys per worker."""
    workers = packed % STRIDE
    keys = keys_of[packed // STRIDE]
    order = np.lexsort((keys, workers))
    bounds = np.concatenate(([0], np.cumsum(np.bincount(workers, minlength=num_workers))))
    keys = keys[order]
    return [keys[bounds[w] : bounds[w + 1]] for w in range(num_workers)]
