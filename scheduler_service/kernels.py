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

from heraldps.atomic import atomic_and
from heraldps.jit import njit
from heraldps.keyindex import table_find
from heraldps.prefetch import prefetch

PREFETCH_DISTANCE = 64  # keys ahead: 64 beat 16 and 32 in every stage (docs/figures.md)
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
# ``info[lid]`` (uint64 [nb, 3], one row per distinct key of the batch); which workers
# train each key is the partition's compact ``trainers[lid]``:
KID, KEY, HOLDERS = 0, 1, 2
INFO_FIELDS = 3


@njit(nogil=True)
def local_ids(keys, first, last, table, gen, lids, uniq, nb):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Number the distinct keys of ``keys[first:last]`` in order of first occurrence,
    after the ``nb`` keys already numbered (``uniq[:nb]``): each key's number goes to
    ``lids[i]``, each new key to ``uniq``. Returns the keys numbered now; -1 when more
    than S / 2 distinct keys came (renumber from the start with 2 S: the same numbers).

    ``table`` is a ``[S, 2]`` scratch table of (key, ``gen << 32 | lid``), S a power of
    two: a slot written under another generation than ``gen`` counts as empty, so a
    table is reused batch after batch without clearing (each batch, a new ``gen``).
    """
    mask = np.uint64(table.shape[0] - 1)
    limit = table.shape[0] // 2
    stamp = np.int64(gen) << 32
    homes = np.empty(PREFETCH_DISTANCE, dtype=np.uint64)  # a ring: each key hashed once
    ring = PREFETCH_DISTANCE - 1
    for i in range(first, min(first + PREFETCH_DISTANCE, last)):
        homes[i & ring] = mix(keys[i]) & mask
        prefetch(table, homes[i & ring])
    for i in range(first, last):
        s = homes[i & ring]
        if i + PREFETCH_DISTANCE < last:
            h = mix(keys[i + PREFETCH_DISTANCE]) & mask
            homes[i & ring] = h
            prefetch(table, h)
        k = keys[i]
        while (table[s, 1] >> 32) == gen and table[s, 0] != k:
            s = (s + np.uint64(1)) & mask
        if (table[s, 1] >> 32) != gen:
            if nb == limit:
                return -1
            table[s, 0] = k
            table[s, 1] = stamp | nb
            uniq[nb] = k
            nb += 1
        lids[i] = table[s, 1] & _LOW32
    return nb


@njit(nogil=True)
def rows_of_kids(kids, uniq, added, holders, key_of, info, hold, held):  # type: ignore[no-untyped-def]  # pragma: no cover
    """``info`` rows (KID, KEY, HOLDERS), ``hold`` (HOLDERS) and ``held`` (1 where some
    worker holds the key) of keys whose kids are known (just inserted where ``added``:
    their key is written to ``key_of``, their record is the zero one)."""
    n = kids.shape[0]
    for i in range(min(PREFETCH_DISTANCE, n)):
        prefetch(holders, kids[i])
    for i in range(n):
        if i + PREFETCH_DISTANCE < n:
            prefetch(holders, kids[i + PREFETCH_DISTANCE])
        k = kids[i]
        if added[i]:
            key_of[k] = uniq[i]
        info[i, KID] = k
        info[i, KEY] = uniq[i]
        h = holders[k]
        info[i, HOLDERS] = h
        hold[i] = h
        held[i] = 1 if h else 0


_HELD_AHEAD = 16  # held occurrences whose hold and seen lines choose_chunk prefetches ahead


@njit(nogil=True, inline="always")
def _decide(  # type: ignore[no-untyped-def]  # pragma: no cover
    i, count, scores, touched, room, choose, given, first_free
):
    """Sample ``i``'s worker from its scores (``scores[touched[:count]]``, reset here):
    Algorithm 1's choice, or ``given[i]``. Returns (worker, lowest worker that may have
    room, 1 if some worker holds one of its keys validly, 1 if the chosen one holds the
    most)."""
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


# ----- stage 1: partition (Herald Algorithm 1) and each worker's mini-batch keys -----
# In chunks of samples: for a big batch the caller chooses the workers of chunk c + 1
# (``choose_chunk``) while the helper thread marks the keys of chunk c (``mark_chunk``,
# chunks in order). A worker's mini-batch is its marked keys in lid order, i.e. in order
# of first occurrence in the batch (stage 4 lists them).
@njit(nogil=True)
def choose_chunk(offsets, lids, is_held, hold, seen, room, state, assign, first, last, given):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Each sample's worker, for samples ``first..last-1``; ``state`` carries (lowest
    worker that may have room, held, local) from chunk to chunk.

    With ``given`` empty: Herald Algorithm 1, each sample, in input order, goes to the
    worker with room whose cache holds the most of its distinct keys validly (ties: lowest
    id); only the workers that hold a key of the sample are scored, and when none of those
    has room the lowest-id worker with room wins (all others score 0). Otherwise sample i
    goes to ``given[i]``. Either way: ``held`` = samples some worker holds a key of
    validly, ``local`` = those assigned to a worker holding the most of their keys
    (ignoring room). ``hold[lid]``: the workers holding key ``lid`` validly. ``seen``
    (one per lid, -1 at the first chunk) is the caller's scratch."""
    num_workers = room.shape[0]
    choose = given.shape[0] == 0
    scores = np.zeros(num_workers, dtype=np.int64)
    touched = np.empty(num_workers, dtype=np.int64)
    first_free, held, local = state[0], state[1], state[2]
    # Most keys of a batch are held by no worker and score nothing: one flat pass lists the
    # occurrences of held keys (``is_held``, a byte per lid, small enough to stay cached;
    # no branch per key), and only those are scored.
    start, end = offsets[first], offsets[last]
    listed = np.empty(end - start + 1, dtype=np.int64)
    nlisted = 0
    for p in range(start, end):
        lid = lids[p]
        listed[nlisted] = p
        nlisted += is_held[lid]
    j = 0
    for i in range(first, last):
        stop = offsets[i + 1]
        count = 0
        while j < nlisted and listed[j] < stop:
            if j + _HELD_AHEAD < nlisted:
                ahead = lids[listed[j + _HELD_AHEAD]]
                prefetch(hold, ahead)
                prefetch(seen, ahead)
            lid = lids[listed[j]]
            j += 1
            if seen[lid] == i:  # a key repeated in the sample counts once
                continue
            seen[lid] = i
            mask = hold[lid]
            while mask:
                low = mask & (~mask + np.uint64(1))
                w = bit_index(low)
                if scores[w] == 0:
                    touched[count] = w
                    count += 1
                scores[w] += 1
                mask ^= low
        best, first_free, h, loc = _decide(
            i, count, scores, touched, room, choose, given, first_free
        )
        assign[i] = best
        held += h
        local += loc
    state[0], state[1], state[2] = first_free, held, local
    return 0


