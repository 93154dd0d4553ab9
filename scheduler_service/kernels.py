"""Compiled kernels of the fast scheduler (numba, GIL released).

They work on the state of :class:`scheduler_service.mirror.CacheMirror` (its
docstring describes the per-key records, the per-worker LRU queues and the
per-worker position tables).

A batch is first given *local ids* (``lid``): its distinct keys numbered
0..nb-1 in order of first occurrence. Every per-key pass of a batch then works
on small arrays indexed by lid that stay in the CPU caches (a 64 x 512 batch of
852k keys has about 154k distinct ones); the mirror's records, hundreds of MB,
are read and written once per distinct key (stage 1 and stage 5), and each
worker's position table once per (key, worker) pair (stage 4).
"""

from __future__ import annotations

import numpy as np

from heraldps.jit import njit
from heraldps.prefetch import prefetch

PREFETCH_DISTANCE = 16
EMPTY = -1  # an empty slot of a local-id table or a position table
_DEBRUIJN_INT = 0x03F79D71B4CB0A89
_DEBRUIJN = np.uint64(_DEBRUIJN_INT)
_BIT_OF = np.zeros(64, dtype=np.int64)
for _i in range(64):
    _BIT_OF[(((1 << _i) * _DEBRUIJN_INT) & (2**64 - 1)) >> 58] = _i
_MIX = np.uint64(0x9E3779B97F4A7C15)
_LOW32 = np.int64(0xFFFFFFFF)


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


@njit(nogil=True, inline="always")
def mix(x):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """A cheap 64-bit mix for hashing (multiply, fold the high half down)."""
    h = np.uint64(x) * _MIX
    return h ^ (h >> np.uint64(29))


# ----- stage 0: local ids -------------------------------------------------------
@njit(nogil=True)
def local_ids(keys, table):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Local id of every key (distinct keys numbered in order of first occurrence).

    ``table`` is an all-EMPTY ``[S, 2]`` scratch table (key, lid), S a power of two;
    it is left all-EMPTY again. Returns (lids, distinct keys); (None-like) an empty
    ``lids`` when more than S / 2 distinct keys came (the caller retries with 2 S).
    """
    n = keys.shape[0]
    mask = np.uint64(table.shape[0] - 1)
    limit = table.shape[0] // 2
    lids = np.empty(n, dtype=np.int64)
    uniq = np.empty(min(n, limit), dtype=np.int64)
    slot_of = np.empty(min(n, limit), dtype=np.int64)
    nb = 0
    full = False
    for i in range(min(PREFETCH_DISTANCE, n)):
        prefetch(table, mix(keys[i]) & mask)
    for i in range(n):
        if i + PREFETCH_DISTANCE < n:
            prefetch(table, mix(keys[i + PREFETCH_DISTANCE]) & mask)
        k = keys[i]
        s = mix(k) & mask
        while table[s, 1] != EMPTY and table[s, 0] != k:
            s = (s + np.uint64(1)) & mask
        if table[s, 1] == EMPTY:
            if nb == limit:
                full = True
                break
            table[s, 0] = k
            table[s, 1] = nb
            uniq[nb] = k
            slot_of[nb] = s
            nb += 1
        lids[i] = table[s, 1]
    for j in range(nb):
        table[slot_of[j], 1] = EMPTY
    if full:
        return lids[:0], uniq[:0]
    return lids, uniq[:nb]


@njit(nogil=True)
def gather_holders(kids, holders):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``holders[kids]`` with the record 16 keys ahead prefetched."""
    n = kids.shape[0]
    out = np.empty(n, dtype=np.uint64)
    for i in range(min(PREFETCH_DISTANCE, n)):
        prefetch(holders, kids[i])
    for i in range(n):
        if i + PREFETCH_DISTANCE < n:
            prefetch(holders, kids[i + PREFETCH_DISTANCE])
        out[i] = holders[kids[i]]
    return out


