"""The fast scheduler against the plain reference, and the invariants of the plans."""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heraldps.errors import CacheTooSmall, FailedPrecondition, InvalidArgument
from heraldps.modes import PIPELINED_MODE, mode_named
from heraldps.plan import CommPlan
from launcher.cli.command import early_write_back
from scheduler_service import mirror as mirror_module
from scheduler_service import scheduler as scheduler_module
from scheduler_service import split as split_module
from scheduler_service.batch import Batch
from scheduler_service.reference import ReferenceScheduler
from scheduler_service.scheduler import MODES, Scheduler


def random_batches(
    seed: int, iterations: int, workers: int, per_worker: int, fields: int, vocab: int
) -> list[Batch]:
    rng = np.random.default_rng(seed)
    out = []
    for t in range(iterations):
        lens = rng.integers(0, fields + 1, workers * per_worker)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        keys = (rng.zipf(1.2, int(offsets[-1])) % vocab) - vocab // 2
        out.append(Batch.from_arrays(t, offsets, keys, workers))
    return out


def uniform_batches(
    seed: int, iterations: int, workers: int, per_worker: int, fields: int, vocab: int
) -> list[Batch]:
    """Batches of ``fields`` keys a sample, drawn uniformly from ``vocab``."""
    rng = np.random.default_rng(seed)
    samples = workers * per_worker
    offsets = np.arange(samples + 1) * fields
    return [Batch.from_arrays(t, offsets, rng.integers(0, vocab, samples * fields), workers)
            for t in range(iterations)]  # fmt: skip


def run(scheduler: Scheduler | ReferenceScheduler, batches: list[Batch]) -> list[CommPlan]:
    plans = []
    for batch in batches:
        plans += scheduler.submit(batch)
    return plans + scheduler.finish()


@pytest.mark.parametrize("early_write_back", [0, 3, -1])
@pytest.mark.parametrize("mode", list(MODES))
@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    workers=st.integers(1, 6),
    per_worker=st.integers(1, 6),
    fields=st.integers(1, 5),
    vocab=st.integers(1, 60),
    spare=st.integers(0, 30),
    look_ahead=st.integers(1, 4),
    prefetch=st.integers(1, 3),
)
def test_fast_scheduler_equals_reference(
    mode: str,
    early_write_back: int,
    seed: int,
    workers: int,
    per_worker: int,
    fields: int,
    vocab: int,
    spare: int,
    look_ahead: int,
    prefetch: int,
) -> None:
    capacity = per_worker * fields + spare  # never below a mini-batch's working set
    batches = random_batches(seed, 8, workers, per_worker, fields, vocab)
    fast, ref = (
        Scheduler(workers, capacity, mode, early_write_back=early_write_back,
                  look_ahead=look_ahead, prefetch_plans=prefetch),
        ReferenceScheduler.for_mode(workers, capacity, mode, early_write_back, look_ahead,
                                    prefetch),
    )  # fmt: skip
    fast_plans, ref_plans = run(fast, batches), run(ref, batches)
    assert len(fast_plans) == len(ref_plans) == 8 * workers
    for a, b in zip(fast_plans, ref_plans, strict=True):
        assert a.same_as(b), (a, b)
    assert fast.counts == ref.counts