@njit(nogil=True)
def mark_chunk(offsets, lids, assign, trainers, counts, first, last):  # type: ignore[no-untyped-def]  # pragma: no cover
    """The mini-batches of samples ``first..last-1``, as marks: bit w of ``trainers[lid]``
    once worker w trains key ``lid``, and ``counts[w]`` its distinct keys. One flat loop
    over the key occurrences, the worker switched at sample boundaries, and no branch per
    key (about half of the occurrences are a worker's first of a key)."""
    if first == last:
        return 0
    start, end = offsets[first], offsets[last]
    for p in range(start, min(start + PREFETCH_DISTANCE, end)):
        prefetch(trainers, lids[p])
    i = first
    stop = offsets[i + 1]
    w = assign[i]
    fresh = np.int64(0)
    for p in range(start, end):
        while p >= stop:  # the next sample (and past any empty ones)
            counts[w] += fresh
            fresh = np.int64(0)
            i += 1
            stop = offsets[i + 1]
            w = assign[i]
        if p + PREFETCH_DISTANCE < end:
            prefetch(trainers, lids[p + PREFETCH_DISTANCE])
        lid = lids[p]
        t = trainers[lid]
        shift = np.uint64(w)
        trainers[lid] = t | (np.uint64(1) << shift)
        fresh += np.int64(((t >> shift) & np.uint64(1)) ^ np.uint64(1))
    counts[w] += fresh
    return 0


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


# ----- stage 3: the batch's keys (cache bits, references, synchronisation) ------------
# The mirror's record of a key (``CacheMirror.records``, uint64 [rows, 4], one 32-byte
# line): bit w of R_HOLDERS: worker w holds a valid copy; of R_CACHED: w caches the key; of
# R_REFERENCED: w used it since its queue entry last came round (CLOCK's reference bit).
# R_META: the key's lid in the batch that touched it last (low 32 bits) and, above, the
# worker whose copy is dirty, plus one (0: none).
R_HOLDERS, R_CACHED, R_REFERENCED, R_META = 0, 1, 2, 3
RECORD_FIELDS = 4
LID_BITS = np.uint64(0xFFFFFFFF)
_OWNER_SHIFT = np.uint64(32)
OP_KEY, OP_PULLS, OP_INSERTS, OP_KID = 0, 1, 2, 3  # columns of stage 3's ``ops``
OP_FIELDS = 4
CO_TRAINED = np.uint64(1 << 63)  # top bit of ops[:, OP_KID]: the gradient goes to the PS
_KID_BITS = np.uint64((1 << 63) - 1)


