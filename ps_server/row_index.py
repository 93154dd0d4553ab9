"""The key -> row index of a Staged-PS table, sized to hold tens of millions of rows.

:class:`heraldps.keyindex.KeyIndex` (the index of requests, gradient buffers
and worker caches) keeps a power-of-two slot count at a load of at most 1/2:
32-64 bytes of index per key, 43 at 50M keys, which alone is 30% of a dim-16
AdaGrad row (144 bytes). A table's index is the one structure that lives as
long as its rows, so it is built differently:

- any slot count (the home slot is the top 32 bits of ``splitmix64(key)`` scaled to
  the capacity: a multiply and a shift), grown to a
  load of ``GROW_TO`` once an insert would pass ``MAX_LOAD``: 20-27 bytes per
  key, and a table sized up front (``expected_rows``) never rehashes;
- each slot holds the key and its row (16 bytes, one cache line per probe),
  so the table needs no separate array of keys: ``keys_by_row`` rebuilds it for
  the rare export or snapshot;
- linear probing, the home slots of keys 32 places ahead prefetched (16, as in
  ``KeyIndex``, kept too few misses in flight: 65,536 lookups in 1M rows took
  1.4-1.5 ms against 1.2 ms at 32 on our VM). At a load of 0.8 a present key
  takes 3 probes on average, an absent one 13: a few adjacent lines, which the
  hardware prefetcher streams;
- a big lookup runs on every core at once (``ps_server.parallel``): it only reads.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from heraldps import hostmem
from heraldps.jit import njit
from heraldps.prefetch import prefetch
from heraldps.sharding import splitmix64
from ps_server.parallel import in_parts

MAX_LOAD = 0.8  # an insert that would pass it grows the index first
GROW_TO = 0.6  # the load right after growing
MIN_CAPACITY = 1024
MAX_ROWS = 2**31  # keeps the slot count below 2**32 (``_home``), as KeyIndex's limit
SLOT_BYTES = 16
PREFETCH_DISTANCE = 32  # a power of two: the ring index masks


@njit(nogil=True, inline="always")
def _home(slots: npt.NDArray[np.int64], key: np.int64) -> np.int64:  # pragma: no cover
    """The first slot ``key`` probes: the hash's top 32 bits scaled to the slot count
    (a multiply and a shift, not a division; capacity < 2**32)."""
    high = splitmix64(np.uint64(key)) >> np.uint64(32)
    return np.int64((high * np.uint64(slots.shape[0])) >> np.uint64(32))


@njit(nogil=True, inline="always")
def _probe(
    slots: npt.NDArray[np.int64], key: np.int64, start: np.int64
) -> np.int64:  # pragma: no cover
    """The slot holding ``key``, or the empty slot where it would go, from ``start`` on."""
    capacity = slots.shape[0]
    s = start
    while slots[s, 1] >= 0 and slots[s, 0] != key:
        s += np.int64(1)
        if s == capacity:
            s = np.int64(0)
    return s


@njit(nogil=True)
def _resolve(
    slots: npt.NDArray[np.int64],
    keys: npt.NDArray[np.int64],
    add: bool,
    next_row: int,
    out: npt.NDArray[np.int64],
) -> int:  # pragma: no cover - compiled
    """Row of every key (-1 if absent and not ``add``); returns the next free row."""
    n = keys.shape[0]
    ahead = np.empty(PREFETCH_DISTANCE, dtype=np.int64)
    ring = PREFETCH_DISTANCE - 1
    for i in range(min(PREFETCH_DISTANCE, n)):
        ahead[i] = _home(slots, keys[i])
        prefetch(slots, ahead[i])
    for i in range(n):
        start = ahead[i & ring]
        j = i + PREFETCH_DISTANCE
        if j < n:
            ahead[j & ring] = _home(slots, keys[j])
            prefetch(slots, ahead[j & ring])
        s = _probe(slots, keys[i], start)
        if add and slots[s, 1] < 0:
            slots[s, 0] = keys[i]
            slots[s, 1] = next_row
            next_row += 1
        out[i] = slots[s, 1]
    return next_row


@njit(nogil=True)
def _rehash(old: npt.NDArray[np.int64], new: npt.NDArray[np.int64]) -> None:  # pragma: no cover
    """Every entry of ``old`` into the empty ``new``, rows unchanged."""
    for s in range(old.shape[0]):
        if old[s, 1] >= 0:
            t = _probe(new, old[s, 0], _home(new, old[s, 0]))
            new[t, 0] = old[s, 0]
            new[t, 1] = old[s, 1]


@njit(nogil=True)
def _keys_by_row(
    slots: npt.NDArray[np.int64], out: npt.NDArray[np.int64]
) -> None:  # pragma: no cover
    for s in range(slots.shape[0]):
        row = slots[s, 1]
        if row >= 0:
            out[row] = slots[s, 0]


def capacity_for(rows: int) -> int:
    """Slots for ``rows`` keys at a load of ``GROW_TO`` (at least ``MIN_CAPACITY``)."""
    return max(MIN_CAPACITY, math.ceil(rows / GROW_TO))


def _empty_slots(capacity: int) -> npt.NDArray[np.int64]:
    slots = hostmem.zeros((capacity, 2), np.int64)
    slots[:, 1] = -1
    return slots


class RowIndex:
    """Maps int64 keys to rows ``0..len-1`` in order of first insertion (see module doc)."""

    def __init__(self, expected_rows: int = 0) -> None:
        self._slots = _empty_slots(capacity_for(expected_rows))
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def capacity(self) -> int:
        return int(self._slots.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by the slots."""
        return int(self._slots.nbytes)

    def bytes_after(self, rows: int) -> int:
        """Slot bytes once the index holds ``rows`` keys (growing if they pass MAX_LOAD)."""
        if rows <= self.capacity * MAX_LOAD:
            return self.nbytes
        return capacity_for(rows) * SLOT_BYTES

    def lookup(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Row of every key, -1 where absent (a big batch on every core at once)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty(keys.shape[0], dtype=np.int64)
        slots = self._slots
        in_parts(keys.shape[0], lambda lo, hi: _resolve(slots, keys[lo:hi], False, 0, out[lo:hi]))
        return out

    def insert(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Row of every key, adding absent keys (duplicates get one row) in order."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        self.reserve(self._size + keys.shape[0])
        out = np.empty(keys.shape[0], dtype=np.int64)
        self._size = int(_resolve(self._slots, keys, True, self._size, out))
        return out

    def reserve(self, rows: int) -> None:
        """Grow (rehash) now if ``rows`` keys would pass ``MAX_LOAD``."""
        if rows <= self.capacity * MAX_LOAD:
            return
        if rows > MAX_ROWS:
            raise OverflowError(f"a table index holds at most {MAX_ROWS} rows")
        slots = _empty_slots(capacity_for(rows))
        _rehash(self._slots, slots)
        self._slots = slots

    def keys_by_row(self) -> npt.NDArray[np.int64]:
        """The key of every row, in row order (one pass over the slots)."""
        out = np.empty(self._size, dtype=np.int64)
        _keys_by_row(self._slots, out)
        return out
