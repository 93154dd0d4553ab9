"""A plain, slow reference of the scheduler: Herald's Algorithm 1 and on-demand sync.

Written to be read next to the paper (Herald, sections 3.1-3.2) and the
counting model of docs/scheduler.md; the fast scheduler (``scheduler.py``) must
produce identical assignments and plans. Caches are dicts of ``key -> CachedRow``
with explicit versions, replaced by CLOCK (a ``deque`` of the cached keys in the
order they came in, and a set of the keys used since their entry last came round);
a copy is *valid* when its version is the latest version of the key anywhere.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from heraldps.errors import InvalidArgument
from heraldps.modes import (
    EARLY_WRITE_BACK_ALL,
    check_look_ahead,
    early_write_back_cap,
    mode_named,
)
from heraldps.plan import CommPlan
from heraldps.traffic import Traffic
from scheduler_service.batch import Batch


@dataclass
class CachedRow:
    version: int
    dirty: bool


class ReferenceScheduler:
    """``partition``: "sequential" | "location_aware"; ``sync``: "naive" | "on_demand"."""

    def __init__(
        self,
        num_workers: int,
        capacity: int,
        partition: str,
        sync: str,
        early: bool = False,
        early_write_back: int = EARLY_WRITE_BACK_ALL,
        look_ahead: int = 1,
        prefetch_plans: int = 1,
    ) -> None:
        self.num_workers = num_workers
        self.look_ahead = check_look_ahead(look_ahead)
        # Rows per worker written back early (dirty, unused in the next batch, not
        # updated in their own iteration), lowest keys first: up to ``early_cap`` (None:
        # every one), or none.
        self.early_cap = early_write_back_cap(early_write_back)
        self.early_write_back = early_write_back != 0 and sync == "on_demand"
        # Mark early pulls: keys of the last released iterations' pushes and write-backs,
        # the newest last (none before the first release, when nothing is marked); with
        # ``prefetch_plans`` above 1, the last that many, for each early key's lead.
        self.early = early
        self.prefetch_plans = prefetch_plans
        self.changed_before: deque[set[int]] = deque(maxlen=prefetch_plans)
        self.later_before: set[int] = set()  # push_later of the last released iteration
        self.capacity = capacity
        self.partition = partition
        self.sync = sync
        self.caches: list[dict[int, CachedRow]] = [{} for _ in range(num_workers)]
        self.clocks: list[deque[int]] = [deque() for _ in range(num_workers)]
        self.referenced: list[set[int]] = [set() for _ in range(num_workers)]
        self.latest: dict[int, int] = {}  # newest version of a key anywhere
        self.ps_version: dict[int, int] = {}  # version the PS holds
        self.pending: list[CommPlan] = []  # plans of the previous iteration (write-backs open)
        self.ahead: list[Batch] = []  # batches submitted, not planned (look_ahead - 1)
        self.counts = Traffic()

    @classmethod
    def for_mode(
        cls,
        num_workers: int,
        capacity: int,
        mode: str,
        early_write_back: int = EARLY_WRITE_BACK_ALL,
        look_ahead: int = 1,
        prefetch_plans: int = 1,
    ) -> ReferenceScheduler:
        fields = mode_named(mode)
        sync = "on_demand" if fields.on_demand_sync else "naive"
        return cls(num_workers, capacity, fields.partitioner, sync, early=fields.early_pulls,
                   early_write_back=early_write_back, look_ahead=look_ahead,
                   prefetch_plans=prefetch_plans)  # fmt: skip

    def valid(self, worker: int, key: int) -> bool:
        row = self.caches[worker].get(key)
        return row is not None and row.version == self.latest.get(key, 0)

    # ----- Algorithm 1 -----------------------------------------------------
    def assign(self, batch: Batch) -> list[int]:
        n, m = self.num_workers, batch.samples_per_worker
        room = [m] * n
        assignment = []
        for i in range(batch.samples):
            keys = set(batch.sample_keys(i).tolist())
            scores = [sum(1 for k in keys if self.valid(w, k)) for w in range(n)]
            if self.partition == "sequential":
                best = i // m
            else:
                best, best_score = -1, -1
                for w in range(n):
                    if room[w] > 0 and scores[w] > best_score:
                        best, best_score = w, scores[w]
            assignment.append(best)
            room[best] -= 1
            # Locality: the sample went to a worker holding the most of its keys.
            if max(scores) > 0:
                self.counts.held_samples += 1
                self.counts.local_samples += scores[best] == max(scores)
        return assignment

    # ----- one batch -------------------------------------------------------
    def submit(self, batch: Batch) -> list[CommPlan]:
        """Hold ``batch``; plan the oldest batch held once ``look_ahead - 1`` are held
        behind it (every one for a flush); return the plans that became final."""
        self.ahead.append(batch)
        released: list[CommPlan] = []
        while len(self.ahead) > (0 if batch.flush else self.look_ahead - 1):
            released += self._plan(self.ahead.pop(0))
        return released

    def _plan(self, batch: Batch) -> list[CommPlan]:
        """Plan ``batch`` seeing the batches held behind it (``self.ahead``); return the
        now final plans of the previous batch."""
        n = self.num_workers
        # The keys the batches held behind this one use: a cached key among them is
        # evicted only after every other (within one revolution of the clock), and a dirty
        # one is not written back early.
        window = {k for b in self.ahead for k in b.keys.tolist()}
        assignment = self.assign(batch)
        plans = [CommPlan(batch.iteration, w) for w in range(n)]
        # A worker's mini-batch: the distinct keys of its samples, in order of first
        # occurrence in the whole batch.
        first: dict[int, int] = {}
        for k in batch.keys.tolist():
            first.setdefault(k, len(first))
        worker_keys: list[list[int]] = [[] for _ in range(n)]
        for w in range(n):
            samples = [i for i in range(batch.samples) if assignment[i] == w]
            plans[w].samples = np.array(samples, dtype=np.int64)
            seen: dict[int, None] = {}
            for i in samples:
                for k in batch.sample_keys(i).tolist():
                    seen.setdefault(k)
            worker_keys[w] = sorted(seen, key=first.__getitem__)
            if len(seen) > self.capacity:
                raise InvalidArgument(
                    f"worker {w}'s mini-batch of iteration {batch.iteration} needs {len(seen)} "
                    f"rows, more than its cache of {self.capacity}"
                )
        trainers: dict[int, list[int]] = {}
        for w in range(n):
            for k in worker_keys[w]:
                trainers.setdefault(k, []).append(w)

        # Lookahead write-backs of the previous iteration: a dirty row another
        # worker needs now goes back to the PS before this iteration starts.
        previous = {plan.worker: [] for plan in self.pending}  # type: dict[int, list[int]]
        for w in range(n):
            for k, row in self.caches[w].items():
                if row.dirty and any(t != w for t in trainers.get(k, [])):
                    self._write_back(w, k, previous)

        # Cache operations (CLOCK): pulls of every key without a valid copy, in
        # first-occurrence order; room for the keys not cached, made at the head of the
        # clock: a key of this mini-batch, or one used since its entry last came round
        # (the mark is cleared), goes round again; any other is evicted.
        evict: list[list[int]] = [[] for _ in range(n)]
        pull: list[list[int]] = [[] for _ in range(n)]
        for w in range(n):
            cache, clock, used = self.caches[w], self.clocks[w], self.referenced[w]
            mine = set(worker_keys[w])
            for k in worker_keys[w]:
                if self.valid(w, k):
                    self.counts.hits += 1
                else:
                    assert self.ps_version.get(k, 0) == self.latest.get(k, 0), "lost update"
                    pull[w].append(k)
            missing = [k for k in worker_keys[w] if k not in cache]
            need = len(cache) + len(missing) - self.capacity
            # With look-ahead, eviction goes by levels, each for as many candidates (keys
            # neither trained now nor referenced) as keys cached: 1 evicts only clean keys
            # the window does not use, 2 any clean key, 3 dirty keys the window does not
            # use too, 4 any (CLOCK, as without look-ahead).
            level, moves, cached = (1 if self.look_ahead > 1 else 4), 0, len(cache)
            while need > 0:
                victim = clock.popleft()
                if victim in mine or victim in used:
                    if victim not in mine:
                        used.discard(victim)
                    clock.append(victim)
                    continue
                if level < 4 and moves >= cached:
                    level, moves = level + 1, 0
                if level < 4:
                    moves += 1
                    dirty, ahead = cache[victim].dirty, victim in window
                    spared = {1: dirty or ahead, 2: dirty, 3: ahead}[level]
                    if spared:
                        clock.append(victim)
                        continue
                if cache[victim].dirty:  # evicting a dirty row: written back at the end of t-1
                    self._write_back(w, victim, previous)
                del cache[victim]
                used.discard(victim)
                evict[w].append(victim)
                need -= 1
                cached -= 1
            for k in pull[w]:  # a pulled copy is the PS's: the latest, clean
                cache[k] = CachedRow(self.latest.get(k, 0), False)
            clock.extend(missing)
            used.update(worker_keys[w])

        # Early write-backs of the previous iteration: rows dirty at its end that no
        # worker uses now nor in the window and their owner did not update in it.
        if self.early_write_back and self.pending:
            for plan in self.pending:
                w, updated = plan.worker, set(plan.update_local.tolist())
                idle = sorted(
                    k for k, row in self.caches[w].items()
                    if row.dirty and k not in trainers and k not in updated
                    and k not in window
                )  # fmt: skip
                for k in idle[: self.early_cap]:
                    self._write_back(w, k, previous)

        # Training: every key of a worker's mini-batch is updated by it. A key several
        # workers train goes through the PS (gradients pushed); with on-demand sync and a
        # look-ahead window, so does a key one worker trains that no batch in the window
        # uses, unless that worker's copy is dirty (pass-through rows).
        through = self.sync == "on_demand" and self.look_ahead > 1
        co_trained = {
            k for k, ws in trainers.items()
            if len(ws) > 1 or (through and k not in window and not self.caches[ws[0]][k].dirty)
        }  # fmt: skip
        update_local: list[list[int]] = [[] for _ in range(n)]
        push_grads: list[list[int]] = [[] for _ in range(n)]
        write_back: list[list[int]] = [[] for _ in range(n)]
        for w in range(n):
            for k in worker_keys[w]:
                (push_grads if k in co_trained else update_local)[w].append(k)
        for k, ws in trainers.items():
            for w in ws:
                assert self.valid(w, k), "a worker trains a row it does not hold"
            new_version = self.latest.get(k, 0) + 1
            self.latest[k] = new_version
            if k in co_trained:  # gradients pushed, summed and applied once at commit
                self.ps_version[k] = new_version
                continue
            w = ws[0]
            self.caches[w][k] = CachedRow(new_version, self.sync == "on_demand")
            if self.sync == "naive":
                self.ps_version[k] = new_version
                write_back[w].append(k)

        # Pass-through gradients may go with the next plans, into the next iteration's
        # buffer, when that batch is held, trains with the same learning rate and this
        # one is no flush (push_later).
        defer = (
            through and not batch.flush and bool(self.ahead)
            and self.ahead[0].lr_scale == batch.lr_scale
        )  # fmt: skip
        released = self._release_pending(previous)
        for w in range(n):
            if defer:
                later = [k for k in push_grads[w] if len(trainers[k]) == 1]
                plans[w].push_later = np.array(later, dtype=np.int64)
            plans[w].evict = np.array(evict[w], dtype=np.int64)
            plans[w].pull = np.array(pull[w], dtype=np.int64)
            plans[w].update_local = np.array(update_local[w], dtype=np.int64)
            plans[w].push_grads = np.array(push_grads[w], dtype=np.int64)
            plans[w].write_back = np.array(sorted(write_back[w]), dtype=np.int64)
        self.pending = plans
        self.counts.iterations += 1
        return released

    def finish(self) -> list[CommPlan]:
        """Plan the batches held, release the last plans; rows still dirty are the final
        flush."""
        released: list[CommPlan] = []
        while self.ahead:
            released += self._plan(self.ahead.pop(0))
        released += self._release_pending({plan.worker: [] for plan in self.pending})
        self.counts.final_flush = sum(
            1 for cache in self.caches for row in cache.values() if row.dirty
        )
        return released

    def _write_back(self, worker: int, key: int, previous: dict[int, list[int]]) -> None:
        row = self.caches[worker][key]
        row.dirty = False
        self.ps_version[key] = row.version
        previous.setdefault(worker, []).append(key)

    def _release_pending(self, extra: dict[int, list[int]]) -> list[CommPlan]:
        for plan in self.pending:
            added = extra.get(plan.worker, [])
            plan.write_back = np.array(sorted([*plan.write_back.tolist(), *added]), np.int64)
        if self.early and self.pending:
            if self.changed_before:
                for plan in self.pending:
                    early, leads = [], []
                    for k in plan.pull.tolist():
                        # Iterations back, from the newest, that leave k unchanged.
                        lead = next((back for back, changed in
                                     enumerate(reversed(self.changed_before)) if k in changed),
                                    len(self.changed_before))  # fmt: skip
                        if lead:
                            early.append(k)
                            leads.append(lead)
                    plan.pull_early = np.array(early, dtype=np.int64)
                    if self.prefetch_plans > 1:
                        plan.pull_early_from = np.array(leads, dtype=np.uint8)
            self.changed_before.append(
                {
                    k
                    for plan in self.pending
                    for k in [*plan.push_grads.tolist(), *plan.write_back.tolist()]
                }
                | self.later_before
            )  # gradients sent later are applied by this commit
            self.later_before = {k for plan in self.pending for k in plan.push_later.tolist()}
        for plan in self.pending:
            self.counts.add_plan(plan)
        released, self.pending = self.pending, []
        return released