# ----- stage 1: partition ----------------------------------------------------
@njit(nogil=True, inline="always")
def _score(offsets, lids, holders_l, seen, i, scores, touched):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``scores[w]`` = distinct keys of sample ``i`` that worker w holds validly, for the
    workers listed in ``touched[:count]`` (the others score 0); returns count."""
    count = 0
    for p in range(offsets[i], offsets[i + 1]):
        lid = lids[p]
        if seen[lid] == i:
            continue
        seen[lid] = i
        mask = holders_l[lid]
        while mask:
            low = mask & (~mask + np.uint64(1))
            w = bit_index(low)
            if scores[w] == 0:
                touched[count] = w
                count += 1
            scores[w] += 1
            mask ^= low
    return count


@njit(nogil=True)
def location_aware_assign(offsets, lids, holders_l, num_workers, per_worker):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Herald Algorithm 1: each sample, in input order, goes to the worker with room
    whose cache holds the most of its distinct keys validly (ties: lowest id).

    Only the workers that hold a key of the sample are scored; when none of those has
    room, the lowest-id worker with room wins (all others score 0). Also returns the
    locality counts of :func:`assignment_locality`, from the same scores.
    """
    samples = offsets.shape[0] - 1
    room = np.full(num_workers, per_worker, dtype=np.int64)
    assign = np.empty(samples, dtype=np.int64)
    scores = np.zeros(num_workers, dtype=np.int64)
    touched = np.empty(num_workers, dtype=np.int64)
    seen = np.full(holders_l.shape[0], -1, dtype=np.int64)
    first_free = 0
    held = 0
    local = 0
    for i in range(samples):
        count = _score(offsets, lids, holders_l, seen, i, scores, touched)
        best = -1
        best_score = 0
        top = 0
        for j in range(count):
            w = touched[j]
            s = scores[w]
            scores[w] = 0
            top = max(top, s)
            if room[w] > 0 and (s > best_score or (s == best_score and w < best)):
                best = w
                best_score = s
        if best < 0:
            while room[first_free] == 0:
                first_free += 1
            best = first_free
        assign[i] = best
        room[best] -= 1
        if top > 0:
            held += 1
            if best_score == top:
                local += 1
    return assign, held, local


@njit(nogil=True)
def assignment_locality(offsets, lids, holders_l, assign, num_workers):  # type: ignore[no-untyped-def]  # pragma: no cover
    """How local an assignment is, on the valid copies at the start of the batch:
    ``held`` = samples some worker holds at least one key of validly, ``local`` = those
    assigned to a worker that holds the most of their keys (ignoring room)."""
    scores = np.zeros(num_workers, dtype=np.int64)
    touched = np.empty(num_workers, dtype=np.int64)
    seen = np.full(holders_l.shape[0], -1, dtype=np.int64)
    held = 0
    local = 0
    for i in range(offsets.shape[0] - 1):
        count = _score(offsets, lids, holders_l, seen, i, scores, touched)
        mine = scores[assign[i]]
        top = 0
        for j in range(count):
            top = max(top, scores[touched[j]])
            scores[touched[j]] = 0
        if top > 0:
            held += 1
            if mine == top:
                local += 1
    return held, local


