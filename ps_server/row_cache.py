"""The Cached-PS's host-memory cache of rows, with HugeCTR's three phases.

Rows are cached by key, never twice (HugeCTR's block cache stores whole
passes and can hold a key in several blocks). Capacity is a row count from
the byte budget. What HugeCTR's knobs mean here:

- ``target_hit_rate``: while a request's hit rate is at least this, its
  misses are served from disk without entering the cache (the cache is good
  enough); below it, misses are inserted, evicting least recently used rows.
- ``max_num_evict``: after this many requests that evicted rows (HugeCTR's
  eviction/insertion operations), the cache freezes: it keeps its rows and
  later misses are read through. -1 never freezes.
- Phases (``phase``): ``insertion`` while there is free room, ``updating``
  when full, ``frozen`` after ``max_num_evict``.

Every cached row is clean: the Cached-PS writes rows through to LMDB when
they change, so evicting is just forgetting.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps import hostmem
from heraldps.keyindex import SlotMap

# Bytes a cached row takes beside its values and state: key, version, change mark, last
# use and a free-list entry (int64 each), occupied and fresh flags.
_ROW_EXTRA_BYTES = 5 * 8 + 2
# The slot map doubles: while it rehashes, the old half-size map is alive too.
_MAP_PEAK = 1.5


def cache_bytes(capacity: int, dim: int, state_width: int) -> int:
    """The most host memory a cache of ``capacity`` rows holds: its arrays full, and its
    slot map at full size plus the old map during the last rehash. The smallest slot map
    (16 KiB, there from the start) counts as the table's overhead, not as cache."""
    arrays = capacity * (4 * (dim + state_width) + _ROW_EXTRA_BYTES)
    slot_map = SlotMap.bytes_for(capacity)
    if slot_map <= SlotMap.bytes_for(0):
        return arrays
    return arrays + int(_MAP_PEAK * slot_map)


def capacity_for(budget_bytes: int, dim: int, state_width: int) -> int:
    """The most rows whose cache stays within ``budget_bytes`` (``cache_bytes``)."""
    low, high = 0, max(0, budget_bytes) // (4 * (dim + state_width) + _ROW_EXTRA_BYTES)
    while low < high:  # cache_bytes grows with capacity: the largest that fits
        mid = (low + high + 1) // 2
        if cache_bytes(mid, dim, state_width) <= budget_bytes:
            low = mid
        else:
            high = mid - 1
    return low