@pytest.mark.parametrize(("checkpoint_every", "look_ahead"), [(0, 1), (4, 1), (0, 3), (4, 5)])
@pytest.mark.parametrize("early_write_back", [0, 4, -1])
@pytest.mark.parametrize("mode", list(MODES))
def test_plan_invariants(
    mode: str, early_write_back: int, checkpoint_every: int, look_ahead: int
) -> None:
    """Replay plans on simple per-worker caches: every rule of the counting model holds,
    checkpoints (every dirty row written back) among early write-backs included, with
    every look-ahead."""
    workers, per_worker, capacity = 4, 8, 40
    batches = random_batches(7, 30, workers, per_worker, 5, 120)
    scheduler = Scheduler(workers, capacity, mode, checkpoint_every=checkpoint_every,
                          early_write_back=early_write_back,
                          look_ahead=look_ahead)  # fmt: skip
    plans = run(scheduler, batches)
    caches: list[dict[int, tuple[int, bool]]] = [
        {} for _ in range(workers)
    ]  # key -> (version, dirty)
    latest: dict[int, int] = {}
    ps: dict[int, int] = {}
    by_iteration: dict[int, list[CommPlan]] = {}
    for plan in plans:
        by_iteration.setdefault(plan.iteration, []).append(plan)
    ps_before: dict[int, int] = {}  # the PS when the previous iteration started
    later: dict[int, int] = {}  # push_later of the previous iteration: key -> its version
    for batch in batches:
        group = by_iteration[batch.iteration]
        # An early pull reads the row before the previous iteration changes the PS: it
        # must be the row that iteration leaves there.
        for p in group:
            for k in p.pull_early.tolist():
                assert ps.get(k, 0) == ps_before.get(k, 0), "an early pull the commit changes"
        ps_before = dict(ps)
        assigned = np.sort(np.concatenate([p.samples for p in group]))
        assert np.array_equal(assigned, np.arange(batch.samples))  # every sample once
        assert all(p.samples.shape[0] == per_worker for p in group)  # nobody over m
        trainers: dict[int, int] = {}
        dirty_before = [{k for k, (_, dirty) in c.items() if dirty} for c in caches]
        for p in group:
            cache = caches[p.worker]
            for k in p.evict.tolist():
                assert not cache.pop(k)[1], "a dirty row was evicted without a write-back"
            for k in p.pull.tolist():
                assert ps.get(k, 0) == latest.get(k, 0), (
                    "pulled a row whose newest value is elsewhere"
                )
                cache[k] = (latest.get(k, 0), False)
            assert len(cache) <= capacity
            keys = {k for i in p.samples.tolist() for k in batch.sample_keys(i).tolist()}
            assert set(p.update_local.tolist()) | set(p.push_grads.tolist()) == keys
            for k in keys:
                assert cache[k][0] == latest.get(k, 0), "trained a row that is not valid"
                trainers[k] = trainers.get(k, 0) + 1
        # A key one worker trains goes through the PS only with on-demand sync and a
        # window, where no batch of the window uses it and nobody holds it dirty.
        window = {
            k for b in batches[batch.iteration + 1 : batch.iteration + look_ahead]
            for k in b.keys.tolist()
        }  # fmt: skip
        through = mode_named(mode).on_demand_sync and look_ahead > 1
        pushed: set[int] = set()
        deferred: set[int] = set()
        for p in group:
            for k in p.push_grads.tolist():
                assert trainers[k] > 1 or (
                    through and k not in window and k not in dirty_before[p.worker]
                ), (batch.iteration, p.worker, k)
                pushed.add(k)
            # Gradients sent later: pass-through rows only, never at a checkpoint; the
            # next iteration's commit applies them (below), and until then the PS is old.
            assert np.isin(p.push_later, p.push_grads).all()
            assert all(trainers[k] == 1 for k in p.push_later.tolist())
            assert not (p.push_later.shape[0] and p.checkpoint)
            deferred.update(p.push_later.tolist())
            for k in p.update_local.tolist():
                assert trainers[k] == 1
                caches[p.worker][k] = (latest.get(k, 0) + 1, True)
        for k, version in later.items():  # this commit applies the last iteration's
            ps[k] = version
        later = {}
        for k in trainers:
            latest[k] = latest.get(k, 0) + 1
            if k in deferred:
                later[k] = latest[k]
            elif k in pushed:
                ps[k] = latest[k]
        for p in group:
            for k in p.write_back.tolist():
                version, dirty = caches[p.worker][k]
                assert dirty
                caches[p.worker][k] = (version, False)
                ps[k] = version
        if group[0].checkpoint:  # the PS alone holds the model once a checkpoint commits
            assert not any(dirty for cache in caches for _, dirty in cache.values())
    assert not later, "the last iteration left gradients for one that never comes"
    flush = sum(dirty for cache in caches for _, dirty in cache.values())
    assert flush == scheduler.counts.final_flush
    if mode in ("naive", "location_aware"):
        assert flush == 0
    early = sum(p.pull_early.shape[0] for p in plans)
    assert (early > 0) == (mode == "herald_pipelined")


