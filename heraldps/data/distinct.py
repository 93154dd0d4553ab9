"""Exact distinct values and distinct keys per field, in memory bounded by the vocabulary.

Each distinct (field, value) is recorded as (field, key, fingerprint), where the
fingerprint is a 64-bit FNV-1a of the value's UTF-8 bytes (an integer value is its own
fingerprint). Two values are counted as one only if both their BLAKE2b key and their
FNV-1a agree (a 128-bit match), so ``distinct values - distinct keys`` per field counts key
collisions. The set is a compiled open-addressing table (24 bytes a slot, load <= 1/2).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from heraldps.jit import njit
from heraldps.sharding import splitmix64

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(nogil=True)
def _fnv(
    offsets: npt.NDArray[np.int64], data: npt.NDArray[np.uint8], out: npt.NDArray[np.uint64]
) -> None:  # pragma: no cover - compiled
    for i in range(out.shape[0]):
        h = _FNV_OFFSET
        for p in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[p])) * _FNV_PRIME
        out[i] = h


@njit(nogil=True)
def _insert(
    keys: npt.NDArray[np.int64],
    prints: npt.NDArray[np.uint64],
    fields: npt.NDArray[np.int32],
    new_keys: npt.NDArray[np.int64],
    new_prints: npt.NDArray[np.uint64],
    field: int,
) -> int:  # pragma: no cover - compiled
    """Insert (field, key, print) triples; returns how many were new. Empty slot: field -1."""
    mask = np.uint64(keys.shape[0] - 1)
    added = 0
    for i in range(new_keys.shape[0]):
        k = new_keys[i]
        f = new_prints[i]
        s = splitmix64(np.uint64(k) ^ f ^ np.uint64(field)) & mask
        while fields[s] >= 0 and not (keys[s] == k and prints[s] == f and fields[s] == field):
            s = (s + np.uint64(1)) & mask
        if fields[s] < 0:
            keys[s] = k
            prints[s] = f
            fields[s] = field
            added += 1
    return added


def fingerprints(values: pa.Array) -> npt.NDArray[np.uint64]:
    """64-bit FNV-1a of each string's UTF-8 bytes; integers are their own fingerprint."""
    if pa.types.is_integer(values.type):
        return np.asarray(pc.cast(values, pa.int64()).fill_null(0).to_numpy()).view(np.uint64)
    if not pa.types.is_large_string(values.type):
        values = pc.cast(values, pa.large_string())
    n = len(values)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[values.offset : values.offset + n + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None and buffers[2].size
        else np.zeros(1, dtype=np.uint8)
    )
    _fnv(np.ascontiguousarray(offsets), data, out)
    return out


class DistinctCounter:
    """Distinct (field, value) and keys over a stream of per-chunk dictionaries."""

    def __init__(self, num_fields: int, capacity: int = 1 << 16) -> None:
        self.num_fields = num_fields
        self.size = 0
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        self.keys = np.zeros(capacity, dtype=np.int64)
        self.prints = np.zeros(capacity, dtype=np.uint64)
        self.fields = np.full(capacity, -1, dtype=np.int32)

    def _reserve(self, more: int) -> None:
        need = 2 * (self.size + more)
        capacity = self.keys.shape[0]
        if need <= capacity:
            return
        while capacity < need:
            capacity *= 2
        used = self.fields >= 0
        keys, prints, fields = self.keys[used], self.prints[used], self.fields[used]
        self._alloc(capacity)
        for field in np.unique(fields):
            mine = fields == field
            _insert(self.keys, self.prints, self.fields, keys[mine], prints[mine], int(field))

    def add(
        self,
        field: int,
        dictionary: pa.Array,
        unique_keys: npt.NDArray[np.int64],
        unique_present: npt.NDArray[np.bool_],
    ) -> None:
        """Record one chunk's distinct values of ``field`` (absent ones skipped)."""
        prints = fingerprints(dictionary)[unique_present]
        keys = unique_keys[unique_present]
        self._reserve(keys.shape[0])
        self.size += int(_insert(self.keys, self.prints, self.fields, keys, prints, field))

    def counts(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(distinct values per field, distinct keys per field, distinct keys overall)."""
        used = self.fields >= 0
        keys, fields = self.keys[used], self.fields[used]
        values = np.bincount(fields, minlength=self.num_fields)
        order = np.lexsort((keys, fields))
        k, f = keys[order], fields[order]
        new = np.ones(k.shape[0], dtype=bool)
        new[1:] = (k[1:] != k[:-1]) | (f[1:] != f[:-1])
        per_field = np.bincount(f[new], minlength=self.num_fields)
        total = int(np.unique(keys).size)
        return (
            tuple(int(v) for v in values),
            tuple(int(v) for v in per_field),
            total,
        )