class RowCache:
    """Up to ``capacity`` rows (values, state, version, change mark) of one table.

    Memory is committed as rows arrive, never up front: the arrays are reserved at
    full capacity as untouched zero pages (``hostmem.reserved_zeros``), slots are
    handed out from the low end (``_high``: slots ever used), and the slot map grows
    with the rows it holds. An empty cache costs its smallest slot map and a few
    objects, whatever its capacity.
    """

    def __init__(
        self,
        capacity: int,
        dim: int,
        state_width: int,
        target_hit_rate: float = 1.0,
        max_num_evict: int = -1,
    ) -> None:
        self.capacity = max(0, capacity)
        self.target_hit_rate = target_hit_rate
        self.max_num_evict = max_num_evict
        n = self.capacity
        self.values = hostmem.reserved_zeros((n, dim), np.float32)
        self.state = hostmem.reserved_zeros((n, state_width), np.float32)
        self.versions = hostmem.reserved_zeros((n,), np.int64)
        self.changed = hostmem.reserved_zeros((n,), np.int64)
        self.keys = hostmem.reserved_zeros((n,), np.int64)
        # True only for occupied slots whose row exists nowhere but here (created by a
        # pull); ``fresh_rows`` is their running count.
        self.fresh = hostmem.reserved_zeros((n,), np.bool_)
        self.fresh_rows = 0
        self.last_use = hostmem.reserved_zeros((n,), np.int64)
        self.occupied = hostmem.reserved_zeros((n,), np.bool_)
        self._slots = SlotMap()
        self._high = 0  # slots 0.._high-1 have been used; the rest were never touched
        self._free = hostmem.reserved_zeros((n,), np.int64)  # released slots, a stack
        self._free_top = 0
        self._tick = 0
        self.num_evict = 0
        self.hits = 0
        self.lookups = 0

    def __len__(self) -> int:
        return self._high - self._free_top

    @property
    def _room(self) -> int:
        return self.capacity - len(self)

    @property
    def on_disk(self) -> npt.NDArray[np.bool_]:
        """False for occupied slots whose row exists only here (tests)."""
        return ~self.fresh

    @property
    def phase(self) -> str:
        full = not self._room
        if self.max_num_evict >= 0 and self.num_evict >= self.max_num_evict and full:
            return "frozen"
        return "updating" if full else "insertion"

    @property
    def nbytes(self) -> int:
        """Host memory the cache holds now: the slots used so far, and its slot map."""
        per_row = 4 * (self.values.shape[1] + self.state.shape[1]) + _ROW_EXTRA_BYTES
        return int(self._high * per_row + self._slots.nbytes)

    def fresh_slots(self) -> npt.NDArray[np.int64]:
        """Occupied slots whose row exists only here (a pull created it)."""
        high = self._high
        return np.flatnonzero(self.occupied[:high] & self.fresh[:high])

    def lookup(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Slot of every key, -1 where not cached; marks the hits as used."""
        slots = self._slots.lookup(keys)
        hit = slots >= 0
        self._tick += 1
        self.last_use[slots[hit]] = self._tick
        self.lookups += keys.shape[0]
        self.hits += int(hit.sum())
        return slots

    def admit(
        self,
        keys: npt.NDArray[np.int64],
        hit_rate: float,
        keep: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        """Slots for as many of the missed ``keys`` as the policy admits (-1: not admitted).

        ``keep``: slots the current request uses, never evicted for it.
        """
        n = keys.shape[0]
        out = np.full(n, -1, dtype=np.int64)
        if not n or not self.capacity:
            return out
        take = min(n, self._room)
        may_evict = self.max_num_evict < 0 or self.num_evict < self.max_num_evict
        if take < n and may_evict and hit_rate < self.target_hit_rate:
            candidates = np.flatnonzero(self.occupied[: self._high])
            if keep.shape[0]:
                candidates = candidates[~np.isin(candidates, keep)]
            evict = candidates[np.argsort(self.last_use[candidates], kind="stable")]
            evict = evict[: n - take]
            if evict.shape[0]:
                self._release(evict)
                self.num_evict += 1
            take = min(n, self._room)
        if take:
            slots = self._take(take)
            self._slots.put(keys[:take], slots)
            self.keys[slots] = keys[:take]
            self.occupied[slots] = True
            self.last_use[slots] = self._tick
            out[:take] = slots
        return out

    def _take(self, count: int) -> npt.NDArray[np.int64]:
        """``count`` free slots: released ones first (last released first), then unused
        ones from the low end, so the pages written stay as few as the rows held."""
        reused = min(count, self._free_top)
        slots = np.empty(count, dtype=np.int64)
        slots[:reused] = self._free[self._free_top - reused : self._free_top][::-1]
        self._free_top -= reused
        fresh = count - reused
        slots[reused:] = np.arange(self._high, self._high + fresh, dtype=np.int64)
        self._high += fresh
        return slots

    def _release(self, slots: npt.NDArray[np.int64]) -> None:
        self._slots.remove(self.keys[slots])
        self.fresh_rows -= int(np.count_nonzero(self.fresh[slots]))
        self.fresh[slots] = False
        self.occupied[slots] = False
        self._free[self._free_top : self._free_top + slots.shape[0]] = slots
        self._free_top += slots.shape[0]

    def store(
        self,
        slots: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        state: npt.NDArray[np.float32],
        versions: npt.NDArray[np.int64],
        changed: npt.NDArray[np.int64],
        on_disk: npt.NDArray[np.bool_] | bool,
    ) -> None:
        """Write row contents into cached ``slots`` (entries -1 are skipped)."""
        use = slots >= 0
        if not np.any(use):
            return
        s = slots[use]
        self.values[s] = values[use]
        self.state[s] = state[use]
        self.versions[s] = versions[use]
        self.changed[s] = changed[use]
        now = ~on_disk[use] if isinstance(on_disk, np.ndarray) else np.full(s.shape[0], not on_disk)
        self.fresh_rows += int(np.count_nonzero(now)) - int(np.count_nonzero(self.fresh[s]))
        self.fresh[s] = now

    def clear(self) -> None:
        occupied = np.flatnonzero(self.occupied[: self._high])
        if occupied.shape[0]:
            self._release(occupied)
