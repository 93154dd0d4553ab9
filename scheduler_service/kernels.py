"""Compiled kernels of the fast scheduler (numba, GIL released).

State layout (owned by :class:`scheduler_service.mirror.CacheMirror`):
- every key seen gets a dense id ``kid``; per kid: ``holders`` (bit w set when
  worker w holds a valid copy; hence at most 64 workers), ``dirty_owner``
  (worker holding the only latest copy, -1 none), per-batch scratch
  (``stamp``, ``trainers``) and ``seen`` (per-sample dedup stamp);
- cache entries live in a shared slot pool (``slot_kid``, ``prev``, ``nxt``):
  one doubly linked LRU list per worker (``head`` = most recent);
- for up to 16 workers, each key's cache slot per worker sits in the key's own
  record (``slots[kid, w]``, beside the masks: one memory access per key);
  beyond that, ``(kid * 64 + worker) -> slot`` in an open-addressing table with
  backward-shift deletion (``table``: [T, 2] of (key, slot), slot -1 empty).
"""

from __future__ import annotations

import numba
import numpy as np

from heraldps.keyindex import probe
from heraldps.sharding import splitmix64

_DEBRUIJN_INT = 0x03F79D71B4CB0A89
_DEBRUIJN = np.uint64(_DEBRUIJN_INT)
_BIT_OF = np.zeros(64, dtype=np.int64)
for _i in range(64):
    _BIT_OF[(((1 << _i) * _DEBRUIJN_INT) & (2**64 - 1)) >> 58] = _i


@numba.njit(cache=True, nogil=True, inline="always")
def bit_index(low: np.uint64) -> int:  # pragma: no cover - compiled
    """Index of the single set bit of ``low``."""
    index: int = _BIT_OF[(low * _DEBRUIJN) >> np.uint64(58)]
    return index


@numba.njit(cache=True, nogil=True, inline="always")
def popcount(x: np.uint64) -> int:  # pragma: no cover - compiled
    count = 0
    while x:
        x &= x - np.uint64(1)
        count += 1
    return count


# ----- (kid, worker) -> slot table: the KeyIndex layout, plus deletion -----------
@numba.njit(cache=True, nogil=True, inline="always")
def _tfind(table, key):  # type: ignore[no-untyped-def]  # pragma: no cover
    s = probe(table, key)
    return np.int64(s) if table[s, 1] >= 0 else np.int64(-1)


@numba.njit(cache=True, nogil=True, inline="always")
def _tinsert(table, key, value):  # type: ignore[no-untyped-def]  # pragma: no cover
    s = probe(table, key)
    table[s, 0] = key
    table[s, 1] = value


@numba.njit(cache=True, nogil=True, inline="always")
def _tdelete(table, slot):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Remove the entry at ``slot``; shift later entries of the probe run back."""
    mask = np.int64(table.shape[0] - 1)
    i = np.int64(slot)
    table[i, 1] = -1
    j = i
    while True:
        j = (j + 1) & mask
        if table[j, 1] < 0:
            return
        home = np.int64(splitmix64(np.uint64(table[j, 0])) & np.uint64(mask))
        # Move entry j back to i unless its home lies cyclically in (i, j].
        if (home <= i or home > j) if i <= j else (home <= i and home > j):
            table[i, 0] = table[j, 0]
            table[i, 1] = table[j, 1]
            table[j, 1] = -1
            i = j


@numba.njit(cache=True, nogil=True)
def rehash(old, new):  # type: ignore[no-untyped-def]  # pragma: no cover
    for s in range(old.shape[0]):
        if old[s, 1] >= 0:
            _tinsert(new, old[s, 0], old[s, 1])


# ----- stage 1: partition ----------------------------------------------------
@numba.njit(cache=True, nogil=True)
def location_aware_assign(offsets, kids, holders, seen, stamp0, num_workers, per_worker):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Herald Algorithm 1: each sample, in input order, goes to the worker with room
    whose cache holds the most of its distinct keys validly (ties: lowest id)."""
    samples = offsets.shape[0] - 1
    room = np.full(num_workers, per_worker, dtype=np.int64)
    assign = np.empty(samples, dtype=np.int64)
    scores = np.zeros(num_workers, dtype=np.int64)
    for i in range(samples):
        scores[:] = 0
        stamp = stamp0 + i
        for p in range(offsets[i], offsets[i + 1]):
            k = kids[p]
            if seen[k] == stamp:
                continue
            seen[k] = stamp
            mask = holders[k]
            while mask:
                low = mask & (~mask + np.uint64(1))
                scores[bit_index(low)] += 1
                mask ^= low
        best = -1
        best_score = -1
        for w in range(num_workers):
            if room[w] > 0 and scores[w] > best_score:
                best = w
                best_score = scores[w]
        assign[i] = best
        room[best] -= 1
    return assign


