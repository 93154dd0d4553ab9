"""Compiled kernels of the fast scheduler (numba, GIL released).

They work on the state of :class:`scheduler_service.mirror.CacheMirror` (its
docstring describes the per-key records and the per-worker LRU queues).
Pairs of (kid, worker) travel packed as ``kid * STRIDE + worker``. Above 16
workers a key's LRU position in a worker lives in a removable slot table
(``heraldps.keyindex.table_*``) keyed by that packing.
"""

from __future__ import annotations

import numpy as np

from heraldps.jit import njit
from heraldps.keyindex import home, table_find, table_put, table_remove
from heraldps.prefetch import prefetch

STRIDE = 64  # (kid, worker) packed as kid * STRIDE + worker
PREFETCH_DISTANCE = 16
_DEBRUIJN_INT = 0x03F79D71B4CB0A89
_DEBRUIJN = np.uint64(_DEBRUIJN_INT)
_BIT_OF = np.zeros(64, dtype=np.int64)
for _i in range(64):
    _BIT_OF[(((1 << _i) * _DEBRUIJN_INT) & (2**64 - 1)) >> 58] = _i


@njit(nogil=True, inline="always")
def bit_index(low: np.uint64) -> int:  # pragma: no cover - compiled
    """Index of the single set bit of ``low``."""
    index: int = _BIT_OF[(low * _DEBRUIJN) >> np.uint64(58)]
    return index


@njit(nogil=True, inline="always")
def popcount(x: np.uint64) -> int:  # pragma: no cover - compiled
    count = 0
    while x:
        x &= x - np.uint64(1)
        count += 1
    return count


# ----- LRU positions: in the key's record (<= 16 workers) or in the table ------------
@njit(nogil=True, inline="always")
def _position(positions, table, dense, k, w):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Position of kid ``k`` in worker ``w``'s LRU queue, -1 when not cached."""
    if dense:
        return np.int64(positions[k, w])
    s = table_find(table, k * STRIDE + w)
    return table[s, 1] if s >= 0 else np.int64(-1)


@njit(nogil=True, inline="always")
def _set_position(positions, table, dense, k, w, position):  # type: ignore[no-untyped-def]  # pragma: no cover
    if dense:
        positions[k, w] = position
    else:
        table_put(table, k * STRIDE + w, position)


@njit(nogil=True, inline="always")
def _forget_position(positions, table, dense, k, w):  # type: ignore[no-untyped-def]  # pragma: no cover
    if dense:
        positions[k, w] = -1
    else:
        table_remove(table, table_find(table, k * STRIDE + w))


@njit(nogil=True)
def compact_queue(w, queue, head, tail, positions, table, dense):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Drop worker ``w``'s stale queue entries and renumber the live ones from 0."""
    j = 0
    for position in range(head[w], tail[w]):
        k = queue[w, position]
        if _position(positions, table, dense, k, w) == position:
            queue[w, j] = k
            _set_position(positions, table, dense, k, w, j)
            j += 1
    head[w] = 0
    tail[w] = j


@njit(nogil=True)
def record_keys(kids, keys, known, key_of):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Store the key of every kid registered in this batch (``kid >= known``)."""
    for i in range(kids.shape[0]):
        if kids[i] >= known:
            key_of[kids[i]] = keys[i]


# ----- stage 1: partition ----------------------------------------------------
@njit(nogil=True, inline="always")
def _score(offsets, kids, holders, seen, stamp, i, scores):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``scores[w]`` = distinct keys of sample ``i`` that worker w holds validly."""
    total = kids.shape[0]
    scores[:] = 0
    for p in range(offsets[i], offsets[i + 1]):
        if p + PREFETCH_DISTANCE < total:
            prefetch(holders, kids[p + PREFETCH_DISTANCE])
        k = kids[p]
        if seen[k] == stamp:
            continue
        seen[k] = stamp
        mask = holders[k]
        while mask:
            low = mask & (~mask + np.uint64(1))
            scores[bit_index(low)] += 1
            mask ^= low


