"""A worker's embedding cache: rows with optimizer state, clocks and dirty flags.

Row storage (values, optimizer state, gradients waiting to be pushed) lives in
the array module the worker trains with: CuPy arrays on a GPU, NumPy
otherwise. Bookkeeping (which key sits in which slot, clocks, dirty flags,
recency and frequency) stays in host NumPy arrays, so deciding what to pull,
push or evict never waits on the device.

The cache owns its state machine; callers use its operations only:

- ``admit``: rows fetched from the PS (new ones inserted, held ones refreshed;
  clean, local clock = PS clock);
- ``gather``: the rows a mini-batch trains (and a use for LRU/LFU);
- ``mark_trained``: the optimizer applied locally; the row is dirty and one
  clock ahead;
- ``add_pending`` / ``take_pending``: HET's gradients not yet pushed, with
  the number of local steps they sum;
- ``rows_for_write_back`` / ``mark_written``: dirty rows returned to the PS;
- ``evict``, ``victims``: making room.

Clocks follow HET (section 3.1): ``start`` is the PS clock (the row's
version) when the row was fetched, ``clock`` the local clock, one higher for
every local update. A row is dirty when its value is newer than the PS's
(or, under HET, has gradients the PS has not seen).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.arrays import to_host
from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.keyindex import SlotMap
from heraldps.optim import Optimizer

Keys = npt.NDArray[np.int64]
Slots = npt.NDArray[np.int64]


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


@dataclass(frozen=True)
class WriteBackRows:
    """Dirty rows on their way to the PS (host arrays), with the clocks the PS checks."""

    keys: Keys
    values: npt.NDArray[np.float32]
    state: npt.NDArray[np.float32]
    base_versions: npt.NDArray[np.int64]  # the PS clock each row was fetched at
    new_versions: npt.NDArray[np.int64]  # the local clock: base + local updates
    slots: Slots


@dataclass(frozen=True)
class PendingGradients:
    """HET's unpushed gradients (host arrays): each row the sum of ``steps`` local steps."""

    keys: Keys
    grads: npt.NDArray[np.float32]
    steps: npt.NDArray[np.int32]


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
        self._values = xp.zeros((capacity, dim), dtype=np.float32)
        self._state = xp.zeros((capacity, state_width), dtype=np.float32)
        self._pending = xp.zeros((capacity, dim), dtype=np.float32)  # gradients not yet pushed
        self._pending_steps = np.zeros(capacity, dtype=np.int32)  # local steps they sum
        self._keys = np.zeros(capacity, dtype=np.int64)
        self._start = np.zeros(capacity, dtype=np.int64)
        self._clock = np.zeros(capacity, dtype=np.int64)
        self._dirty = np.zeros(capacity, dtype=bool)
        self._no_state = np.zeros(capacity, dtype=bool)  # fetched without optimizer state
        self._last_use = np.zeros(capacity, dtype=np.int64)
        self._uses = np.zeros(capacity, dtype=np.int64)
        self._occupied = np.zeros(capacity, dtype=bool)
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # a stack of free slots
        self._free_top = capacity
        self._slots = SlotMap(capacity)
        self._tick = 0

    # ----- queries -----------------------------------------------------------------
    def __len__(self) -> int:
        return self.capacity - self._free_top

    @property
    def free(self) -> int:
        return self._free_top

    def slots(self, keys: Keys) -> Slots:
        """Slot of every key, -1 where not cached."""
        return self._slots.lookup(keys)

    def keys_at(self, slots: Slots) -> Keys:
        return self._keys[slots]

    def clocks(self, slots: Slots) -> npt.NDArray[np.int64]:
        """Local clocks (the PS clock at fetch plus local updates) of cached rows."""
        return self._clock[slots]

    def updates_since_fetch(self, slots: Slots) -> npt.NDArray[np.int64]:
        """Local updates each cached row received since it was fetched."""
        return self._clock[slots] - self._start[slots]

    def dirty(self, slots: Slots) -> npt.NDArray[np.bool_]:
        """Whether each cached row is newer than the PS's (or has unpushed gradients)."""
        return self._dirty[slots]

    def cached_keys(self) -> Keys:
        return self._keys[self._occupied]

    def dirty_keys(self) -> Keys:
        """Every dirty row's key, ascending."""
        return np.sort(self._keys[self._occupied & self._dirty])

    def dirty_slots(self) -> Slots:
        return np.flatnonzero(self._occupied & self._dirty)

    def dirty_count(self) -> int:
        return int(np.count_nonzero(self._occupied & self._dirty))

    def host_rows(self, keys: Keys) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Values and state of cached ``keys`` copied to the host (tests, inspection)."""
        slots = self._held(keys, "read")
        device_slots = self.xp.asarray(slots)
        return to_host(self._values[device_slots]), to_host(self._state[device_slots])

    # ----- rows in and out -----------------------------------------------------------
    def admit(
        self,
        keys: Keys,
        values: Any,
        state: Any,
        versions: npt.NDArray[np.int64],
        with_state: npt.NDArray[np.bool_] | None = None,
    ) -> Slots:
        """Store rows fetched from the PS (distinct keys): cached keys are refreshed, the
        others inserted; every one is clean with local clock = PS clock. Refuses to
        overwrite a dirty row (its local updates would be lost) or to overflow.
        ``with_state`` (default: every row) marks the rows whose optimizer state came
        along; the others can be trained on but not updated here (:meth:`mark_trained`)."""
        slots = self._slots.lookup(keys)
        held = slots >= 0
        if np.any(self._dirty[slots[held]]):
            raise FailedPrecondition(
                "cannot overwrite dirty cached rows with the PS's copy (their local updates "
                f"would be lost): {keys[held][self._dirty[slots[held]]][:5].tolist()}"
            )
        new = int(np.count_nonzero(~held))
        if new > self._free_top:
            raise FailedPrecondition(
                f"cache of {self.capacity} rows has {self._free_top} free, cannot add {new}"
            )
        fresh = self._free[self._free_top - new : self._free_top][::-1].copy()
        self._free_top -= new
        self._slots.put(keys[~held], fresh)
        slots[~held] = fresh
        self._keys[fresh] = keys[~held]
        self._occupied[fresh] = True
        self._uses[fresh] = 0
        self._last_use[fresh] = self._tick
        xp = self.xp
        device_slots = xp.asarray(slots)
        self._values[device_slots] = xp.asarray(values)
        if self.state_width:
            self._state[device_slots] = xp.asarray(state)
        self._pending[device_slots] = 0
        self._pending_steps[slots] = 0
        self._start[slots] = versions
        self._clock[slots] = versions
        self._dirty[slots] = False
        self._no_state[slots] = False if with_state is None else ~with_state
        return slots

    def gather(self, slots: Slots) -> Any:
        """The values of ``slots`` (device array) for training; records one use of each."""
        self._tick += 1
        self._last_use[slots] = self._tick
        self._uses[slots] += 1
        return self._values[self.xp.asarray(slots)]

    def mark_trained(self, slots: Slots, grads: Any, optimizer: Optimizer) -> None:
        """Apply ``optimizer`` to the rows with their gradients (device), as the PS would:
        each row is one clock ahead of its fetch and dirty until written back. Refuses
        rows fetched without their state, before anything changes."""
        stateless = self._no_state[slots]
        if np.any(stateless):
            raise FailedPrecondition(
                "cannot update cached rows that were pulled without their optimizer state "
                f"(only their gradients may be pushed): {self._keys[slots[stateless]][:5].tolist()}"
            )
        device_slots = self.xp.asarray(slots)
        values = self._values[device_slots]
        state = self._state[device_slots]
        optimizer.apply(values, state, grads)
        self._values[device_slots] = values
        self._state[device_slots] = state
        self._clock[slots] += 1
        self._dirty[slots] = True

    def add_pending(self, slots: Slots, grads: Any) -> None:
        """HET: remember gradients (device) of one local step the PS has not received yet."""
        self._pending[self.xp.asarray(slots)] += grads
        self._pending_steps[slots] += 1

    def take_pending(self, slots: Slots) -> PendingGradients:
        """HET: keys, host gradients and step counts of those ``slots`` that have unpushed
        gradients (the dirty ones); afterwards they are clean and have none."""
        slots = slots[self._dirty[slots]]
        if not slots.shape[0]:
            return PendingGradients(
                np.empty(0, np.int64), np.empty((0, self.dim), np.float32), np.empty(0, np.int32)
            )
        device_slots = self.xp.asarray(slots)
        grads = to_host(self._pending[device_slots])
        steps = self._pending_steps[slots].copy()
        self._pending[device_slots] = 0
        self._pending_steps[slots] = 0
        self._dirty[slots] = False
        return PendingGradients(self._keys[slots], grads, steps)

    def rows_for_write_back(self, keys: Keys) -> WriteBackRows:
        """Host copies of cached rows ``keys`` with their base (fetch) and new (local)
        clocks: what ``PSClient.write_back`` sends. Nothing changes until ``mark_written``."""
        slots = self._held(keys, "write back")
        device_slots = self.xp.asarray(slots)
        return WriteBackRows(
            keys=keys,
            values=to_host(self._values[device_slots]),
            state=to_host(self._state[device_slots]),
            base_versions=self._start[slots],
            new_versions=self._clock[slots],
            slots=slots,
        )

    def mark_written(self, rows: WriteBackRows) -> None:
        """The PS stored ``rows``: they are clean, and their clocks start anew."""
        self._start[rows.slots] = rows.new_versions
        self._dirty[rows.slots] = False

    # ----- making room -----------------------------------------------------------------
    def evict(self, keys: Keys) -> None:
        """Drop cached ``keys``; refuses keys not cached. The caller decides what happens
        to dirty rows first (write back, push pending), the cache just forgets them."""
        slots = self._held(keys, "evict")
        self._slots.remove(keys)
        self._occupied[slots] = False
        self._dirty[slots] = False
        self._free[self._free_top : self._free_top + slots.shape[0]] = slots
        self._free_top += slots.shape[0]

    def victims(self, count: int, keep: Slots) -> Keys:
        """``count`` cached keys to evict by the policy, never one of the slots ``keep``."""
        candidates = np.flatnonzero(self._occupied)
        if keep.shape[0]:
            candidates = candidates[~np.isin(candidates, keep)]
        if count > candidates.shape[0]:
            raise FailedPrecondition(
                f"cache of {self.capacity} rows cannot make room for {count} more: the "
                "mini-batch needs more rows than the cache holds; raise the cache size"
            )
        order = self.policy.order(self._last_use[candidates], self._uses[candidates])
        return self._keys[candidates[order[:count]]]

    def _held(self, keys: Keys, what: str) -> Slots:
        slots = self._slots.lookup(keys)
        if np.any(slots < 0):
            missing = keys[slots < 0][:5].tolist()
            raise FailedPrecondition(f"cannot {what} keys that are not cached: {missing}")
        return slots
