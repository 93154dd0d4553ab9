"""A worker's embedding cache: rows with optimizer state, clocks and dirty flags.

Row storage (values, state, gradients waiting to be pushed) lives in the
array module the worker trains with: CuPy arrays on a GPU, NumPy otherwise.
Bookkeeping (which key sits in which slot, clocks, dirty flags, recency and
frequency) stays in host NumPy arrays, so deciding what to pull, push or
evict never waits on the device.

Clocks follow HET (section 3.1): ``start`` is the PS clock (the row's
version) when the row was fetched, ``clock`` the local clock, one higher for
every local update. A row is dirty when its value is newer than the PS's.
Policies decide victims when the worker itself must make room (HET mode);
under a Herald plan the scheduler decides evictions and the policy only
orders nothing.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.keyindex import SlotMap

Keys = npt.NDArray[np.int64]


class EvictionPolicy(abc.ABC):
    """Orders cached rows for eviction: the first ones go first."""

    name: str

    @abc.abstractmethod
    def order(
        self, last_use: npt.NDArray[np.int64], uses: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.intp]:
        """Positions of the candidate rows, best victim first."""


class LRU(EvictionPolicy):
    """Least recently used first."""

    name = "lru"

    def order(
        self, last_use: npt.NDArray[np.int64], uses: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.intp]:
        return np.argsort(last_use, kind="stable")


class LFU(EvictionPolicy):
    """Least frequently used first; ties by least recent use."""

    name = "lfu"

    def order(
        self, last_use: npt.NDArray[np.int64], uses: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.intp]:
        return np.lexsort((last_use, uses))


POLICIES: dict[str, type[EvictionPolicy]] = {"lru": LRU, "lfu": LFU}


class EmbeddingCache:
    """Up to ``capacity`` rows of one table, addressed by int64 key."""

    def __init__(
        self,
        capacity: int,
        dim: int,
        state_width: int,
        policy: str = "lru",
        xp: Any = np,
    ) -> None:
        if capacity < 1:
            raise InvalidArgument(f"cache capacity must be >= 1 row, got {capacity}")
        if policy not in POLICIES:
            raise InvalidArgument(f"unknown cache policy {policy!r}; use one of lru, lfu")
        self.capacity = capacity
        self.dim = dim
        self.state_width = state_width
        self.policy = POLICIES[policy]()
        self.xp = xp
        self.values = xp.zeros((capacity, dim), dtype=np.float32)
        self.state = xp.zeros((capacity, state_width), dtype=np.float32)
        self.pending = xp.zeros((capacity, dim), dtype=np.float32)  # gradients not yet pushed
        self.keys = np.zeros(capacity, dtype=np.int64)
        self.start = np.zeros(capacity, dtype=np.int64)
        self.clock = np.zeros(capacity, dtype=np.int64)
        self.dirty = np.zeros(capacity, dtype=bool)  # HET: it also has unpushed gradients
        self.last_use = np.zeros(capacity, dtype=np.int64)
        self.uses = np.zeros(capacity, dtype=np.int64)
        self.occupied = np.zeros(capacity, dtype=bool)
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # a stack of free slots
        self._free_top = capacity
        self._slots = SlotMap(capacity)
        self._tick = 0

    def __len__(self) -> int:
        return self.capacity - self._free_top

    @property
    def free(self) -> int:
        return self._free_top

    def slots(self, keys: Keys) -> npt.NDArray[np.int64]:
        """Slot of every key, -1 where not cached."""
        return self._slots.lookup(keys)

    def cached_keys(self) -> Keys:
        return self.keys[self.occupied]

    def touch(self, slots: npt.NDArray[np.int64]) -> None:
        """Record a use of these rows (one step of the LRU/LFU clocks)."""
        self._tick += 1
        self.last_use[slots] = self._tick
        self.uses[slots] += 1

    def insert(
        self,
        keys: Keys,
        values: Any,
        state: Any,
        versions: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        """Cache rows fetched from the PS (distinct keys, none cached yet); return their slots."""
        n = keys.shape[0]
        if n > self._free_top:
            raise FailedPrecondition(
                f"cache of {self.capacity} rows has {self._free_top} free, cannot add {n}"
            )
        slots = self._free[self._free_top - n : self._free_top][::-1].copy()
        self._free_top -= n
        self._slots.put(keys, slots)
        self.keys[slots] = keys
        self.occupied[slots] = True
        self.uses[slots] = 0
        self.last_use[slots] = self._tick
        self.refresh(slots, values, state, versions)
        return slots

    def refresh(
        self, slots: npt.NDArray[np.int64], values: Any, state: Any, versions: npt.NDArray[np.int64]
    ) -> None:
        """Overwrite cached rows with what the PS holds now (clean, clocks reset)."""
        xp = self.xp
        device_slots = xp.asarray(slots)
        self.values[device_slots] = xp.asarray(values)
        if self.state_width:
            self.state[device_slots] = xp.asarray(state)
        self.pending[device_slots] = 0
        self.start[slots] = versions
        self.clock[slots] = versions
        self.dirty[slots] = False

    def remove(self, keys: Keys) -> npt.NDArray[np.int64]:
        """Drop cached keys; return the slots they had (now free)."""
        slots = self._slots.lookup(keys)
        if np.any(slots < 0):
            missing = keys[slots < 0][:5].tolist()
            raise FailedPrecondition(f"cannot evict keys that are not cached: {missing}")
        self._slots.remove(keys)
        self.occupied[slots] = False
        self.dirty[slots] = False
        self._free[self._free_top : self._free_top + slots.shape[0]] = slots
        self._free_top += slots.shape[0]
        return slots

    def victims(self, count: int, keep: npt.NDArray[np.int64]) -> Keys:
        """``count`` cached keys to evict by the policy, never one of the slots ``keep``."""
        candidates = np.flatnonzero(self.occupied)
        if keep.shape[0]:
            candidates = candidates[~np.isin(candidates, keep)]
        if count > candidates.shape[0]:
            raise FailedPrecondition(
                f"cache of {self.capacity} rows cannot make room for {count} more: the "
                "mini-batch needs more rows than the cache holds; raise the cache size"
            )
        order = self.policy.order(self.last_use[candidates], self.uses[candidates])
        return self.keys[candidates[order[:count]]]