@njit(nogil=True)
def location_aware_assign(offsets, kids, holders, seen, stamp0, num_workers, per_worker):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Herald Algorithm 1: each sample, in input order, goes to the worker with room
    whose cache holds the most of its distinct keys validly (ties: lowest id).

    Also returns the locality counts of :func:`assignment_locality`, from the same scores.
    """
    samples = offsets.shape[0] - 1
    total = kids.shape[0]
    room = np.full(num_workers, per_worker, dtype=np.int64)
    assign = np.empty(samples, dtype=np.int64)
    scores = np.zeros(num_workers, dtype=np.int64)
    held = 0
    local = 0
    for p in range(min(PREFETCH_DISTANCE, total)):
        prefetch(holders, kids[p])
    for i in range(samples):
        _score(offsets, kids, holders, seen, stamp0 + i, i, scores)
        best = -1
        best_score = -1
        top = 0
        for w in range(num_workers):
            top = max(top, scores[w])
            if room[w] > 0 and scores[w] > best_score:
                best = w
                best_score = scores[w]
        assign[i] = best
        room[best] -= 1
        if top > 0:
            held += 1
            if best_score == top:
                local += 1
    return assign, held, local


@njit(nogil=True)
def assignment_locality(offsets, kids, holders, seen, stamp0, assign, num_workers):  # type: ignore[no-untyped-def]  # pragma: no cover
    """How local an assignment is, on the valid copies at the start of the batch:
    ``held`` = samples some worker holds at least one key of validly, ``local`` = those
    assigned to a worker that holds the most of their keys (ignoring room)."""
    total = kids.shape[0]
    scores = np.zeros(num_workers, dtype=np.int64)
    held = 0
    local = 0
    for p in range(min(PREFETCH_DISTANCE, total)):
        prefetch(holders, kids[p])
    for i in range(offsets.shape[0] - 1):
        _score(offsets, kids, holders, seen, stamp0 + i, i, scores)
        top = scores.max()
        if top > 0:
            held += 1
            if scores[assign[i]] == top:
                local += 1
    return held, local


# ----- stage 2: mini-batches --------------------------------------------------
@njit(nogil=True)
def worker_lists(offsets, kids, assign, num_workers, stamp, trainers, batch_id):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Distinct keys of the batch, and of each worker's mini-batch, in first-occurrence order.

    Also fills ``trainers[kid]`` (bit w: worker w trains the key this batch).
    """
    total = kids.shape[0]
    batch_keys = np.empty(total, dtype=np.int64)
    pair_worker = np.empty(total, dtype=np.int64)
    pair_kid = np.empty(total, dtype=np.int64)
    nb = 0
    npairs = 0
    for p in range(min(PREFETCH_DISTANCE, total)):
        prefetch(stamp, kids[p])
    for i in range(offsets.shape[0] - 1):
        w = assign[i]
        bit = np.uint64(1) << np.uint64(w)
        for p in range(offsets[i], offsets[i + 1]):
            if p + PREFETCH_DISTANCE < total:
                prefetch(stamp, kids[p + PREFETCH_DISTANCE])
            k = kids[p]
            if stamp[k] != batch_id:
                stamp[k] = batch_id
                trainers[k] = 0
                batch_keys[nb] = k
                nb += 1
            if not trainers[k] & bit:
                trainers[k] |= bit
                pair_worker[npairs] = w
                pair_kid[npairs] = k
                npairs += 1
    counts = np.zeros(num_workers + 1, dtype=np.int64)
    for q in range(npairs):
        counts[pair_worker[q] + 1] += 1
    offsets_out = np.cumsum(counts)
    fill = offsets_out[:-1].copy()
    out = np.empty(npairs, dtype=np.int64)
    for q in range(npairs):
        w = pair_worker[q]
        out[fill[w]] = pair_kid[q]
        fill[w] += 1
    return batch_keys[:nb], offsets_out, out


# ----- stage 3: cache operations ----------------------------------------------
@njit(nogil=True)
def cache_ops(  # type: ignore[no-untyped-def]  # pragma: no cover
    wl_offsets,
    wl_kids,
    num_workers,
    capacity,
    holders,
    present,
    trainers,
    dirty_owner,
    key_of,
    positions,
    table,
    dense,
    queue,
    head,
    tail,
    used,
):
    """LRU touches, pulls and evictions of every worker, in first-occurrence order.

    The same pass splits each worker's keys into those only it trains
    (first) and co-trained ones, order kept within each part. Returns (evict
    offsets, evicted keys, pull offsets, pulled keys, trained keys laid out
    like ``wl_kids``, where each worker's co-trained keys start, dirty rows
    evicted as kid*STRIDE+worker, hits).
    """
    total = wl_kids.shape[0]
    trained = np.empty(total, dtype=np.int64)
    co_trained = np.empty(total, dtype=np.int64)
    co_start = np.empty(num_workers, dtype=np.int64)
    evicted = np.empty(total, dtype=np.int64)
    ev_counts = np.zeros(num_workers + 1, dtype=np.int64)
    pulled = np.empty(total, dtype=np.int64)
    pl_counts = np.zeros(num_workers + 1, dtype=np.int64)
    dirty_evicted = np.empty(total, dtype=np.int64)
    nev = npl = ndirty = hits = 0
    for q in range(min(PREFETCH_DISTANCE, total)):
        prefetch(present, wl_kids[q])
    for w in range(num_workers):
        bit = np.uint64(1) << np.uint64(w)
        nlocal = wl_offsets[w]
        nco = 0
        for q in range(wl_offsets[w], wl_offsets[w + 1]):
            if q + PREFETCH_DISTANCE < total:
                ahead = wl_kids[q + PREFETCH_DISTANCE]
                prefetch(present, ahead)
                if not dense:  # its (kid, worker) slot, if the pair is still this worker's
                    prefetch(table, home(table, ahead * STRIDE + w))
            k = wl_kids[q]
            if present[k] & bit:
                if holders[k] & bit:
                    hits += 1
                else:  # a stale copy: refresh it in place
                    pulled[npl] = key_of[k]
                    npl += 1
                    pl_counts[w + 1] += 1
                    holders[k] |= bit
            else:
                pulled[npl] = key_of[k]
                npl += 1
                pl_counts[w + 1] += 1
                if used[w] < capacity:
                    used[w] += 1
                else:  # evict the least recently touched: the oldest live queue entry
                    while True:
                        position = head[w]
                        head[w] += 1
                        victim = queue[w, position]
                        if _position(positions, table, dense, victim, w) == position:
                            break
                    _forget_position(positions, table, dense, victim, w)
                    holders[victim] &= ~bit
                    present[victim] &= ~bit
                    evicted[nev] = key_of[victim]
                    nev += 1
                    ev_counts[w + 1] += 1
                    if dirty_owner[victim] == w:
                        dirty_evicted[ndirty] = victim * STRIDE + w
                        ndirty += 1
                holders[k] |= bit
                present[k] |= bit
            position = tail[w]
            tail[w] += 1
            queue[w, position] = k
            _set_position(positions, table, dense, k, w, position)
            t = trainers[k]
            if t & (t - np.uint64(1)):  # more than one bit: co-trained
                co_trained[nco] = key_of[k]
                nco += 1
            else:
                trained[nlocal] = key_of[k]
                nlocal += 1
        co_start[w] = nlocal
        trained[nlocal : nlocal + nco] = co_trained[:nco]
    return (
        np.cumsum(ev_counts),
        evicted[:nev],
        np.cumsum(pl_counts),
        pulled[:npl],
        trained,
        co_start,
        dirty_evicted[:ndirty],
        hits,
    )


