"""The fast scheduler: a pipeline of stages over an exact mirror of every worker cache.

``Batch`` -> ``Partitioner`` (sequential / location-aware, Herald Algorithm 1)
-> ``CacheMirror`` updates (LRU touches, pulls, evictions) -> ``SyncPlanner``
(naive / on-demand write-backs) -> one ``CommPlan`` per worker. A plan is
released one batch late: its write-backs depend on who needs which row in
the next batch (on-demand synchronisation, Herald section 3.1).

Modes (Herald Table 1): ``naive`` = sequential + naive, ``on_demand`` =
sequential + on-demand, ``location_aware`` = location-aware + naive,
``herald`` = location-aware + on-demand. ``herald_pipelined`` plans exactly as
``herald`` and adds one stage at release, :class:`EarlyPulls`, which marks the
pulls the previous iteration cannot change.
"""

from __future__ import annotations

import abc
import itertools
import time
from collections import deque
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from heraldps.errors import CacheTooSmall, FailedPrecondition, InvalidArgument
from heraldps.modes import (
    EARLY_WRITE_BACK_ALL,
    HERALD_MODES,
    HET_MODE,
    LOCATION_AWARE,
    SEQUENTIAL,
    check_look_ahead,
    check_prefetch_plans,
    early_write_back_cap,
    mode_named,
)
from heraldps.plan import CommPlan
from heraldps.traffic import Traffic
from scheduler_service import kernels
from scheduler_service.batch import Batch
from scheduler_service.mirror import CacheMirror, Numbering
from scheduler_service.split import HelperChoice, Relay, run_pieces
from scheduler_service.window import Window


def check_next_batch(batch: Batch, num_workers: int, next_iteration: int | None) -> None:
    """A batch must be split over the scheduler's workers and come in iteration order."""
    if batch.num_workers != num_workers:
        raise InvalidArgument(f"batch is split over {batch.num_workers} workers, not {num_workers}")
    if next_iteration is not None and batch.iteration != next_iteration:
        raise FailedPrecondition(
            f"batch for iteration {batch.iteration} is out of order: the scheduler "
            f"expects iteration {next_iteration}"
        )


# ----- stages ---------------------------------------------------------------------
@dataclass(frozen=True)
class Assignment:
    """A partitioner's answer, and how local it is (the quantity Algorithm 1 maximises).

    ``held``: samples at least one of whose keys some worker holds validly at the start
    of the batch; ``local``: those assigned to a worker that holds the most of their keys.
    """

    workers: npt.NDArray[np.int64]  # worker of every sample
    held: int
    local: int
    order: npt.NDArray[np.int64]  # samples grouped by worker, input order within one


MiniBatches = tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]
"""(offsets, trainers): ``trainers[lid]`` bit w: worker w trains key ``lid``; worker w
trains ``offsets[w + 1] - offsets[w]`` distinct keys. Its mini-batch is those keys in lid
order (first occurrence in the batch)."""


class Partitioner(abc.ABC):
    """Decides which worker trains each sample of a batch (:func:`_front` runs it)."""

    @abc.abstractmethod
    def given(self, batch: Batch) -> npt.NDArray[np.int64]:
        """Each sample's worker when the partitioner fixes it, empty for Herald's
        Algorithm 1 (each worker gets exactly ``samples_per_worker``)."""


class SequentialPartitioner(Partitioner):
    """Sample i goes to worker i // m (a plain data loader).

    Its locality costs Algorithm 1's scoring, without choosing.
    """

    def given(self, batch: Batch) -> npt.NDArray[np.int64]:
        return np.arange(batch.samples, dtype=np.int64) // batch.samples_per_worker


class LocationAwarePartitioner(Partitioner):
    """Herald Algorithm 1, scored on the mirror's valid copies at the start of the batch."""

    def given(self, batch: Batch) -> npt.NDArray[np.int64]:
        return np.empty(0, np.int64)


