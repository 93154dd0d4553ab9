"""A compiled open-addressing hash map from int64 keys to dense row numbers.

Shard stores, gradient buffers and (later) worker caches keep their rows in
contiguous arrays; this index maps a batch of keys to row numbers in one
compiled loop (numba, GIL released), so no request path walks a Python dict.

Layout: two parallel arrays of ``capacity`` slots (a power of two): the key
(int64) and its row (int32, -1 = empty slot), linear probing on
``splitmix64(key)``. Any int64 is a valid key. The load factor stays <= 1/2,
so a slot costs 12 bytes and a key 24-48 bytes of index.
Rows are never removed one by one: the stores that use it only grow, or are
rebuilt whole (load, eviction compaction).
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

from heraldps.sharding import splitmix64

_MIN_CAPACITY = 1024


@numba.njit(cache=True, nogil=True, inline="always")
def _probe(
    slot_keys: npt.NDArray[np.int64], slot_rows: npt.NDArray[np.int32], key: np.int64
) -> np.uint64:  # pragma: no cover - compiled
    """The slot holding ``key``, or the empty slot where it would go."""
    mask = np.uint64(slot_keys.shape[0] - 1)
    s = splitmix64(np.uint64(key)) & mask
    while slot_rows[s] >= 0 and slot_keys[s] != key:
        s = (s + np.uint64(1)) & mask
    return s


@numba.njit(cache=True, nogil=True)
def _lookup(
    slot_keys: npt.NDArray[np.int64],
    slot_rows: npt.NDArray[np.int32],
    keys: npt.NDArray[np.int64],
    out: npt.NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    for i in range(keys.shape[0]):
        out[i] = slot_rows[_probe(slot_keys, slot_rows, keys[i])]


@numba.njit(cache=True, nogil=True)
def _insert(
    slot_keys: npt.NDArray[np.int64],
    slot_rows: npt.NDArray[np.int32],
    keys: npt.NDArray[np.int64],
    next_row: int,
    out: npt.NDArray[np.int64],
) -> int:  # pragma: no cover - compiled
    for i in range(keys.shape[0]):
        s = _probe(slot_keys, slot_rows, keys[i])
        if slot_rows[s] < 0:
            slot_keys[s] = keys[i]
            slot_rows[s] = next_row
            next_row += 1
        out[i] = slot_rows[s]
    return next_row


def _capacity_for(rows: int) -> int:
    capacity = _MIN_CAPACITY
    while capacity < 2 * rows:
        capacity *= 2
    return capacity


class KeyIndex:
    """Maps int64 keys to rows ``0..len-1`` in order of first insertion."""

    def __init__(self, expected_rows: int = 0) -> None:
        capacity = _capacity_for(expected_rows)
        self._slot_keys = np.zeros(capacity, dtype=np.int64)
        self._slot_rows = np.full(capacity, -1, dtype=np.int32)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes held by the slot arrays."""
        return int(self._slot_keys.nbytes + self._slot_rows.nbytes)

    @staticmethod
    def bytes_for(rows: int) -> int:
        """Slot bytes an index holding ``rows`` keys uses."""
        return _capacity_for(rows) * 12

    def lookup(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Row of every key, -1 where absent."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty(keys.shape[0], dtype=np.int64)
        _lookup(self._slot_keys, self._slot_rows, keys, out)
        return out

    def insert(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Row of every key, adding absent keys (duplicates get one row) in order."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        self._reserve(self._size + keys.shape[0])
        out = np.empty(keys.shape[0], dtype=np.int64)
        self._size = int(_insert(self._slot_keys, self._slot_rows, keys, self._size, out))
        return out

    def _reserve(self, rows: int) -> None:
        if 2 * rows <= self._slot_keys.shape[0]:
            return
        if rows >= np.iinfo(np.int32).max:
            raise OverflowError("a KeyIndex holds at most 2**31 - 1 rows")
        occupied = self._slot_rows >= 0
        old_keys = self._slot_keys[occupied]
        old_rows = self._slot_rows[occupied]
        capacity = _capacity_for(rows)
        self._slot_keys = np.zeros(capacity, dtype=np.int64)
        self._slot_rows = np.full(capacity, -1, dtype=np.int32)
        # Re-insert in row order so each key keeps its row number.
        order = np.argsort(old_rows, kind="stable")
        scratch = np.empty(old_keys.shape[0], dtype=np.int64)
        _insert(self._slot_keys, self._slot_rows, old_keys[order], 0, scratch)


def distinct(
    keys: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Distinct keys in order of first occurrence, and each key's position among them.

    ``unique[inverse] == keys``. A hash pass: about 5x faster than ``np.unique``
    (which sorts) on a 65,536-key request.
    """
    index = KeyIndex(keys.shape[0])
    inverse = index.insert(keys)
    unique = np.empty(len(index), dtype=np.int64)
    unique[inverse] = keys
    return unique, inverse