def test_pipelined_plans_are_herald_plans_with_early_pulls_marked() -> None:
    """Same assignment and rows as herald; in plan t+1, a pull is early exactly when no
    worker pushes its gradient or writes it back in iteration t; the first plans have none."""
    workers, capacity = 4, 40
    batches = random_batches(5, 40, workers, 8, 5, 150)
    herald, pipelined = (
        Scheduler(workers, capacity, "herald"),
        Scheduler(workers, capacity, "herald_pipelined"),
    )
    herald_plans, plans = run(herald, batches), run(pipelined, batches)
    for a, b in zip(herald_plans, plans, strict=True):
        assert b.pull_early.shape[0] <= b.pull.shape[0]
        assert a.same_as(replace(b, pull_early=a.pull_early))
    assert replace(pipelined.counts, early_pulls=0) == herald.counts
    assert pipelined.counts.early_pulls == sum(p.pull_early.shape[0] for p in plans) > 0

    marked = unmarked = pushed_unmarked = written_unmarked = 0
    changed: set[int] | None = None  # keys pushed or written back in the previous iteration
    pushed: set[int] = set()
    written: set[int] = set()
    for t in range(len(batches)):
        group = [p for p in plans if p.iteration == t]
        for p in group:
            early = set(p.pull_early.tolist())
            mask = np.isin(p.pull, p.pull_early)
            assert np.array_equal(p.pull[mask], p.pull_early)  # a sub-sequence, in order
            if changed is None:
                assert not early
                continue
            for k in p.pull.tolist():
                assert (k in early) == (k not in changed), (t, p.worker, k)
            marked += len(early)
            unmarked += p.pull.shape[0] - len(early)
            pushed_unmarked += sum(k in pushed for k in p.pull.tolist())
            written_unmarked += sum(k in written for k in p.pull.tolist())
        pushed = {k for p in group for k in p.push_grads.tolist()}
        written = {k for p in group for k in p.write_back.tolist()}
        changed = pushed | written
    # Every case happened: untouched keys marked; pushed and written-back ones not.
    assert marked > 0 and unmarked > 0 and pushed_unmarked > 0 and written_unmarked > 0


@pytest.mark.parametrize(("prefetch", "look_ahead"), [(2, 1), (3, 3)])
def test_prefetch_leads_name_the_iterations_that_leave_each_early_row_unchanged(
    prefetch: int, look_ahead: int
) -> None:
    """--prefetch-plans P: the plans are those of P = 1, and each early key of plan u gets
    the largest n <= P such that no iteration u-n .. u-1 changes its row (pushes, write-backs,
    gradients sent later, which the iteration after applies); the first plans count only
    the iterations released before them."""
    workers, capacity = 4, 40
    batches = random_batches(9, 40, workers, 8, 5, 150)
    one, deep = (
        Scheduler(workers, capacity, PIPELINED_MODE, look_ahead=look_ahead),
        Scheduler(workers, capacity, PIPELINED_MODE, look_ahead=look_ahead,
                  prefetch_plans=prefetch),
    )  # fmt: skip
    assert (one.plans_ahead, deep.plans_ahead) == (2, 1 + prefetch)
    plans_one, plans = run(one, batches), run(deep, batches)
    for a, b in zip(plans_one, plans, strict=True):
        assert not a.pull_early_from.shape[0]
        assert a.same_as(replace(b, pull_early_from=a.pull_early_from))
    assert one.counts == deep.counts
    changed: list[set[int]] = []  # by iteration
    later: set[int] = set()
    seen = np.zeros(prefetch + 1, dtype=np.int64)
    for t in range(len(batches)):
        group = [p for p in plans if p.iteration == t]
        for p in group:
            leads = p.early_leads()
            assert leads.shape[0] == p.pull_early.shape[0]
            for key, lead in zip(p.pull_early.tolist(), leads.tolist(), strict=True):
                assert 1 <= lead <= min(prefetch, t), (t, key, lead)
                assert not any(key in changed[v] for v in range(t - lead, t)), (t, key, lead)
                if lead < min(prefetch, t):  # the largest: iteration t-lead-1 changes it
                    assert key in changed[t - lead - 1], (t, key, lead)
                seen[lead] += 1
            late = np.setdiff1d(p.pull, p.pull_early)
            if t:
                assert all(k in changed[t - 1] for k in late.tolist())
        changed.append({k for p in group for k in [*p.push_grads.tolist(),
                                                   *p.write_back.tolist()]} | later)  # fmt: skip
        later = {k for p in group for k in p.push_later.tolist()}
    assert (seen[1:] > 0).all(), seen  # every lead happened