# ----- stage 4: synchronisation ------------------------------------------------
@njit(nogil=True)
def settle(batch_keys, trainers, holders, dirty_owner, key_of, dirty_evicted, on_demand):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Write-backs owed by the previous iteration, then this iteration's training effects.

    The previous iteration writes back a dirty row that another worker needs
    now, or that its owner evicts now. Returns (previous write-backs: worker,
    key; this iteration's write-backs, naive sync only: worker, key).
    """
    total = batch_keys.shape[0]
    prev_worker = np.empty(total + dirty_evicted.shape[0], dtype=np.int64)
    prev_key = np.empty(total + dirty_evicted.shape[0], dtype=np.int64)
    now_worker = np.empty(0 if on_demand else total, dtype=np.int64)
    now_key = np.empty(0 if on_demand else total, dtype=np.int64)
    nprev = nnow = 0
    # Dirty rows their owner evicts now (first: the owner may pull the row back
    # later in this batch and dirty it again).
    for q in range(dirty_evicted.shape[0]):
        k = dirty_evicted[q] // STRIDE
        w = dirty_evicted[q] % STRIDE
        if dirty_owner[k] == w:
            prev_worker[nprev] = w
            prev_key[nprev] = key_of[k]
            nprev += 1
            dirty_owner[k] = -1
    for q in range(min(PREFETCH_DISTANCE, total)):
        prefetch(dirty_owner, batch_keys[q])
    for q in range(total):
        if q + PREFETCH_DISTANCE < total:
            prefetch(dirty_owner, batch_keys[q + PREFETCH_DISTANCE])
        k = batch_keys[q]
        owner = dirty_owner[k]
        t = trainers[k]
        if owner >= 0 and t & ~(np.uint64(1) << np.uint64(owner)):  # another worker needs it
            prev_worker[nprev] = owner
            prev_key[nprev] = key_of[k]
            nprev += 1
            dirty_owner[k] = -1
        if popcount(t) > 1:
            holders[k] = 0  # every copy is stale after the commit
            continue
        w = bit_index(t)
        holders[k] = t  # only the trainer holds the newest value
        if on_demand:
            dirty_owner[k] = w
        else:
            now_worker[nnow] = w
            now_key[nnow] = key_of[k]
            nnow += 1
    return prev_worker[:nprev], prev_key[:nprev], now_worker[:nnow], now_key[:nnow]


# ----- stage 5: write-back lists -------------------------------------------------
@njit(nogil=True)
def group_by_worker(workers, keys, num_workers):  # type: ignore[no-untyped-def]  # pragma: no cover
    """(per-worker offsets, ``keys`` grouped by worker, order kept within a worker)."""
    counts = np.zeros(num_workers + 1, dtype=np.int64)
    for q in range(workers.shape[0]):
        counts[workers[q] + 1] += 1
    offsets = np.cumsum(counts)
    fill = offsets[:-1].copy()
    grouped = np.empty(keys.shape[0], dtype=np.int64)
    for q in range(workers.shape[0]):
        grouped[fill[workers[q]]] = keys[q]
        fill[workers[q]] += 1
    return offsets, grouped