FRONT_CHUNKS = 8  # chunks of samples a big batch's front stages are pipelined in


def _front(
    batch: Batch, mirror: CacheMirror, given: npt.NDArray[np.int64], parallel: bool
) -> tuple[Numbering, Assignment, MiniBatches]:
    """The front of a batch's plan, chunk by chunk of samples: number the chunk's keys
    (this thread), read the records of the keys it found (``Numbering.read``), choose the
    chunk's workers (``kernels.choose_chunk``, this thread: Algorithm 1 is sequential,
    each choice takes room from the next), mark which workers train each key
    (``kernels.mark_chunk``). Each kind runs in chunk order. With ``parallel`` (a core is
    idle) a big batch is pipelined: while this thread numbers chunk c + 1 and chooses
    chunk c, the helper reads the records of chunk c + 1 and marks chunk c - 1; a task the
    helper has not started when this thread needs it runs here (``split.Relay``)."""
    n, m, samples = batch.num_workers, batch.samples_per_worker, batch.samples
    total = batch.keys.shape[0]
    numbering = mirror.numbering(batch.keys)
    pipelined = parallel and total >= PARALLEL_KEYS and samples >= 2 * FRONT_CHUNKS
    bounds = np.linspace(0, samples, (FRONT_CHUNKS if pipelined else 1) + 1).astype(int)
    chunks = bounds.shape[0] - 1
    key_bounds, sample_bounds = batch.offsets[bounds].tolist(), bounds.tolist()
    found = [0] * (chunks + 1)  # distinct keys numbered by the end of each chunk
    seen = mirror.scratch("seen", total)
    trainers = mirror.scratch("trainers", total).view(np.uint64)
    room = np.full(n, m, np.int64)
    choice_state = np.zeros(3, np.int64)
    counts = np.zeros(n + 1, np.int64)
    assign = np.empty(samples, np.int64)

    def read(c: int) -> None:
        lo, hi = found[c], found[c + 1]
        numbering.read(lo, hi)
        seen[lo:hi] = -1
        trainers[lo:hi] = 0

    def mark(c: int) -> None:
        a, b = sample_bounds[c], sample_bounds[c + 1]
        kernels.mark_chunk(batch.offsets, numbering.lids, assign, trainers, counts[1:], a, b)

    reads, marks = Relay(chunks, read), Relay(chunks, mark)

    def choose(c: int) -> None:
        reads.run_upto(c)
        a, b = sample_bounds[c], sample_bounds[c + 1]
        kernels.choose_chunk(batch.offsets, numbering.lids, numbering.held, numbering.hold,
                             seen, room, choice_state, assign, a, b, given)  # fmt: skip
        if pipelined:
            marks.offer(c)

    for c in range(chunks):
        found[c + 1] = numbering.number(key_bounds[c], key_bounds[c + 1])
        if pipelined:
            reads.offer(c)
        if c:
            choose(c - 1)
    choose(chunks - 1)
    marks.run_upto(chunks - 1)
    held, local = int(choice_state[1]), int(choice_state[2])
    order = kernels.samples_by_worker(assign, n, m)
    assignment = Assignment(assign, held, local, order)
    return numbering, assignment, (np.cumsum(counts), trainers[: numbering.nb])


class SyncPlanner(abc.ABC):
    """Decides when a row a single worker updated goes back to the PS."""

    on_demand: bool


class NaiveSync(SyncPlanner):
    """Every updated row is written back in the iteration that updated it."""

    on_demand = False


class OnDemandSync(SyncPlanner):
    """Rows stay dirty on their worker until another worker needs them, or eviction."""

    on_demand = True


