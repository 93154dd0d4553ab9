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
from heraldps.keyindex import home, probe_from
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


# ----- stage 0: local ids and the batch's key rows ---------------------------------
# ``info[lid]`` (uint64 [nb, 4], one 32-byte row per distinct key of the batch):
KID, KEY, HOLDERS, TRAINERS = 0, 1, 2, 3


@njit(nogil=True)
def local_ids(keys, table, lids, start):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Number the distinct keys of ``keys`` in order of first occurrence, writing each
    key's number to ``lids[start + i]``.

    ``table`` is an all-EMPTY ``[S, 2]`` scratch table (key, lid), S a power of two, left
    holding the keys (:func:`clear_slots` empties it). Returns (distinct keys, their
    slots); both empty when more than S / 2 distinct keys came (retry with 2 S).
    """
    n = keys.shape[0]
    mask = np.uint64(table.shape[0] - 1)
    limit = table.shape[0] // 2
    uniq = np.empty(min(n, limit), dtype=np.int64)
    slot_of = np.empty(min(n, limit), dtype=np.int64)
    nb = 0
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
                clear_slots(table, slot_of[:nb])
                return uniq[:0], slot_of[:0]
            table[s, 0] = k
            table[s, 1] = nb
            uniq[nb] = k
            slot_of[nb] = s
            nb += 1
        lids[start + i] = table[s, 1]
    return uniq[:nb], slot_of[:nb]


@njit(nogil=True)
def clear_slots(table, slots):  # type: ignore[no-untyped-def]  # pragma: no cover
    for j in range(slots.shape[0]):
        table[slots[j], 1] = EMPTY


@njit(nogil=True)
def merge_local_ids(table, first, second, lids, start):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Join the numbering of a batch's second half (``second``, its lids at
    ``lids[start:]``) to the first's (``first``, in ``table``): keys the first half has
    keep its number, the others follow in their order. Returns the batch's distinct keys."""
    nfirst = first.shape[0]
    mask = np.uint64(table.shape[0] - 1)
    remap = np.empty(second.shape[0], dtype=np.int64)
    uniq = np.empty(nfirst + second.shape[0], dtype=np.int64)
    uniq[:nfirst] = first
    nb = nfirst
    m = second.shape[0]
    for j in range(min(PREFETCH_DISTANCE, m)):
        prefetch(table, mix(second[j]) & mask)
    for j in range(m):
        if j + PREFETCH_DISTANCE < m:
            prefetch(table, mix(second[j + PREFETCH_DISTANCE]) & mask)
        k = second[j]
        s = mix(k) & mask
        while table[s, 1] != EMPTY and table[s, 0] != k:
            s = (s + np.uint64(1)) & mask
        if table[s, 1] != EMPTY:
            remap[j] = table[s, 1]
        else:
            remap[j] = nb
            uniq[nb] = k
            nb += 1
    for i in range(start, lids.shape[0]):
        lids[i] = remap[lids[i]]
    return uniq[:nb]