def test_a_key_changed_in_t_is_pulled_late_in_t_plus_1() -> None:
    """Two workers, by hand. Iteration 0: both train key 2 (pushed), w0 key 1 and w1 key 3
    alone (dirty). Iteration 1: both need 1 and 3, so each writes its own back at 0 and
    pulls the other's late; new keys 10, 11 are early. Iteration 2: key 2, pushed at 0
    but untouched at 1, is early (marks look at the previous iteration only)."""
    s = Scheduler(2, 10, "herald_pipelined")
    plans = s.submit(Batch.from_arrays(0, [0, 2, 4], [1, 2, 2, 3], 2))
    plans += s.submit(Batch.from_arrays(1, [0, 3, 6], [1, 3, 10, 1, 3, 11], 2))
    plans += s.submit(Batch.from_arrays(2, [0, 2, 4], [2, 12, 2, 13], 2))
    plans += s.finish()
    lists = [
        (p.iteration, p.worker, p.pull.tolist(), p.pull_early.tolist(), p.push_grads.tolist(),
         p.write_back.tolist())
        for p in plans
    ]  # fmt: skip
    assert lists == [
        (0, 0, [1, 2], [], [2], [1]),  # the first plans: nothing marked
        (0, 1, [2, 3], [], [2], [3]),
        (1, 0, [3, 10], [10], [1, 3], []),  # 3 was written back at 0: late
        (1, 1, [1, 11], [11], [1, 3], []),  # 1 was written back at 0: late
        (2, 0, [2, 12], [2, 12], [2], []),  # 1 and 3 were pushed at 1, 2 was not
        (2, 1, [2, 13], [2, 13], [2], []),
    ]


def test_location_aware_prefers_cached_rows() -> None:
    """Two workers; after one batch, samples follow the worker that holds their keys."""
    s = Scheduler(2, 10, "herald")
    first = Batch.from_arrays(0, [0, 2, 4], [1, 2, 3, 4], 2)  # worker 0: {1,2}, worker 1: {3,4}
    second = Batch.from_arrays(1, [0, 2, 4], [3, 4, 1, 2], 2)
    s.submit(first)
    plans = s.submit(second) + s.finish()
    second_plans = [p for p in plans if p.iteration == 1]
    assert second_plans[0].samples.tolist() == [1] and second_plans[1].samples.tolist() == [0]
    assert all(p.pull.size == 0 for p in second_plans)
    assert s.counts.pulls == 4 and s.counts.pushes == 0 and s.counts.final_flush == 4