# ----- stage 2: mini-batches --------------------------------------------------
@numba.njit(cache=True, nogil=True)
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
    for i in range(offsets.shape[0] - 1):
        w = assign[i]
        bit = np.uint64(1) << np.uint64(w)
        for p in range(offsets[i], offsets[i + 1]):
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
@numba.njit(cache=True, nogil=True)
def cache_ops(  # type: ignore[no-untyped-def]  # pragma: no cover
    wl_offsets,
    wl_kids,
    num_workers,
    capacity,
    holders,
    present,
    dirty_owner,
    slot_kid,
    prev,
    nxt,
    head,
    tail,
    used,
    pool,
    table,
    slots,
    dense,
    stride,
):
    """LRU touches, pulls and evictions of every worker, in first-occurrence order."""
    total = wl_kids.shape[0]
    evicted = np.empty(total, dtype=np.int64)
    ev_counts = np.zeros(num_workers + 1, dtype=np.int64)
    pulled = np.empty(total, dtype=np.int64)
    pl_counts = np.zeros(num_workers + 1, dtype=np.int64)
    dirty_evicted = np.empty(total, dtype=np.int64)
    nev = npl = ndirty = hits = 0
    for w in range(num_workers):
        bit = np.uint64(1) << np.uint64(w)
        for q in range(wl_offsets[w], wl_offsets[w + 1]):
            k = wl_kids[q]
            if not present[k] & bit:
                s = -1
            elif dense:
                s = slots[k, w]
            else:
                s = table[_tfind(table, k * stride + w), 1]
            if s >= 0:
                if holders[k] & bit:
                    hits += 1
                else:
                    pulled[npl] = k
                    npl += 1
                    pl_counts[w + 1] += 1
                    holders[k] |= bit
                if head[w] != s:  # move to front
                    p, n = prev[s], nxt[s]
                    nxt[p] = n
                    if n >= 0:
                        prev[n] = p
                    else:
                        tail[w] = p
                    prev[s] = -1
                    nxt[s] = head[w]
                    prev[head[w]] = s
                    head[w] = s
                continue
            pulled[npl] = k
            npl += 1
            pl_counts[w + 1] += 1
            if used[w] < capacity:
                s = pool[0]
                pool[0] += 1
                used[w] += 1
            else:
                s = tail[w]
                victim = slot_kid[s]
                tail[w] = prev[s]
                if prev[s] >= 0:
                    nxt[prev[s]] = -1
                else:
                    head[w] = -1
                if not dense:
                    _tdelete(table, _tfind(table, victim * stride + w))
                holders[victim] &= ~bit
                present[victim] &= ~bit
                evicted[nev] = victim
                nev += 1
                ev_counts[w + 1] += 1
                if dirty_owner[victim] == w:
                    dirty_evicted[ndirty] = victim * stride + w
                    ndirty += 1
            slot_kid[s] = k
            if dense:
                slots[k, w] = s
            else:
                _tinsert(table, k * stride + w, s)
            holders[k] |= bit
            present[k] |= bit
            prev[s] = -1
            nxt[s] = head[w]
            if head[w] >= 0:
                prev[head[w]] = s
            head[w] = s
            if tail[w] < 0:
                tail[w] = s
    return (
        np.cumsum(ev_counts),
        evicted[:nev],
        np.cumsum(pl_counts),
        pulled[:npl],
        dirty_evicted[:ndirty],
        hits,
    )


# ----- stage 4: synchronisation ------------------------------------------------
@numba.njit(cache=True, nogil=True)
def settle(batch_keys, trainers, holders, dirty_owner, dirty_evicted, on_demand, stride):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Write-backs owed by the previous iteration, then this iteration's training effects.

    Returns (previous write-backs as kid*stride+worker, this iteration's
    write-backs likewise).
    """
    wb_prev = np.empty(batch_keys.shape[0] + dirty_evicted.shape[0], dtype=np.int64)
    nprev = 0
    for q in range(batch_keys.shape[0]):  # another worker needs a dirty row now
        k = batch_keys[q]
        owner = dirty_owner[k]
        if owner >= 0 and trainers[k] & ~(np.uint64(1) << np.uint64(owner)):
            wb_prev[nprev] = k * stride + owner
            nprev += 1
            dirty_owner[k] = -1
    for q in range(dirty_evicted.shape[0]):  # its owner evicts a dirty row now
        k = dirty_evicted[q] // stride
        w = dirty_evicted[q] % stride
        if dirty_owner[k] == w:
            wb_prev[nprev] = dirty_evicted[q]
            nprev += 1
            dirty_owner[k] = -1
    wb_now = np.empty(batch_keys.shape[0], dtype=np.int64)
    nnow = 0
    for q in range(batch_keys.shape[0]):
        k = batch_keys[q]
        t = trainers[k]
        if popcount(t) > 1:
            holders[k] = 0  # every copy is stale after the commit
            continue
        w = bit_index(t)
        holders[k] = t  # only the trainer holds the newest value
        if on_demand:
            dirty_owner[k] = w
        else:
            wb_now[nnow] = k * stride + w
            nnow += 1
    return wb_prev[:nprev], wb_now[:nnow]


@numba.njit(cache=True, nogil=True)
def split_co_trained(wl_offsets, wl_kids, trainers):  # type: ignore[no-untyped-def]  # pragma: no cover
    """Within each worker's list: keys only it trains first, then co-trained ones (order kept).

    Returns the reordered list and, per worker, where its co-trained keys start.
    """
    out = np.empty_like(wl_kids)
    split = np.empty(wl_offsets.shape[0] - 1, dtype=np.int64)
    shared = np.empty(wl_kids.shape[0], dtype=np.bool_)
    for w in range(wl_offsets.shape[0] - 1):
        local = 0
        for q in range(wl_offsets[w], wl_offsets[w + 1]):
            t = trainers[wl_kids[q]]
            shared[q] = (t & (t - np.uint64(1))) != 0  # more than one bit set
            local += not shared[q]
        lo, hi = wl_offsets[w], wl_offsets[w] + local
        split[w] = hi
        for q in range(wl_offsets[w], wl_offsets[w + 1]):
            if shared[q]:
                out[hi] = wl_kids[q]
                hi += 1
            else:
                out[lo] = wl_kids[q]
                lo += 1
    return out, split