@njit(nogil=True)
def key_rows(slots, uniq, holders, info, first, last):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Fill ``info[first:last]`` (KID, KEY, HOLDERS; TRAINERS 0) for the batch's distinct
    keys ``uniq[first:last]``, looked up in a ``KeyIndex``'s ``slots`` (read only, so two
    ranges may run at once). A key not registered yet gets KID 2**64 - 1 (-1) and no
    holders. Two prefetch levels: the index slot 2 x 16 keys ahead, the record (which
    needs the slot's kid) 16 ahead."""
    ahead = PREFETCH_DISTANCE
    for i in range(first, min(first + 2 * ahead, last)):
        prefetch(slots, home(slots, uniq[i]))
    for i in range(first, min(first + ahead, last)):
        s = probe_from(slots, uniq[i], home(slots, uniq[i]))
        info[i, KID] = slots[s, 1]
        if slots[s, 1] >= 0:
            prefetch(holders, slots[s, 1])
    for i in range(first, last):
        j = i + ahead
        if j + ahead < last:
            prefetch(slots, home(slots, uniq[j + ahead]))
        if j < last:
            s = probe_from(slots, uniq[j], home(slots, uniq[j]))
            info[j, KID] = slots[s, 1]
            if slots[s, 1] >= 0:
                prefetch(holders, slots[s, 1])
        k = np.int64(info[i, KID])
        info[i, KEY] = uniq[i]
        info[i, HOLDERS] = holders[k] if k >= 0 else np.uint64(0)
        info[i, TRAINERS] = 0


@njit(nogil=True)
def rows_of_kids(kids, uniq, holders, info):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`key_rows` for keys whose kids are known (all registered)."""
    n = kids.shape[0]
    for i in range(min(PREFETCH_DISTANCE, n)):
        prefetch(holders, kids[i])
    for i in range(n):
        if i + PREFETCH_DISTANCE < n:
            prefetch(holders, kids[i + PREFETCH_DISTANCE])
        info[i, KID] = kids[i]
        info[i, KEY] = uniq[i]
        info[i, HOLDERS] = holders[kids[i]]
        info[i, TRAINERS] = 0


@njit(nogil=True, inline="always")
def _choose_worker(  # type: ignore[no-untyped-def]  # pragma: no cover
    i, offsets, lids, info, seen, room, scores, touched, choose, given, first_free, end
):
    """Sample ``i``'s worker (Algorithm 1's choice, or ``given[i]``), shared by
    :func:`partition` and :func:`choose_chunk`: (worker, lowest worker that may have room,
    1 if some worker holds one of its keys validly, 1 if the chosen one holds the most)."""
    count = 0
    for p in range(offsets[i], offsets[i + 1]):
        if p + PREFETCH_DISTANCE < end:
            prefetch(info, lids[p + PREFETCH_DISTANCE])
            prefetch(seen, lids[p + PREFETCH_DISTANCE])
        lid = lids[p]
        if seen[lid] == i:
            continue
        seen[lid] = i
        mask = info[lid, HOLDERS]
        while mask:
            low = mask & (~mask + np.uint64(1))
            w = bit_index(low)
            if scores[w] == 0:
                touched[count] = w
                count += 1
            scores[w] += 1
            mask ^= low
    top = 0
    if choose:
        best = -1
        best_score = 0
        for j in range(count):
            w = touched[j]
            sc = scores[w]
            top = max(top, sc)
            if room[w] > 0 and (sc > best_score or (sc == best_score and w < best)):
                best = w
                best_score = sc
        if best < 0:
            while room[first_free] == 0:
                first_free += 1
            best = first_free
        room[best] -= 1
    else:
        best = given[i]
        best_score = scores[best]
        for j in range(count):
            top = max(top, scores[touched[j]])
    for j in range(count):
        scores[touched[j]] = 0
    held = 1 if top > 0 else 0
    local = 1 if top > 0 and best_score == top else 0
    return best, first_free, held, local


# ----- stage 1: partition and mini-batches, one pass --------------------------
@njit(nogil=True)
def partition(offsets, lids, info, num_workers, per_worker, given, pairs, seen):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Each sample's worker and, in the same pass, each worker's mini-batch keys.

    With ``given`` empty: Herald Algorithm 1, each sample, in input order, goes to the
    worker with room whose cache holds the most of its distinct keys validly (ties: lowest
    id); only the workers that hold a key of the sample are scored, and when none of those
    has room the lowest-id worker with room wins (all others score 0). Otherwise sample i
    goes to ``given[i]``. Either way: ``held`` = samples some worker holds a key of
    validly, ``local`` = those assigned to a worker holding the most of their keys
    (ignoring room).

    The mini-batches: distinct keys (lids) of each worker's samples in first-occurrence
    order, grouped by worker (worker w's at ``wl_offsets[w]:wl_offsets[w + 1]``); sets
    ``info[lid, TRAINERS]`` (bit w: worker w trains the key).
    """
    samples = offsets.shape[0] - 1
    total = lids.shape[0]
    choose = given.shape[0] == 0
    room = np.full(num_workers, per_worker, dtype=np.int64)
    assign = np.empty(samples, dtype=np.int64)
    scores = np.zeros(num_workers, dtype=np.int64)
    touched = np.empty(num_workers, dtype=np.int64)
    seen[:] = -1  # ``seen`` (nb) and ``pairs`` (len(lids)) are the caller's scratch
    npairs = 0  # pairs: lid << 8 | worker
    first_free = 0
    held = 0
    local = 0
    for p in range(min(PREFETCH_DISTANCE, total)):
        prefetch(info, lids[p])
        prefetch(seen, lids[p])
    for i in range(samples):
        best, first_free, h, loc = _choose_worker(
            i, offsets, lids, info, seen, room, scores, touched, choose, given, first_free, total
        )
        assign[i] = best
        held += h
        local += loc
        bit = np.uint64(1) << np.uint64(best)
        for p in range(offsets[i], offsets[i + 1]):
            lid = lids[p]
            if not info[lid, TRAINERS] & bit:
                info[lid, TRAINERS] |= bit
                pairs[npairs] = (np.int64(lid) << 8) | best
                npairs += 1
    counts = np.zeros(num_workers + 1, dtype=np.int64)
    for q in range(npairs):
        counts[(pairs[q] & 255) + 1] += 1
    wl_offsets = np.cumsum(counts)
    fill = wl_offsets[:-1].copy()
    wl_lids = np.empty(npairs, dtype=np.int64)
    for q in range(npairs):
        w = pairs[q] & 255
        wl_lids[fill[w]] = pairs[q] >> 8
        fill[w] += 1
    return assign, held, local, wl_offsets, wl_lids