def test_bad_batches() -> None:
    s = Scheduler(2, 3, "herald")
    with pytest.raises(InvalidArgument, match="split evenly"):
        Batch.from_arrays(0, [0, 1, 2, 3], [1, 2, 3], 2)
    with pytest.raises(InvalidArgument, match="more than its cache"):
        s.submit(Batch.from_arrays(0, [0, 4, 5], [1, 2, 3, 4, 5], 2))
    s.submit(Batch.from_arrays(0, [0, 1, 2], [1, 2], 2))
    with pytest.raises(FailedPrecondition, match="expects iteration 1"):
        s.submit(Batch.from_arrays(5, [0, 1, 2], [1, 2], 2))
    with pytest.raises(InvalidArgument, match="workers must be"):
        Scheduler(65, 3)
    with pytest.raises(InvalidArgument, match="unknown mode"):
        Scheduler(2, 3, "fastest")


@pytest.mark.parametrize("mode", ["naive", "herald"])
def test_many_workers_evict_and_still_equal_the_reference(mode: str) -> None:
    """Many workers, each with its own clock, evicting as their caches fill."""
    batches = random_batches(3, 10, 20, 3, 4, 400)
    fast, ref = Scheduler(20, 14, mode), ReferenceScheduler.for_mode(20, 14, mode)
    assert len(fast.mirror.rings) == 20
    for a, b in zip(run(fast, batches), run(ref, batches), strict=True):
        assert a.same_as(b)
    assert fast.counts == ref.counts and fast.counts.evictions > 0
    for w in range(20):  # the mirror's clocks are the reference's, entry for entry
        assert fast.mirror.cached_keys(w).tolist() == list(ref.clocks[w])


@pytest.mark.parametrize("workers", [3, 20])
def test_long_runs_wrap_the_clocks_and_still_equal_the_reference(workers: int) -> None:
    """Over 500 batches every clock wraps round its ring many times."""
    batches = random_batches(11, 500, workers, 4, 6, 90)
    fast, ref = Scheduler(workers, 24, "herald"), ReferenceScheduler.for_mode(workers, 24, "herald")
    for a, b in zip(run(fast, batches), run(ref, batches), strict=True):
        assert a.same_as(b)
    assert fast.counts == ref.counts and fast.counts.evictions > 0
    assert (fast.mirror.used <= 24).all()
    assert fast.counts.evictions > 10 * workers * 32  # far more than any ring's length
    for w in range(workers):
        assert fast.mirror.cached_keys(w).tolist() == list(ref.clocks[w])


def test_a_clock_never_evicts_a_key_of_the_current_mini_batch() -> None:
    """Worker 0 caches 4 rows; its next mini-batch reuses the oldest two and adds two new
    ones: the two newest old rows are evicted, not the ones it is about to train."""
    s = Scheduler(1, 4, "herald")
    s.submit(Batch.from_arrays(0, [0, 4], [1, 2, 3, 4], 1))
    plans = s.submit(Batch.from_arrays(1, [0, 4], [1, 2, 5, 6], 1)) + s.finish()
    second = plans[-1]
    assert sorted(second.evict.tolist()) == [3, 4]
    assert second.pull.tolist() == [5, 6]