@njit(nogil=True, inline="always")
def owner_of(meta):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """The worker whose copy of the key is dirty, -1 none."""
    return np.int64(meta >> _OWNER_SHIFT) - 1


@njit(nogil=True, inline="always")
def with_owner(meta, owner):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    return (meta & LID_BITS) | (np.uint64(owner + 1) << _OWNER_SHIFT)


@njit(nogil=True)
def touch_keys(info, trainers, first, last, records, ops, inserts, on_demand, window, through):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Everything a batch does to the records of its keys ``info[first:last]``, one record
    each (disjoint ranges may run at once).

    Per key, with T = its trainers: its row of ``ops`` (uint64 [nb, 4], what the lists
    of stage 4 need, in one 32-byte line): the key; the workers that pull it (T without
    a valid copy) and those that must insert it (T not caching it; ``inserts[w]`` counts
    them per worker); its kid, with the top bit set if several workers train it. T
    caches it and has used it. Then the
    synchronisation: a dirty copy another worker needs now is written back by the
    previous iteration; after the commit only a sole trainer holds the newest value
    (dirty under on-demand sync, written back now under naive sync), and a key several
    workers trained is valid nowhere. With ``through`` (on-demand sync with a look-ahead
    window), a key one worker trains that no batch in ``window`` (the slot table of
    ``window.Window``) uses and that is not dirty at its trainer is trained through the
    PS like a co-trained key: its gradient is pushed, its pull needs no optimizer state,
    and no copy is dirty or valid after the commit (docs/scheduler.md#pass-through-rows).
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
        prefetch(records, np.int64(info[q, KID]))
    for q in range(first, last):
        if q + PREFETCH_DISTANCE < last:
            prefetch(records, np.int64(info[q + PREFETCH_DISTANCE, KID]))
        k = np.int64(info[q, KID])
        t = trainers[q]
        cached = records[k, R_CACHED]
        new = t & ~cached
        ops[q, OP_KEY] = info[q, KEY]
        ops[q, OP_PULLS] = t & ~info[q, HOLDERS]
        ops[q, OP_INSERTS] = new
        while new:
            low = new & (~new + np.uint64(1))
            inserts[bit_index(low)] += 1
            new ^= low
        records[k, R_CACHED] = cached | t
        records[k, R_REFERENCED] |= t
        owner = owner_of(records[k, R_META])
        if owner >= 0 and t & ~(np.uint64(1) << np.uint64(owner)):  # another worker needs it
            prev_worker[nprev] = owner
            prev_key[nprev] = np.int64(info[q, KEY])
            nprev += 1
            owner = -1
        co = (t & (t - np.uint64(1))) != 0
        if not co and through and owner < 0 and table_find(window, np.int64(info[q, KEY])) < 0:
            co = True  # no batch in the window uses it: trained through the PS
        ops[q, OP_KID] = np.uint64(k) | (CO_TRAINED if co else np.uint64(0))
        if co:  # gradients pushed: every copy is stale after the commit
            records[k, R_HOLDERS] = 0
        else:
            records[k, R_HOLDERS] = t  # only the trainer holds the newest value
            if on_demand:
                owner = bit_index(t)
            else:
                now_worker[nnow] = bit_index(t)
                now_key[nnow] = np.int64(info[q, KEY])
                nnow += 1
        records[k, R_META] = with_owner(np.uint64(q), owner)
    return prev_worker[:nprev], prev_key[:nprev], now_worker[:nnow], now_key[:nnow]


# ----- stage 4: per worker, evictions (CLOCK) and the plan's lists --------------------
@njit(nogil=True)
def _grown_ring(ring, head, used, size):  # type: ignore[no-untyped-def]  # pragma: no cover
    """A ring of ``size`` entries holding ``ring``'s ``used`` entries from ``head`` at 0."""
    out = np.empty(size, dtype=ring.dtype)
    mask = ring.shape[0] - 1
    for i in range(used):
        out[i] = ring[(head + i) & mask]
    return out


@njit(nogil=True)
def evict_and_list(  # type: ignore[no-untyped-def]  # pragma: no cover
    first, last, wl_offsets, info, trainers, ops, inserts, capacity, rings, heads, used, flat,
    key_of, ahead, window, out_keys, counts, scratch,
):  # fmt: skip
    """Workers ``first..last-1``: make room for the keys each inserts, then list the plans.

    Each worker's cache is a CLOCK: a ring of the keys it caches in insertion order.
    Room is made at the head: a key the worker trains in this batch goes round again, as
    does one whose reference bit is set (the bit is cleared). Any other is evicted; with
    look-ahead (``ahead``), in four levels, each for as many candidates as keys cached
    (keys that came round neither trained now nor referenced): first only clean keys no
    batch behind this one uses (``window``: the slot table of ``window.Window``, probed by
    key), then any clean key, then dirty keys no batch behind uses, then any. A dirty key
    evicted is written back at once, on the iteration's critical path when it was just
    trained; a clean one costs a pull only if it is needed again. The inserted keys then
    join at the tail. Workers are independent except for the bits they clear in evicted
    keys' shared words, which are cleared atomically, so two calls on disjoint ranges of
    workers may run at once. ``flat``: the records as one uint64 array
    (``records.reshape(-1)``).

    A worker's keys are listed in lid order (first occurrence in the batch), from one
    sequential pass over the batch's keys. Worker w's outputs go to its region ``r =
    wl_offsets[w]:wl_offsets[w + 1]`` (as many entries as keys it trains) of the rows of
    ``out_keys``: row 0 pulled keys, row 1 evicted keys (eviction order), row 2 trained
    keys (those only w trains first, then co-trained ones), row 3 the evicted keys w held
    dirty; ``counts[w]`` = (pulls, evictions, where co-trained keys start in row 2, hits,
    dirty evictions, keys now cached nowhere). ``scratch`` (3 rows like ``out_keys``) holds
    co-trained keys and inserted kids until the pass ends, and in row 2 the kids w evicted
    last (no worker caches them now: clean, no holder, so the mirror can forget them).
    """
    nb = info.shape[0]
    pulled = out_keys[0]
    evicted = out_keys[1]
    trained = out_keys[2]
    dirty = out_keys[3]
    co_trained = scratch[0]
    staged = scratch[1]
    gone = scratch[2]
    group = np.uint64(0)
    for w in range(first, last):
        start = wl_offsets[w]
        bit = np.uint64(1) << np.uint64(w)
        group |= bit
        clear = ~bit
        n = used[w]
        need = n + inserts[w] - capacity
        final = n + inserts[w] - max(need, 0)
        ring = rings[w]
        if final > ring.shape[0]:
            size = ring.shape[0]
            while size < final:
                size *= 2
            ring = _grown_ring(ring, heads[w], n, size)
            rings[w] = ring
            heads[w] = 0
        mask = ring.shape[0] - 1
        head = heads[w]
        nev = start
        ndirty = start
        ngone = start
        # Look-ahead: level 1 evicts only clean keys the window does not use, level 2 any
        # clean key, level 3 dirty ones the window does not use too, level 4 any; a level
        # ends after n candidates (keys neither trained now nor referenced) came round.
        level = 1 if ahead else 4
        moves = 0
        while need > 0:
            v = np.int64(ring[head])
            head = (head + 1) & mask
            meta = flat[v * RECORD_FIELDS + R_META]
            lid = np.int64(meta & LID_BITS)
            mine = False  # does w train v in this batch? (R_META names v's latest lid)
            if lid < nb and np.int64(info[lid, KID]) == v:
                mine = (trainers[lid] & bit) != 0
            if mine or (flat[v * RECORD_FIELDS + R_REFERENCED] & bit) != 0:
                if not mine:
                    atomic_and(flat, v * RECORD_FIELDS + R_REFERENCED, clear)
                ring[(head + n - 1) & mask] = np.int32(v)  # round again, at the tail
                continue
            if level < 4 and moves >= n:  # a revolution of candidates at this level
                level += 1
                moves = 0
            if level < 4:
                moves += 1
                if level == 1:  # spared: dirty, or used by a batch behind
                    spared = owner_of(meta) == w or table_find(window, key_of[v]) >= 0
                elif level == 2:  # spared: dirty
                    spared = owner_of(meta) == w
                else:  # spared: used by a batch behind
                    spared = table_find(window, key_of[v]) >= 0
                if spared:
                    ring[(head + n - 1) & mask] = np.int32(v)
                    continue
            was_cached = atomic_and(flat, v * RECORD_FIELDS + R_CACHED, clear)
            atomic_and(flat, v * RECORD_FIELDS + R_HOLDERS, clear)
            if not was_cached & clear:  # its last copy: the mirror may forget the key
                gone[ngone] = v
                ngone += 1
            key = key_of[v]
            evicted[nev] = key
            nev += 1
            if owner_of(meta) == w:  # only w's thread changes the owner of a key w caches
                flat[v * RECORD_FIELDS + R_META] = meta & LID_BITS
                dirty[ndirty] = key
                ndirty += 1
            n -= 1
            need -= 1
        heads[w] = head
        used[w] = n
        counts[w, 1] = nev - start
        counts[w, 4] = ndirty - start
        counts[w, 5] = ngone - start
    # the lists: one pass over the batch's keys, each written to its workers' regions
    npl = wl_offsets[:-1].copy()
    nlocal = wl_offsets[:-1].copy()
    nco = wl_offsets[:-1].copy()
    nins = wl_offsets[:-1].copy()
    hits = np.zeros(wl_offsets.shape[0] - 1, dtype=np.int64)
    for q in range(nb):
        t = trainers[q] & group
        if not t:
            continue
        key = np.int64(ops[q, OP_KEY])
        pulls = ops[q, OP_PULLS]
        new = ops[q, OP_INSERTS]
        kid = ops[q, OP_KID]
        co = (kid & CO_TRAINED) != 0
        kid = np.int64(kid & _KID_BITS)
        while t:
            low = t & (~t + np.uint64(1))
            w = bit_index(low)
            t ^= low
            if pulls & low:
                pulled[npl[w]] = key
                npl[w] += 1
            else:
                hits[w] += 1
            if new & low:
                staged[nins[w]] = kid
                nins[w] += 1
            if co:
                co_trained[nco[w]] = key
                nco[w] += 1
            else:
                trained[nlocal[w]] = key
                nlocal[w] += 1
    for w in range(first, last):
        start = wl_offsets[w]
        trained[nlocal[w] : nlocal[w] + nco[w] - start] = co_trained[start : nco[w]]
        ring = rings[w]
        mask = ring.shape[0] - 1
        head = heads[w]
        n = used[w]
        for j in range(start, nins[w]):  # the inserted keys join at the tail
            ring[(head + n) & mask] = np.int32(staged[j])
            n += 1
        used[w] = n
        counts[w, 0] = npl[w] - start
        counts[w, 2] = nlocal[w]
        counts[w, 3] = hits[w]
    return 0


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


# ----- early write-backs (Scheduler._early_write_backs) ----------------------------
@njit(nogil=True)
def single_trainer_kids(trainers, ops):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Kids of the batch's keys one worker updates locally (its ``update_local`` rows:
    trained, and not co-trained in ``ops``, stage 3's)."""
    nb = trainers.shape[0]
    out = np.empty(nb, dtype=np.int64)
    n = 0
    for q in range(nb):
        kid = ops[q, OP_KID]
        if trainers[q] != 0 and (kid & CO_TRAINED) == 0:
            out[n] = np.int64(kid & _KID_BITS)
            n += 1
    return out[:n]


@njit(nogil=True)
def idle_dirty(records, key_of, info, window, examine, trained, marks, clean):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Of the kids ``examine`` (distinct), the rows dirty now that no worker uses in the
    batch of ``info`` (its lid in R_META names it there) nor in the batches behind it
    (``window``: the slot table of ``window.Window``) and that are not in ``trained``
    (kids updated in the previous iteration, distinct): (owners, keys, kids) of those, and
    the kids still dirty but used in the batch. Rows in ``trained`` are skipped: the caller
    keeps them as candidates anyway. ``marks`` (bool, kid-indexed, all False) is left so.
    With ``clean``, the rows returned are marked clean here; otherwise nothing in the
    mirror changes. One pass, no sort, no hash lookup."""
    nb = info.shape[0]
    for q in range(trained.shape[0]):
        marks[trained[q]] = True
    n = examine.shape[0]
    owners = np.empty(n, dtype=np.int64)
    keys = np.empty(n, dtype=np.int64)
    kids = np.empty(n, dtype=np.int64)
    left = np.empty(n, dtype=np.int64)
    taken = kept = 0
    for q in range(n):
        kid = examine[q]
        if marks[kid]:
            continue
        meta = records[kid, R_META]
        owner = np.int64(meta >> _OWNER_SHIFT) - 1
        if owner < 0:
            continue
        lid = np.int64(meta & LID_BITS)
        if (lid < nb and np.int64(info[lid, KID]) == kid) or table_find(window, key_of[kid]) >= 0:
            left[kept] = kid
            kept += 1
            continue
        owners[taken] = owner
        keys[taken] = key_of[kid]
        kids[taken] = kid
        taken += 1
        if clean:
            records[kid, R_META] = meta & LID_BITS
    for q in range(trained.shape[0]):
        marks[trained[q]] = False
    return owners[:taken], keys[:taken], kids[:taken], left[:kept]