# The same stage in chunks of samples, for big batches: the caller chooses the workers of
# chunk c + 1 (``choose_chunk``) while the helper thread lists the keys of chunk c
# (``list_chunk``, chunks in order), then the pairs are grouped (``group_pairs``).
@njit(nogil=True)
def choose_chunk(offsets, lids, info, seen, room, state, assign, first, last, given):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`partition`'s choice for samples ``first..last-1``; ``state`` carries
    (lowest worker that may have room, held, local) from chunk to chunk."""
    num_workers = room.shape[0]
    choose = given.shape[0] == 0
    scores = np.zeros(num_workers, dtype=np.int64)
    touched = np.empty(num_workers, dtype=np.int64)
    first_free, held, local = state[0], state[1], state[2]
    end = offsets[last]
    for p in range(offsets[first], min(offsets[first] + PREFETCH_DISTANCE, end)):
        prefetch(info, lids[p])
        prefetch(seen, lids[p])
    for i in range(first, last):
        best, first_free, h, loc = _choose_worker(
            i, offsets, lids, info, seen, room, scores, touched, choose, given, first_free, end
        )
        assign[i] = best
        held += h
        local += loc
    state[0], state[1], state[2] = first_free, held, local
    return 0


@njit(nogil=True)
def list_chunk(offsets, lids, assign, trainers, pairs, state, first, last):  # type: ignore[no-untyped-def]  # pragma: no cover
    """:func:`partition`'s lists for samples ``first..last-1`` (after every earlier
    chunk's): new (lid, worker) pairs appended to ``pairs`` as ``lid << 8 | w`` at
    ``state[0]``; ``trainers[lid]`` bit w set."""
    npairs = state[0]
    end = offsets[last]
    for p in range(offsets[first], min(offsets[first] + PREFETCH_DISTANCE, end)):
        prefetch(trainers, lids[p])
    for i in range(first, last):
        w = assign[i]
        bit = np.uint64(1) << np.uint64(w)
        for p in range(offsets[i], offsets[i + 1]):
            if p + PREFETCH_DISTANCE < end:
                prefetch(trainers, lids[p + PREFETCH_DISTANCE])
            lid = lids[p]
            if not trainers[lid] & bit:
                trainers[lid] |= bit
                pairs[npairs] = (lid << 8) | w
                npairs += 1
    state[0] = npairs
    return 0


@njit(nogil=True)
def group_pairs(pairs, npairs, num_workers, trainers, info):  # type: ignore[no-untyped-def]  # pragma: no cover
    """(wl_offsets, wl_lids) of :func:`partition` from the listed pairs; copies
    ``trainers`` into ``info[:, TRAINERS]``."""
    for lid in range(trainers.shape[0]):
        info[lid, TRAINERS] = trainers[lid]
    counts = np.zeros(num_workers + 1, dtype=np.int64)
    for q in range(npairs):
        counts[(pairs[q] & 255) + 1] += 1
    wl_offsets = np.cumsum(counts)
    fill = wl_offsets[:-1].copy()
    wl_lids = np.empty(npairs, dtype=np.int64)
    for q in range(npairs):
        w = pairs[q] & 255
        wl_lids[fill[w]] = pairs[q] >> 8
        fill[w] += 1
    return wl_offsets, wl_lids


@njit(nogil=True)
def samples_by_worker(assign, num_workers, per_worker):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Sample indices grouped by worker (worker w's at ``w * per_worker``), in input order
    within a worker: a stable argsort of ``assign`` in one counting pass."""
    fill = np.arange(num_workers) * per_worker
    order = np.empty(assign.shape[0], dtype=np.int64)
    for i in range(assign.shape[0]):
        order[fill[assign[i]]] = i
        fill[assign[i]] += 1
    return order


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
def rehash_table(table, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Put every entry of ``table`` into the (larger, all-EMPTY) table ``out``."""
    for s in range(table.shape[0]):
        entry = table[s]
        if entry != EMPTY:
            out[table_slot(out, entry >> 32)] = entry


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
    info,
    capacity,
    tables,
    fresh,
    placeholder,
    queue,
    head,
    tail,
    used,
    dirty_owner,
    key_of,
    out_keys,
    counts,
    victims,
    scratch,
):
    """LRU touches, pulls and evictions of ``workers``, each in first-occurrence order.

    Workers are independent here (each has its own queue and position table, and the
    pass writes no shared record), so two calls on disjoint sets of workers may run at
    once. A worker whose ``fresh`` table is bigger than its own first moves its entries
    there (table growth, on the thread running the worker). A key is cached by w iff its
    kid is in w's position table; whether w's copy
    is valid is bit w of ``info[lid, HOLDERS]`` (as at the start of the batch: w's evictions
    only drop keys w has not touched in this batch).

    Worker w's outputs go to its region ``r = wl_offsets[w]:wl_offsets[w + 1]`` of the
    rows of ``out_keys``: row 0 pulled keys, row 1 evicted keys (eviction order), row 2
    trained keys (those only w trains first, then co-trained ones; ``scratch`` holds the
    co-trained ones meanwhile); and
    ``victims[r]``: evicted kids, negated (-kid - 1) when w held them dirty. ``counts[w]``
    = (pulls, evictions, where co-trained keys start in row 2, hits).
    """
    pulled = out_keys[0]
    evicted = out_keys[1]
    trained = out_keys[2]
    co_trained = scratch
    for w in workers:
        if fresh[w].shape[0] > tables[w].shape[0]:  # grow: the caller sized ``fresh[w]``
            grown = fresh[w]
            grown[:] = EMPTY
            rehash_table(tables[w], grown)
            tables[w] = grown
            fresh[w] = placeholder
        table = tables[w]
        start = wl_offsets[w]
        end = wl_offsets[w + 1]
        bit = np.uint64(1) << np.uint64(w)
        npl = start
        nev = start
        nhits = 0
        nlocal = start
        nco = start
        # Two levels: the key's row 2 x 16 places ahead, its table slot (which needs
        # the row's kid) 16 places ahead, by when the row has arrived.
        for q in range(start, min(start + 2 * PREFETCH_DISTANCE, end)):
            prefetch(info, wl_lids[q])
        for q in range(start, min(start + PREFETCH_DISTANCE, end)):
            prefetch(table, _home(table, np.int64(info[wl_lids[q], KID])))
        for q in range(start, end):
            if q + 2 * PREFETCH_DISTANCE < end:
                prefetch(info, wl_lids[q + 2 * PREFETCH_DISTANCE])
            if q + PREFETCH_DISTANCE < end:
                ahead = np.int64(info[wl_lids[q + PREFETCH_DISTANCE], KID])
                prefetch(table, _home(table, ahead))
            lid = wl_lids[q]
            k = np.int64(info[lid, KID])
            key = np.int64(info[lid, KEY])
            s = table_slot(table, k)
            if table[s] != EMPTY:
                if info[lid, HOLDERS] & bit:
                    nhits += 1
                else:  # a stale copy: refresh it in place
                    pulled[npl] = key
                    npl += 1
            else:
                pulled[npl] = key
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
            t = info[lid, TRAINERS]
            if t & (t - np.uint64(1)):  # more than one bit: co-trained
                co_trained[nco] = key
                nco += 1
            else:
                trained[nlocal] = key
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
def settle_evicted(dirty_evicted, dirty_owner, key_of):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Write-backs the previous iteration owes for dirty rows their owner evicts now
    (settled first: the owner may pull the row back later in this batch and dirty it
    again). Returns (worker, key)."""
    n = dirty_evicted.shape[0]
    prev_worker = np.empty(n, dtype=np.int64)
    prev_key = np.empty(n, dtype=np.int64)
    nprev = 0
    for q in range(n):
        k = dirty_evicted[q] // 64
        w = dirty_evicted[q] % 64
        if dirty_owner[k] == w:
            prev_worker[nprev] = w
            prev_key[nprev] = key_of[k]
            nprev += 1
            dirty_owner[k] = -1
    return prev_worker[:nprev], prev_key[:nprev]


@njit(nogil=True)
def settle(info, first, last, holders, dirty_owner, on_demand):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Write-backs owed by the previous iteration, then this iteration's training effects,
    for the batch's keys ``info[first:last]`` (disjoint ranges may run at once).

    The previous iteration writes back a dirty row that another worker needs now.
    Returns (previous write-backs: worker, key; this iteration's write-backs, naive sync
    only: worker, key).
    """
    total = last - first
    prev_worker = np.empty(total, dtype=np.int64)
    prev_key = np.empty(total, dtype=np.int64)
    now_worker = np.empty(0 if on_demand else total, dtype=np.int64)
    now_key = np.empty(0 if on_demand else total, dtype=np.int64)
    nprev = nnow = 0
    for q in range(first, min(first + PREFETCH_DISTANCE, last)):
        prefetch(dirty_owner, np.int64(info[q, KID]))
    for q in range(first, last):
        if q + PREFETCH_DISTANCE < last:
            prefetch(dirty_owner, np.int64(info[q + PREFETCH_DISTANCE, KID]))
        k = np.int64(info[q, KID])
        owner = dirty_owner[k]
        t = info[q, TRAINERS]
        if owner >= 0 and t & ~(np.uint64(1) << np.uint64(owner)):  # another worker needs it
            prev_worker[nprev] = owner
            prev_key[nprev] = np.int64(info[q, KEY])
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
            now_key[nnow] = np.int64(info[q, KEY])
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
