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

from heraldps.keyindex import SlotMap


class RowCache:
    """Up to ``capacity`` rows (values, state, version, change mark) of one table."""

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
        self.values = np.zeros((self.capacity, dim), dtype=np.float32)
        self.state = np.zeros((self.capacity, state_width), dtype=np.float32)
        self.versions = np.zeros(self.capacity, dtype=np.int64)
        self.changed = np.zeros(self.capacity, dtype=np.int64)
        self.keys = np.zeros(self.capacity, dtype=np.int64)
        # False only for occupied slots whose row exists nowhere but here (created by a pull);
        # free slots hold True, so ``fresh_rows`` can be kept as a running count.
        self.on_disk = np.ones(self.capacity, dtype=bool)
        self.fresh_rows = 0
        self.last_use = np.zeros(self.capacity, dtype=np.int64)
        self.occupied = np.zeros(self.capacity, dtype=bool)
        self._slots = SlotMap(self.capacity)
        self._free = np.arange(self.capacity - 1, -1, -1, dtype=np.int64)
        self._free_top = self.capacity
        self._tick = 0
        self.num_evict = 0
        self.hits = 0
        self.lookups = 0

    def __len__(self) -> int:
        return self.capacity - self._free_top

    @property
    def phase(self) -> str:
        if self.max_num_evict >= 0 and self.num_evict >= self.max_num_evict and not self._free_top:
            return "frozen"
        return "insertion" if self._free_top else "updating"

    @property
    def nbytes(self) -> int:
        per_row = 4 * (self.values.shape[1] + self.state.shape[1]) + 8 * 4 + 2
        return self.capacity * per_row

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
        take = min(n, self._free_top)
        may_evict = self.max_num_evict < 0 or self.num_evict < self.max_num_evict
        if take < n and may_evict and hit_rate < self.target_hit_rate:
            candidates = np.flatnonzero(self.occupied)
            if keep.shape[0]:
                candidates = candidates[~np.isin(candidates, keep)]
            evict = candidates[np.argsort(self.last_use[candidates], kind="stable")]
            evict = evict[: n - take]
            if evict.shape[0]:
                self._release(evict)
                self.num_evict += 1
            take = min(n, self._free_top)
        if take:
            slots = self._free[self._free_top - take : self._free_top][::-1].copy()
            self._free_top -= take
            self._slots.put(keys[:take], slots)
            self.keys[slots] = keys[:take]
            self.occupied[slots] = True
            self.last_use[slots] = self._tick
            out[:take] = slots
        return out

    def _release(self, slots: npt.NDArray[np.int64]) -> None:
        self._slots.remove(self.keys[slots])
        self.fresh_rows -= int(np.count_nonzero(~self.on_disk[slots]))
        self.on_disk[slots] = True
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
        now = on_disk[use] if isinstance(on_disk, np.ndarray) else np.full(s.shape[0], on_disk)
        self.fresh_rows += int(np.count_nonzero(~now)) - int(np.count_nonzero(~self.on_disk[s]))
        self.on_disk[s] = now

    def clear(self) -> None:
        occupied = np.flatnonzero(self.occupied)
        if occupied.shape[0]:
            self._release(occupied)