# ----- stage 2: mini-batches --------------------------------------------------
@njit(nogil=True)
def worker_lists(offsets, lids, assign, num_workers, distinct):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Distinct keys (lids) of each worker's mini-batch, in first-occurrence order,
    grouped by worker (worker w's at ``offsets_out[w]:offsets_out[w + 1]``), and
    ``trainers[lid]`` (bit w: worker w trains the key this batch)."""
    total = lids.shape[0]
    trainers = np.zeros(distinct, dtype=np.uint64)
    pair_worker = np.empty(total, dtype=np.int64)
    pair_lid = np.empty(total, dtype=np.int64)
    npairs = 0
    for i in range(offsets.shape[0] - 1):
        w = assign[i]
        bit = np.uint64(1) << np.uint64(w)
        for p in range(offsets[i], offsets[i + 1]):
            lid = lids[p]
            if not trainers[lid] & bit:
                trainers[lid] |= bit
                pair_worker[npairs] = w
                pair_lid[npairs] = lid
                npairs += 1
    counts = np.zeros(num_workers + 1, dtype=np.int64)
    for q in range(npairs):
        counts[pair_worker[q] + 1] += 1
    offsets_out = np.cumsum(counts)
    fill = offsets_out[:-1].copy()
    out = np.empty(npairs, dtype=np.int64)
    for q in range(npairs):
        w = pair_worker[q]
        out[fill[w]] = pair_lid[q]
        fill[w] += 1
    return offsets_out, out, trainers


# ----- per-worker position tables ------------------------------------------------
# A slot holds kid << 32 | position (position < 2**32), EMPTY when free; linear probing
# on mix(kid), load <= 1/2, backward-shift deletion (no tombstones).
@njit(nogil=True, inline="always")
def _home(table, kid):  # type: ignore[no-untyped-def]  # pragma: no cover
    return np.int64(mix(kid) & np.uint64(table.shape[0] - 1))


@njit(nogil=True, inline="always")
def table_slot(table, kid):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Slot of ``kid``, or the empty slot where it would go."""
    mask = table.shape[0] - 1
    s = _home(table, kid)
    while table[s] != EMPTY and (table[s] >> 32) != kid:
        s = (s + 1) & mask
    return s


@njit(nogil=True, inline="always")
def table_remove(table, slot):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Free ``slot``; move later entries of its probe run back into the gap."""
    mask = table.shape[0] - 1
    i = slot
    table[i] = EMPTY
    j = i
    while True:
        j = (j + 1) & mask
        if table[j] == EMPTY:
            return
        start = _home(table, table[j] >> 32)
        # Move entry j back to i unless its home lies cyclically in (i, j].
        if (start <= i or start > j) if i <= j else (start <= i and start > j):
            table[i] = table[j]
            table[j] = EMPTY
            i = j


@njit(nogil=True)
def grown_table(table, size):  # type: ignore[no-untyped-def]  # pragma: no cover
    """A table of ``size`` slots holding every entry of ``table``."""
    out = np.full(size, EMPTY, dtype=np.int64)
    for s in range(table.shape[0]):
        entry = table[s]
        if entry != EMPTY:
            out[table_slot(out, entry >> 32)] = entry
    return out


@njit(nogil=True)
def compact_queue(w, queue, head, tail, table):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Drop worker ``w``'s stale queue entries and renumber the live ones from 0."""
    j = 0
    for position in range(head[w], tail[w]):
        k = np.int64(queue[w, position])
        s = table_slot(table, k)
        if table[s] != EMPTY and (table[s] & _LOW32) == position:
            queue[w, j] = k
            table[s] = (k << 32) | j
            j += 1
    head[w] = 0
    tail[w] = j


# ----- stage 3: cache operations ----------------------------------------------
@njit(nogil=True)
def cache_ops(  # type: ignore[no-untyped-def]  # pragma: no cover
    workers,
    wl_offsets,
    wl_lids,
    kid_of,
    key_of_lid,
    holders_l,
    trainers,
    capacity,
    tables,
    queue,
    head,
    tail,
    used,
    dirty_owner,
    key_of,
    out_keys,
    counts,
    victims,
):
    """LRU touches, pulls and evictions of ``workers``, each in first-occurrence order.

    Workers are independent here (each has its own queue and position table, and the
    pass writes no shared record), so two calls on disjoint sets of workers may run at
    once. A key is cached by w iff its kid is in w's position table; whether w's copy
    is valid is bit w of ``holders_l`` (as at the start of the batch: w's evictions
    only drop keys w has not touched in this batch).

    Worker w's outputs go to its region ``r = wl_offsets[w]:wl_offsets[w + 1]`` of the
    rows of ``out_keys``: row 0 pulled keys, row 1 evicted keys (eviction order), row 2
    trained keys (those only w trains first, then co-trained ones), row 3 scratch; and
    ``victims[r]``: evicted kids, negated (-kid - 1) when w held them dirty. ``counts[w]``
    = (pulls, evictions, where co-trained keys start in row 2, hits).
    """
    pulled = out_keys[0]
    evicted = out_keys[1]
    trained = out_keys[2]
    co_trained = out_keys[3]
    for w in workers:
        table = tables[w]
        start = wl_offsets[w]
        end = wl_offsets[w + 1]
        bit = np.uint64(1) << np.uint64(w)
        npl = start
        nev = start
        nhits = 0
        nlocal = start
        nco = start
        for q in range(start, min(start + PREFETCH_DISTANCE, end)):
            prefetch(table, _home(table, kid_of[wl_lids[q]]))
        for q in range(start, end):
            if q + PREFETCH_DISTANCE < end:
                prefetch(table, _home(table, kid_of[wl_lids[q + PREFETCH_DISTANCE]]))
            lid = wl_lids[q]
            k = kid_of[lid]
            s = table_slot(table, k)
            if table[s] != EMPTY:
                if holders_l[lid] & bit:
                    nhits += 1
                else:  # a stale copy: refresh it in place
                    pulled[npl] = key_of_lid[lid]
                    npl += 1
            else:
                pulled[npl] = key_of_lid[lid]
                npl += 1
                if used[w] < capacity:
                    used[w] += 1
                else:  # evict the least recently touched: the oldest live queue entry
                    while True:
                        position = head[w]
                        head[w] += 1
                        victim = np.int64(queue[w, position])
                        vs = table_slot(table, victim)
                        if table[vs] != EMPTY and (table[vs] & _LOW32) == position:
                            break
                    table_remove(table, vs)
                    evicted[nev] = key_of[victim]
                    victims[nev] = -victim - 1 if dirty_owner[victim] == w else victim
                    nev += 1
                    s = table_slot(table, k)  # the removal may have moved entries
            position = tail[w]
            tail[w] += 1
            queue[w, position] = k
            table[s] = (k << 32) | position
            t = trainers[lid]
            if t & (t - np.uint64(1)):  # more than one bit: co-trained
                co_trained[nco] = key_of_lid[lid]
                nco += 1
            else:
                trained[nlocal] = key_of_lid[lid]
                nlocal += 1
        trained[nlocal : nlocal + nco - start] = co_trained[start:nco]
        counts[w, 0] = npl - start
        counts[w, 1] = nev - start
        counts[w, 2] = nlocal
        counts[w, 3] = nhits
    return 0


@njit(nogil=True)
def drop_victims(wl_offsets, counts, victims, holders):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Clear bit w of every key worker w evicted; return the dirty evictions as kid *
    64 + w, in worker order (each worker's in eviction order)."""
    num_workers = counts.shape[0]
    total = 0
    for w in range(num_workers):
        total += counts[w, 1]
    dirty = np.empty(total, dtype=np.int64)
    ndirty = 0
    for w in range(num_workers):
        bit = np.uint64(1) << np.uint64(w)
        for q in range(wl_offsets[w], wl_offsets[w] + counts[w, 1]):
            v = victims[q]
            if v < 0:
                v = -v - 1
                dirty[ndirty] = v * 64 + w
                ndirty += 1
            holders[v] &= ~bit
    return dirty[:ndirty]


# ----- stage 4: synchronisation ------------------------------------------------
@njit(nogil=True)
def settle(kid_of, key_of_lid, trainers, holders, dirty_owner, key_of, dirty_evicted, on_demand):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Write-backs owed by the previous iteration, then this iteration's training effects.

    The previous iteration writes back a dirty row that another worker needs
    now, or that its owner evicts now. Returns (previous write-backs: worker,
    key; this iteration's write-backs, naive sync only: worker, key).
    """
    total = kid_of.shape[0]
    prev_worker = np.empty(total + dirty_evicted.shape[0], dtype=np.int64)
    prev_key = np.empty(total + dirty_evicted.shape[0], dtype=np.int64)
    now_worker = np.empty(0 if on_demand else total, dtype=np.int64)
    now_key = np.empty(0 if on_demand else total, dtype=np.int64)
    nprev = nnow = 0
    # Dirty rows their owner evicts now (first: the owner may pull the row back
    # later in this batch and dirty it again).
    for q in range(dirty_evicted.shape[0]):
        k = dirty_evicted[q] // 64
        w = dirty_evicted[q] % 64
        if dirty_owner[k] == w:
            prev_worker[nprev] = w
            prev_key[nprev] = key_of[k]
            nprev += 1
            dirty_owner[k] = -1
    for q in range(min(PREFETCH_DISTANCE, total)):
        prefetch(dirty_owner, kid_of[q])
    for q in range(total):
        if q + PREFETCH_DISTANCE < total:
            prefetch(dirty_owner, kid_of[q + PREFETCH_DISTANCE])
        k = kid_of[q]
        owner = dirty_owner[k]
        t = trainers[q]
        if owner >= 0 and t & ~(np.uint64(1) << np.uint64(owner)):  # another worker needs it
            prev_worker[nprev] = owner
            prev_key[nprev] = key_of_lid[q]
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
            now_key[nnow] = key_of_lid[q]
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