@pytest.mark.parametrize("mode", ["herald", "naive", "herald_pipelined"])
def test_two_threads_plan_exactly_as_the_reference(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thresholds of 1 put every split stage (the front's pipeline of numbering, reading,
    choosing and marking; the keys' pass; the workers' pass) on two threads even for tiny
    batches; the plans are the reference's."""
    monkeypatch.setattr(scheduler_module, "PARALLEL_PAIRS", 1)
    monkeypatch.setattr(scheduler_module, "PARALLEL_KEYS", 1)
    monkeypatch.setattr(scheduler_module, "FRONT_CHUNKS", 3)
    monkeypatch.setattr(split_module, "FORCE_HELPER", True)  # whatever the machine's load
    batches = random_batches(4, 12, 20, 4, 5, 300)
    fast, ref = Scheduler(20, 30, mode), ReferenceScheduler.for_mode(20, 30, mode)
    for a, b in zip(run(fast, batches), run(ref, batches), strict=True):
        assert a.same_as(b)
    assert fast.counts == ref.counts and fast.counts.evictions > 0


def test_rings_and_records_grow_and_still_equal_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Caches of 1,500 rows outgrow rings reserved for 1,024 entries, and 5,000 keys
    outgrow records sized for a hint of 10 keys: both grow by the documented policy."""
    monkeypatch.setattr(mirror_module, "RING_RESERVE", 1024)
    rng = np.random.default_rng(9)
    offsets = np.arange(3 * 40 + 1) * 8
    batches = [Batch.from_arrays(t, offsets, rng.integers(0, 5000, 3 * 40 * 8), 3)
               for t in range(15)]  # fmt: skip
    fast = Scheduler(3, 1500, "herald", expected_keys=10)
    ref = ReferenceScheduler.for_mode(3, 1500, "herald")
    for a, b in zip(run(fast, batches), run(ref, batches), strict=True):
        assert a.same_as(b)
    assert fast.counts == ref.counts and fast.counts.evictions > 0
    assert min(ring.shape[0] for ring in fast.mirror.rings) > 1024
    assert len(fast.mirror.index) > 1024
    assert fast.mirror.holders.shape[0] >= len(fast.mirror.index)


def test_expected_keys_sizes_the_mirror_up_front() -> None:
    """The hint sizes the index and records, up to what the caches can hold at once."""
    s = Scheduler(2, 60_000, "herald", expected_keys=100_000)
    assert s.mirror.holders.shape[0] >= 100_000
    assert s.mirror.index.slots.shape[0] >= 2 * 100_000
    small = Scheduler(2, 10_000, "herald", expected_keys=10_000_000)  # caches hold 20,000
    assert 22_500 <= small.mirror.holders.shape[0] < 100_000
    assert small.mirror.index.slots.shape[0] < 200_000
    with pytest.raises(InvalidArgument, match="expected keys"):
        Scheduler(2, 10, "herald", expected_keys=-1)


@pytest.mark.parametrize("mode", ["herald", "naive"])
def test_the_mirror_forgets_keys_no_cache_holds(mode: str) -> None:
    """A vocabulary far larger than the caches: the mirror keeps only keys some cache
    holds (plus the batch's), reusing forgotten kids, and still plans as the reference."""
    workers, per_worker, fields, capacity = 4, 8, 6, 60
    samples = workers * per_worker
    batches = uniform_batches(21, 60, workers, per_worker, fields, 20_000)
    fast, ref = (
        Scheduler(workers, capacity, mode),
        ReferenceScheduler.for_mode(workers, capacity, mode),
    )
    for a, b in zip(run(fast, batches), run(ref, batches), strict=True):
        assert a.same_as(b)
    assert fast.counts == ref.counts
    m = fast.mirror
    assert m.forgotten > 5 * workers * capacity
    assert len(m.index) <= workers * capacity + samples * fields
    assert m.index.rows <= workers * capacity + 2 * samples * fields
    held = {k for w in range(workers) for k in m.cached_keys(w).tolist()}
    assert held <= {k for k in m.key_of[: m.index.rows].tolist()}
    assert len(m.index) == len(held)


@pytest.mark.parametrize("mode", ["on_demand", "herald", "herald_pipelined"])
def test_early_write_backs_shrink_the_final_flush(mode: str) -> None:
    """Dirty rows pile up in large caches; written back early, the final flush holds what
    the last batches dirtied (at most a fifth here), pulls do not change, and a bound per
    worker and iteration spreads the rest over the run."""
    workers, capacity = 4, 5000
    batches = uniform_batches(3, 60, workers, 16, 3, 10_000)
    counts = {}
    for rows in (0, 16, 1_000_000, -1):
        scheduler = Scheduler(workers, capacity, mode, early_write_back=rows)
        run(scheduler, batches)
        counts[rows] = scheduler.counts
    off, bounded, unbounded = counts[0], counts[16], counts[1_000_000]
    assert counts[-1] == unbounded  # -1, the default: every idle dirty row
    assert Scheduler(workers, capacity, mode).early_cap is None
    assert unbounded.final_flush <= 0.2 * off.final_flush
    assert unbounded.final_flush < bounded.final_flush < off.final_flush
    assert off.pulls == bounded.pulls == unbounded.pulls
    assert bounded.write_backs - off.write_backs <= 16 * workers * len(batches)


def test_early_write_back_settings_below_minus_one_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="early write-backs"):
        Scheduler(2, 10, "herald", early_write_back=-2)
    assert [early_write_back(text) for text in ("all", "off", "OFF", "7", "-1")] == [
        -1, 0, 0, 7, -1,
    ]  # fmt: skip
    with pytest.raises(argparse.ArgumentTypeError):
        early_write_back("-2")


def one_key_batches(keys: list[int]) -> list[Batch]:
    """One worker, one sample a batch, one key a sample."""
    return [Batch.from_arrays(t, [0, 1], [k], 1) for t, k in enumerate(keys)]


@pytest.mark.parametrize("mode", ["naive", "herald"])
def test_look_ahead_evicts_the_rows_the_coming_batches_do_not_use(mode: str) -> None:
    """A cache of two rows, keys 1, 2, 3, 1: making room for 3, CLOCK evicts 1 (the
    oldest); seeing batch 3, a look-ahead of 2 keeps 1 and evicts 2, so naive does not
    pull 1 again. Herald does: with a window, it trained 1 through the PS in iteration 0
    (batch 1 does not use it), so the cached copy is stale by iteration 3."""
    batches = one_key_batches([1, 2, 3, 1])
    pulls = {}
    for look_ahead in (1, 2):
        scheduler = Scheduler(1, 2, mode, look_ahead=look_ahead)
        plans = run(scheduler, batches)
        pulls[look_ahead] = [p.pull.tolist() for p in plans]
        evicted = plans[2].evict.tolist()
        assert evicted == ([1] if look_ahead == 1 else [2])
    again = [1] if mode == "herald" else []
    assert pulls == {1: [[1], [2], [3], [1]], 2: [[1], [2], [3], again]}


def test_look_ahead_keeps_dirty_the_rows_the_coming_batches_use() -> None:
    """Key 1, updated in iteration 0 and idle in 1 and 2, is written back early by plan 1
    with one batch of look-ahead; with four, plans 0 and 1 see batch 3 use it, so the
    worker updates it locally and keeps it dirty, and trains it again in its cache: one
    write-back fewer. (With three, plan 0 would not see it used again and train it through
    the PS, test_a_row_no_batch_in_the_window_uses_is_trained_through_the_ps)."""
    batches = one_key_batches([1, 2, 3, 1])
    one, three = Scheduler(1, 10, "herald"), Scheduler(1, 10, "herald", look_ahead=4)
    plans_one, plans_three = run(one, batches), run(three, batches)
    assert plans_one[1].write_back.tolist() == [1]
    assert all(1 not in p.write_back.tolist() for p in plans_three)
    assert [p.pull.tolist() for p in plans_one] == [p.pull.tolist() for p in plans_three]
    assert [p.update_local.tolist() for p in plans_three] == [[1], [], [], [1]]
    assert [p.push_grads.tolist() for p in plans_three] == [[], [2], [3], []]  # used once


def test_a_row_no_batch_in_the_window_uses_is_trained_through_the_ps() -> None:
    """With a window (look-ahead 3), a row one worker trains goes through the PS like a
    co-trained one when no batch of the window uses it: its gradient is pushed, it is
    pulled without state and nothing is left dirty. A row the window uses, or one its
    trainer holds dirty, is updated locally; without a window, and under naive sync,
    every such row is. The gradient goes with the next plan (push_later) where the next
    iteration's commit applies it as this one's would."""
    batches = one_key_batches([1, 2, 1, 3, 3, 2])  # 1: reused inside the window; 2: after
    herald = Scheduler(1, 10, "herald", look_ahead=3)
    plans = run(herald, batches)
    assert [p.update_local.tolist() for p in plans] == [[1], [], [1], [3], [3], []]
    assert [p.push_grads.tolist() for p in plans] == [[], [2], [], [], [], [2]]
    # 2 was stale after its commit (pulled again), 1 and 3 stayed valid (hits).
    assert [p.pull.tolist() for p in plans] == [[1], [2], [], [3], [], [2]]
    assert [p.state_wanted(p.pull).tolist() for p in plans] == [
        [True], [False], [], [True], [], [False]
    ]  # fmt: skip
    # 1 and 3 were updated last at iterations 2 and 4, which no batch behind them uses
    # again: written back early or at the end; 2 never is.
    written = [k for p in plans for k in p.write_back.tolist()]
    assert 2 not in written and herald.counts.grad_pushes == 2
    assert herald.counts.write_backs + herald.counts.final_flush == 2
    # Iteration 4: 3 is dirty at its trainer (updated locally in 3) and unused after it,
    # so it stays local (a gradient pushed to the PS would miss the local update).
    for scheduler in (Scheduler(1, 10, "herald"), Scheduler(1, 10, "naive", look_ahead=3)):
        assert all(not p.push_grads.shape[0] for p in run(scheduler, batches))

    # 2's gradient of iteration 1 goes with plan 2, into iteration 2's commit; the last
    # iteration has no next one to take it.
    assert [p.push_later.tolist() for p in plans] == [[], [2], [], [], [], []]
    # Not at a checkpoint (iteration 1 with checkpoint_every 2), nor when the next batch
    # trains with another learning rate: its commit would apply it with that one.
    checkpointed = run(Scheduler(1, 10, "herald", look_ahead=3, checkpoint_every=2), batches)
    assert checkpointed[1].push_grads.tolist() == [2] and checkpointed[1].checkpoint
    decayed = [*batches[:2], *(replace(b, lr_scale=0.5) for b in batches[2:])]
    slower = run(Scheduler(1, 10, "herald", look_ahead=3), decayed)
    assert [p.push_grads.tolist() for p in slower] == [p.push_grads.tolist() for p in plans]
    assert not any(p.push_later.shape[0] for p in [*checkpointed[:2], *slower])


def test_look_ahead_holds_batches_and_releases_them_in_order() -> None:
    """With look-ahead k, the plans of batch t are released when batch t + k comes; a
    flush batch releases every batch held and its own plans; finish releases the rest."""
    scheduler = Scheduler(1, 10, "herald", look_ahead=3)
    batches = one_key_batches([1, 2, 3, 4, 5, 6, 7])
    released = [[p.iteration for p in scheduler.submit(b)] for b in batches[:5]]
    assert released == [[], [], [], [0], [1]]
    assert scheduler.next_iteration == 5
    flush = replace(batches[5], flush=True)
    assert [p.iteration for p in scheduler.submit(flush)] == [2, 3, 4, 5]
    assert [p.iteration for p in scheduler.submit(batches[6])] == []
    assert [p.iteration for p in scheduler.finish()] == [6]


def test_a_batch_held_that_cannot_be_planned_refuses_the_next_one() -> None:
    """A batch the cache cannot hold is planned only when look-ahead later batches came:
    that submit is refused, nothing is planned, and the same submit is refused again."""
    scheduler = Scheduler(1, 2, "herald", look_ahead=2)
    assert scheduler.submit(Batch.from_arrays(0, [0, 1], [1], 1)) == []
    assert scheduler.submit(Batch.from_arrays(1, [0, 3], [5, 6, 7], 1)) == []  # 3 > 2 rows
    nxt = Batch.from_arrays(2, [0, 1], [2], 1)
    for _ in range(2):
        with pytest.raises(CacheTooSmall):
            scheduler.submit(nxt)
        assert scheduler.next_iteration == 2
    assert scheduler.counts.iterations == 1


def test_look_ahead_outside_one_to_thirty_two_is_refused() -> None:
    for bad in (0, -1, 33):
        with pytest.raises(InvalidArgument, match="look_ahead"):
            Scheduler(2, 10, "herald", look_ahead=bad)