class EarlyPulls:
    """Marks, in each released plan, the pulls the previous released iteration cannot
    change (``CommPlan.pull_early``): keys no worker pushes a gradient for or writes back
    in it. A row changes on the PS only by a write-back or by the commit of pushed
    gradients, so such a key's row after that iteration's commit is the one on the PS
    while it trains. The first plans a scheduler releases get no marks (it does not know
    the iteration before them). A final flush has no next plan, so it needs no place here.

    With ``depth`` above 1 (``--prefetch-plans``: plan t+depth flows once t-1 is
    committed) each early key also gets how many of the iterations before its plan leave
    it unchanged (``CommPlan.pull_early_from``, 1 to ``depth``), from the keys the last
    ``depth`` released iterations changed. Iterations before the first one released are
    committed when it is, so a key none of the recorded ones changes gets their number.
    """

    def __init__(self, depth: int = 1) -> None:
        self.depth = depth
        # The keys each of the last ``depth`` released iterations changes (sorted,
        # distinct), the newest last.
        self._changed: deque[npt.NDArray[np.int64]] = deque(maxlen=depth)
        self._later = np.empty(0, np.int64)  # the last iteration's ``push_later``

    def mark(self, plans: list[CommPlan]) -> None:
        """Set ``pull_early`` (and ``pull_early_from``) of ``plans`` (one iteration's,
        final lists) and remember the keys they change for the next iterations' plans:
        their pushes and write-backs, and the gradients the iteration before sent later,
        which their commit applies."""
        if self._changed:
            for plan in plans:
                leads = self.leads(plan.pull)
                early = leads > 0
                plan.pull_early = plan.pull[early]
                if self.depth > 1:
                    plan.pull_early_from = leads[early].astype(np.uint8)
        if plans:
            lists = [a for p in plans for a in (p.push_grads, p.write_back)]
            self._changed.append(np.unique(np.concatenate([*lists, self._later])))
            self._later = np.concatenate([p.push_later for p in plans])

    def leads(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """For each of ``keys``, how many of the recorded iterations, from the newest back,
        leave it unchanged: 0 when the newest changes it."""
        leads = np.full(keys.shape[0], len(self._changed), dtype=np.int64)
        open_ = np.arange(keys.shape[0])  # keys no newer iteration changes: still searched
        for back, changed in enumerate(reversed(self._changed)):
            hit = _member(keys[open_], changed)
            leads[open_[hit]] = back
            open_ = open_[~hit]
        return leads


def _pass_through_keys(
    trainers: npt.NDArray[np.uint64], ops: npt.NDArray[np.uint64]
) -> npt.NDArray[np.int64]:
    """Sorted keys of the batch that one worker trains but whose gradient goes to the PS
    (stage 3 marked them co-trained: pass-through rows)."""
    single = (trainers != 0) & ((trainers & (trainers - np.uint64(1))) == 0)
    co = (ops[:, kernels.OP_KID] & kernels.CO_TRAINED) != 0
    return np.sort(ops[single & co, kernels.OP_KEY].astype(np.int64))


def _member(
    keys: npt.NDArray[np.int64], sorted_set: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """``np.isin(keys, sorted_set)`` by binary search on the already sorted set."""
    if not sorted_set.shape[0]:
        return np.zeros(keys.shape[0], dtype=bool)
    at = np.searchsorted(sorted_set, keys)
    found: npt.NDArray[np.bool_] = sorted_set[np.minimum(at, sorted_set.shape[0] - 1)] == keys
    return found


PARTITIONERS: dict[str, type[Partitioner]] = {
    SEQUENTIAL: SequentialPartitioner,
    LOCATION_AWARE: LocationAwarePartitioner,
}
"""The class behind each ``Mode.partitioner``."""

MODES = HERALD_MODES
"""The modes :class:`Scheduler` plans (every mode but HET, which plans samples only)."""


STAGES = ("front", "touch_keys", "evict_and_list", "plans")
"""The stages of ``Scheduler.submit``, in order (docs/scheduler.md#the-cache-mirror)."""


class _StageClock:
    """Adds the wall time since the last lap to a stage's total (a few hundred ns a lap)."""

    def __init__(self, totals: dict[str, float]) -> None:
        self._totals = totals
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self._totals[stage] += now - self._last
        self._last = now


def is_checkpoint(iteration: int, every: int) -> bool:
    """Whether ``iteration`` ends a checkpoint when one is taken every ``every`` (0: never)."""
    return every > 0 and (iteration + 1) % every == 0


class Scheduler:
    """Plans batches in order; ``submit`` returns the previous batch's final plans.

    With ``checkpoint_every`` N, the plans of every N-th iteration t carry ``checkpoint``
    and write back every row still dirty at the end of t (the mirror marks them clean),
    so the PS alone holds the model once t is committed. A batch with ``flush`` does the
    same for its own iteration, and its plans are released with the previous ones: after
    the flush nothing is dirty, so no later batch can add a write-back to them."""

    def __init__(
        self,
        num_workers: int,
        capacity: int,
        mode: str = "herald",
        checkpoint_every: int = 0,
        expected_keys: int = 0,
        early_write_back: int = EARLY_WRITE_BACK_ALL,
        look_ahead: int = 1,
        prefetch_plans: int = 1,
    ) -> None:
        fields = mode_named(mode)
        early_cap = early_write_back_cap(early_write_back)
        self.look_ahead = check_look_ahead(look_ahead)
        # herald_pipelined: plans flow this many iterations ahead of the one training.
        self.prefetch_plans = check_prefetch_plans(prefetch_plans) if fields.early_pulls else 1
        if not fields.plans_rows:
            raise InvalidArgument(f"mode {mode!r} plans samples only; use make_scheduler")
        self.mode = mode
        self.partitioner = PARTITIONERS[fields.partitioner]()
        self.planner: SyncPlanner = OnDemandSync() if fields.on_demand_sync else NaiveSync()
        self.early = EarlyPulls(self.prefetch_plans) if fields.early_pulls else None
        self.mirror = CacheMirror(num_workers, capacity, expected_keys)
        self.counts = Traffic()
        self.checkpoint_every = checkpoint_every
        # Early write-backs, on-demand modes only (naive sync leaves nothing dirty): on
        # (``early_cap`` rows per worker and iteration, None: every idle dirty row) or off.
        self.early_write_back = early_write_back != 0 and fields.on_demand_sync
        self.early_cap = early_cap
        # Kids that may be dirty: those left dirty last time and every row made dirty since
        # (``_trained_kids``: updated locally in the last planned iteration).
        self._dirty_candidates = np.empty(0, np.int64)
        self._trained_kids = np.empty(0, np.int64)
        self.next_iteration: int | None = None  # of the next batch submitted
        # Submitted, not planned yet (look_ahead - 1), each with its distinct keys, which
        # are in the window while it is held.
        self._ahead: deque[tuple[Batch, npt.NDArray[np.int64]]] = deque()
        self.window = Window()
        self._pending: list[CommPlan] = []
        self.helper = HelperChoice()
        self.stage_seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        """Wall seconds spent in each stage of :meth:`submit`, summed over batches."""

    @property
    def num_workers(self) -> int:
        return self.mirror.num_workers

    @property
    def plans_ahead(self) -> int:
        """Iterations whose plans a worker may hold before the oldest is committed."""
        return mode_named(self.mode).plans_ahead + self.prefetch_plans - 1

    @property
    def capacity(self) -> int:
        """Rows per worker cache the plans assume."""
        return self.mirror.capacity

    def submit(self, batch: Batch) -> list[CommPlan]:
        """Take the next batch; plan the oldest one held once ``look_ahead - 1`` later
        ones are held behind it (all of them for a ``flush`` batch); return the plans
        that became final."""
        check_next_batch(batch, self.num_workers, self.next_iteration)
        started = time.perf_counter()
        self._hold(batch)
        self.stage_seconds["front"] += time.perf_counter() - started  # the window's share
        self.next_iteration = batch.iteration + 1
        keep = 0 if batch.flush else self.look_ahead - 1
        released: list[CommPlan] = []
        try:
            while len(self._ahead) > keep:
                released += self._plan_oldest()
        except BaseException:
            if self._ahead[-1][0] is batch:  # refuse the batch just submitted
                self.window.leave(self._ahead.pop()[1])
                self.next_iteration = batch.iteration
            raise
        return released

    def _hold(self, batch: Batch, first: bool = False) -> None:
        """Hold ``batch`` behind those held (``first``: before them); its keys join the
        window (look-ahead > 1)."""
        keys = self.window.enter(batch.keys) if self.look_ahead > 1 else batch.keys[:0]
        if first:
            self._ahead.appendleft((batch, keys))
        else:
            self._ahead.append((batch, keys))

    def _plan_oldest(self) -> list[CommPlan]:
        """Plan the oldest batch held (it leaves the window first); one that cannot be
        planned is held again, first, as nothing of it was planned."""
        batch, keys = self._ahead.popleft()
        self.window.leave(keys)
        try:
            return self._plan(batch)
        except BaseException:
            self._hold(batch, first=True)
            raise

    def _plan(self, batch: Batch) -> list[CommPlan]:
        """Plan ``batch``, seeing the batches held behind it (``window``); return the
        previous batch's plans, now final."""
        mirror = self.mirror
        n = mirror.num_workers
        clock = _StageClock(self.stage_seconds)
        big = batch.keys.shape[0] >= PARALLEL_KEYS
        parallel = big and self.helper.choose()
        started = time.perf_counter()
        window = self.window.slots
        given = self.partitioner.given(batch)
        numbering, assignment, (wl_offsets, trainers) = _front(batch, mirror, given, parallel)
        info = numbering.info[: numbering.nb]
        clock.lap("front")
        mirror.samples_seen += batch.samples
        mirror.batches_seen += 1
        sizes = np.diff(wl_offsets)
        if sizes.max(initial=0) > mirror.capacity:
            w = int(sizes.argmax())
            raise CacheTooSmall(w, batch.iteration, int(sizes[w]), mirror.capacity)
        # Validated: from here on the mirror changes.
        flush_workers, flush_keys = self._checkpoint_flush()
        ops = mirror.scratch("ops", kernels.OP_FIELDS * info.shape[0]).view(np.uint64)
        ops = ops.reshape(-1, kernels.OP_FIELDS)
        through = self.planner.on_demand and self.look_ahead > 1
        prev_workers, prev_keys, now_workers, now_keys, inserts = _touch_keys(
            mirror, info, trainers, ops, self.planner.on_demand, window, through, parallel
        )
        clock.lap("touch_keys")
        out, counts = _evict_and_list(
            mirror,
            wl_offsets,
            info,
            trainers,
            ops,
            inserts,
            self.look_ahead > 1,
            window,
            parallel,
        )
        clock.lap("evict_and_list")
        if counts[:, 4].any():  # dirty rows evicted now: written back by the previous plans
            starts, dirty_counts = wl_offsets[:-1].tolist(), counts[:, 4].tolist()
            dirty = np.concatenate(
                [out[3][a : a + c] for a, c in zip(starts, dirty_counts, strict=True)]
            )
            prev_workers = np.concatenate(
                [prev_workers, np.repeat(np.arange(n, dtype=np.int64), counts[:, 4])]
            )
            prev_keys = np.concatenate([prev_keys, dirty])
        if self.early_write_back:
            if self._pending:
                early_workers, early_keys = self._early_write_backs(info, window)
                prev_workers = np.concatenate([prev_workers, early_workers])
                prev_keys = np.concatenate([prev_keys, early_keys])
            else:  # the first batch, or one after a flush: no row was dirty before it
                self._dirty_candidates = np.empty(0, np.int64)
            self._trained_kids = kernels.single_trainer_kids(trainers, ops)
        self.counts.hits += int(counts[:, 3].sum())
        self.counts.held_samples += assignment.held
        self.counts.local_samples += assignment.local

        if flush_keys.shape[0]:  # written back at the checkpoint, with the previous lists
            prev_workers = np.concatenate([prev_workers, flush_workers])
            prev_keys = np.concatenate([prev_keys, flush_keys])
        m = batch.samples_per_worker
        samples_order = assignment.order
        wb_offsets, wb_keys = _sorted_by_worker(now_workers, now_keys, n)
        checkpoint = is_checkpoint(batch.iteration, self.checkpoint_every)
        starts, ends = wl_offsets[:-1].tolist(), wl_offsets[1:].tolist()
        pulls, evicts, locals_ = counts[:, 0].tolist(), counts[:, 1].tolist(), counts[:, 2].tolist()
        pulled, evicted, trained = out[0], out[1], out[2]
        plans = [
            CommPlan(
                iteration=batch.iteration,
                worker=w,
                samples=samples_order[w * m : (w + 1) * m],
                evict=evicted[starts[w] : starts[w] + evicts[w]],
                pull=pulled[starts[w] : starts[w] + pulls[w]],
                update_local=trained[starts[w] : locals_[w]],
                push_grads=trained[locals_[w] : ends[w]],
                write_back=wb_keys[wb_offsets[w] : wb_offsets[w + 1]],
                checkpoint=checkpoint or batch.flush,
                lr_scale=batch.lr_scale,
            )
            for w in range(n)
        ]
        if through and self._may_defer(batch, checkpoint):
            passing = _pass_through_keys(trainers[: info.shape[0]], ops)
            for plan in plans:
                plan.push_later = plan.push_grads[_member(plan.push_grads, passing)]
        released = self._release(*_sorted_by_worker(prev_workers, prev_keys, n))
        self._pending = plans
        if batch.flush:  # every row dirty after this iteration goes back with its plans
            released += self._release(*_sorted_by_worker(*self.mirror.take_dirty(), n))
        self.counts.iterations += 1
        clock.lap("plans")
        if big:
            self.helper.record(parallel, time.perf_counter() - started, batch.keys.shape[0])
        return released

    def _may_defer(self, batch: Batch, checkpoint: bool) -> bool:
        """Whether ``batch``'s plans may leave pass-through gradients to the next iteration
        (``CommPlan.push_later``): not at a checkpoint or a flush (its commit must hold
        every update of the iteration), and only when the next batch is held and trains
        with the same learning rate (its commit applies them)."""
        if checkpoint or batch.flush or not self._ahead:
            return False
        return self._ahead[0][0].lr_scale == batch.lr_scale

    def _early_write_backs(
        self, info: npt.NDArray[np.uint64], window: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(worker, key) of the dirty rows the pending plans write back early: up to the
        cap per worker (lowest keys first), of the rows dirty at the end of their iteration
        that no worker uses in the next batch (``info``: its keys) nor in the batches held
        behind it (``window``: ``Window.slots``) and that their owner did not update in
        that iteration (it may soon again). Called once the next batch's keys
        are touched and its evictions listed. Rows get dirty only by a local update, so
        the rows examined are those of earlier plans left dirty, never a scan of every row
        the mirror knows."""
        owners, keys, self._dirty_candidates = self.mirror.take_idle_dirty(
            self._dirty_candidates, info, window, self._trained_kids, self.early_cap
        )
        return owners, keys

    def _checkpoint_flush(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(worker, key) of the rows the pending plans write back because their iteration
        ends a checkpoint: every dirty row, before the next batch's plans see the mirror."""
        if not (self._pending and self._pending[0].checkpoint):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return self.mirror.take_dirty()

    def finish(self) -> list[CommPlan]:
        """Plan the batches still held, release the last plans; rows still dirty are
        counted as the final flush."""
        released: list[CommPlan] = []
        while self._ahead:
            released += self._plan_oldest()
        released += self._release(np.zeros(self.num_workers + 1, np.int64), np.empty(0, np.int64))
        self.counts.final_flush = self.mirror.dirty_rows()
        return released

    def _release(
        self, offsets: npt.NDArray[np.int64], keys: npt.NDArray[np.int64]
    ) -> list[CommPlan]:
        """Add the write-backs the next batch asked for (``keys`` of worker w at
        ``offsets[w]:offsets[w + 1]``, ascending) to the pending plans; release them."""
        for plan in self._pending:
            extra = keys[offsets[plan.worker] : offsets[plan.worker + 1]]
            if extra.shape[0]:
                # Naive sync leaves nothing dirty, on-demand writes nothing back
                # at once: in practice only one of the two lists is non-empty.
                own = plan.write_back
                plan.write_back = np.sort(np.concatenate([own, extra])) if own.shape[0] else extra
        if self.early is not None:
            self.early.mark(self._pending)
        for plan in self._pending:
            self.counts.add_plan(plan)
        released, self._pending = self._pending, []
        return released


PARALLEL_KEYS = 65_536  # batches with fewer key occurrences (distinct keys) use one thread
PARALLEL_PAIRS = 32_768  # below this many (key, worker) pairs, one thread is faster
PIECES = 4  # pieces of a split stage (``split.run_pieces``): the two threads balance them


def _touch_keys(
    mirror: CacheMirror, info: npt.NDArray[np.uint64], trainers: npt.NDArray[np.uint64],
    ops: npt.NDArray[np.uint64], on_demand: bool, window: npt.NDArray[np.int64],
    through: bool, parallel: bool,
) -> tuple[npt.NDArray[np.int64], ...]:  # fmt: skip
    """Stage 3 (``kernels.touch_keys``): the batch's keys, in pieces on two threads for a
    big batch (each key's record is its own). Returns (previous write-backs: workers,
    keys; this iteration's: workers, keys; keys each worker inserts)."""
    nb, n = info.shape[0], mirror.num_workers
    pieces = PIECES if parallel and nb >= PARALLEL_KEYS else 1
    bounds = np.linspace(0, nb, pieces + 1).astype(int).tolist()
    inserts = np.zeros((pieces, n), np.int64)
    parts = run_pieces([
        partial(kernels.touch_keys, info, trainers, a, b, mirror.records, ops, inserts[i],
                on_demand, window, through)
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ])  # fmt: skip
    if pieces == 1:
        return (*parts[0], inserts[0])
    return (
        *(np.concatenate([p[j] for p in parts]) for j in range(4)),
        inserts.sum(axis=0),
    )


def _evict_and_list(
    mirror: CacheMirror,
    wl_offsets: npt.NDArray[np.int64],
    info: npt.NDArray[np.uint64],
    trainers: npt.NDArray[np.uint64],
    ops: npt.NDArray[np.uint64],
    inserts: npt.NDArray[np.int64],
    ahead: bool,
    window: npt.NDArray[np.int64],
    parallel: bool,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Stage 4 (``kernels.evict_and_list``) for every worker: on two threads, each with
    about half of the (key, worker) pairs, when the batch is big enough to pay for it.

    Returns (out_keys, counts) as ``kernels.evict_and_list`` fills them; the mirror then
    forgets the keys no worker caches any more."""
    n = mirror.num_workers
    total = int(wl_offsets[-1])
    out = np.empty((4, total), np.int64)  # the plans keep views of it
    counts = np.zeros((n, 6), np.int64)
    staging = mirror.scratch("staging", 3 * total).reshape(3, total)
    args = (
        wl_offsets, info, trainers, ops, inserts, mirror.capacity, mirror.rings, mirror.heads,
        mirror.used, mirror.flat, mirror.key_of, ahead, window, out, counts, staging,
    )  # fmt: skip
    if total < PARALLEL_PAIRS or n == 1 or not parallel:
        kernels.evict_and_list(0, n, *args)
    else:  # two groups of workers with about equal pairs (each reads every key)
        cut = int(np.clip(np.searchsorted(wl_offsets, total // 2), 1, n - 1))
        run_pieces([
            partial(kernels.evict_and_list, 0, cut, *args),
            partial(kernels.evict_and_list, cut, n, *args),
        ])  # fmt: skip
    if counts[:, 5].any():
        starts, gone = wl_offsets[:-1].tolist(), counts[:, 5].tolist()
        mirror.forget(
            np.concatenate([staging[2][a : a + c] for a, c in zip(starts, gone, strict=True)])
        )
    return out, counts


def _sorted_by_worker(
    workers: npt.NDArray[np.int64], keys: npt.NDArray[np.int64], num_workers: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Keys grouped by worker (worker w's at ``offsets[w]:offsets[w + 1]``), ascending.

    NumPy's sort of each group: about 3x faster than numba's on a few hundred keys.
    """
    offsets, grouped = kernels.group_by_worker(workers, keys, num_workers)
    if grouped.shape[0]:
        for w in range(num_workers):
            grouped[offsets[w] : offsets[w + 1]].sort()
    return offsets, grouped


class SampleScheduler:
    """HET mode's scheduler: sequential sample assignment and nothing else.

    The workers' caches decide pulls and pushes by clocks (HET), so a plan
    carries only ``samples``; the service still runs the BSP barrier and
    commits. Same interface as :class:`Scheduler` for the barrier.
    """

    mode = HET_MODE
    plans_ahead = 1  # BSP: plan t+1 flows once t is committed

    def __init__(self, num_workers: int, capacity: int, checkpoint_every: int = 0) -> None:
        if capacity < 1:
            raise InvalidArgument(f"cache capacity must be >= 1 row, got {capacity}")
        self.num_workers = num_workers
        self.capacity = capacity
        self.checkpoint_every = checkpoint_every
        self.counts = Traffic()
        self.next_iteration: int | None = None
        self._pending: list[CommPlan] = []

    def submit(self, batch: Batch) -> list[CommPlan]:
        check_next_batch(batch, self.num_workers, self.next_iteration)
        m = batch.samples_per_worker
        samples = np.arange(batch.samples, dtype=np.int64)
        checkpoint = is_checkpoint(batch.iteration, self.checkpoint_every) or batch.flush
        released, self._pending = (
            self._pending,
            [
                CommPlan(
                    batch.iteration,
                    w,
                    samples=samples[w * m : (w + 1) * m],
                    checkpoint=checkpoint,
                    lr_scale=batch.lr_scale,
                )
                for w in range(self.num_workers)
            ],
        )
        if batch.flush:  # the workers push what is dirty: nothing waits for the next batch
            released, self._pending = released + self._pending, []
        self.next_iteration = batch.iteration + 1
        self.counts.iterations += 1
        return released

    def finish(self) -> list[CommPlan]:
        released, self._pending = self._pending, []
        return released


def make_scheduler(
    num_workers: int,
    capacity: int,
    mode: str,
    checkpoint_every: int = 0,
    expected_keys: int = 0,
    early_write_back: int = EARLY_WRITE_BACK_ALL,
    look_ahead: int = 1,
    prefetch_plans: int = 1,
) -> Scheduler | SampleScheduler:
    """The scheduler of a service mode: a Herald mode of ``MODES``, or ``het``.

    ``expected_keys`` (0: unknown) sizes the mirror's key index and records up front;
    ``early_write_back``: rows per worker and iteration written back early (-1: every
    idle dirty row; 0: none); ``look_ahead``: batches the scheduler sees beyond the plan
    it releases (1 to ``heraldps.modes.MAX_LOOK_AHEAD``; HET plans samples only and
    ignores it); ``prefetch_plans``: how many plans ahead a ``herald_pipelined`` worker
    may pull early rows for (other modes ignore it)."""
    check_look_ahead(look_ahead)
    if mode_named(mode).het:
        return SampleScheduler(num_workers, capacity, checkpoint_every)
    return Scheduler(num_workers, capacity, mode, checkpoint_every, expected_keys,
                     early_write_back, look_ahead, prefetch_plans)  # fmt: skip
