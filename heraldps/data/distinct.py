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
    offsets: npt.NDArray[np.int64] | npt.NDArray[np.int32],
    data: npt.NDArray[np.uint8],
    cells: npt.NDArray[np.int64],
    out: npt.NDArray[np.uint64],
) -> None:  # pragma: no cover - compiled
    """FNV-1a of string ``cells[i]`` (its bytes ``data[offsets[c]:offsets[c + 1]]``)."""
    for i in range(out.shape[0]):
        c = cells[i]
        h = _FNV_OFFSET
        for p in range(offsets[c], offsets[c + 1]):
            h = (h ^ np.uint64(data[p])) * _FNV_PRIME
        out[i] = h


@njit(nogil=True)
def _insert(
    keys: npt.NDArray[np.int64],
    prints: npt.NDArray[np.uint64],
    fields: npt.NDArray[np.int32],
    new_keys: npt.NDArray[np.int64],
    new_prints: npt.NDArray[np.uint64],
    new_fields: npt.NDArray[np.int32],
    field: int,
) -> int:  # pragma: no cover - compiled
    """Insert (field, key, print) triples; returns how many were new. Empty slot: field -1.
    The field of triple i is ``new_fields[i]``, or ``field`` when ``new_fields`` is empty;
    entries with field -1 (empty slots of an old table being moved) are skipped."""
    mask = np.uint64(keys.shape[0] - 1)
    one_field = new_fields.shape[0] == 0
    added = 0
    for i in range(new_keys.shape[0]):
        g = field if one_field else new_fields[i]
        if g < 0:
            continue
        k = new_keys[i]
        f = new_prints[i]
        s = splitmix64(np.uint64(k) ^ f ^ np.uint64(g)) & mask
        while fields[s] >= 0 and not (keys[s] == k and prints[s] == f and fields[s] == g):
            s = (s + np.uint64(1)) & mask
        if fields[s] < 0:
            keys[s] = k
            prints[s] = f
            fields[s] = g
            added += 1
    return added


_NO_FIELDS = np.empty(0, dtype=np.int32)


def fingerprints(
    values: pa.Array, cells: npt.NDArray[np.int64] | None = None
) -> npt.NDArray[np.uint64]:
    """64-bit FNV-1a of each string's UTF-8 bytes (of the cells ``cells`` only, when
    given); integers are their own fingerprint."""
    if pa.types.is_integer(values.type):
        ints = np.asarray(pc.cast(values, pa.int64()).fill_null(0).to_numpy()).view(np.uint64)
        return ints if cells is None else ints[cells]
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        values = pc.cast(values, pa.large_string())
    n = len(values)
    if cells is None:
        cells = np.arange(n, dtype=np.int64)
    out = np.empty(cells.shape[0], dtype=np.uint64)
    if n == 0 or cells.shape[0] == 0:
        return out
    buffers = values.buffers()
    offsets: npt.NDArray[np.int64] | npt.NDArray[np.int32] = (
        np.frombuffer(buffers[1], dtype=np.int64)
        if pa.types.is_large_string(values.type)
        else np.frombuffer(buffers[1], dtype=np.int32)
    )[values.offset : values.offset + n + 1]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None and buffers[2].size
        else np.zeros(1, dtype=np.uint8)
    )
    _fnv(offsets, data, cells, out)
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
        keys, prints, fields = self.keys, self.prints, self.fields
        self._alloc(capacity)
        _insert(self.keys, self.prints, self.fields, keys, prints, fields, -1)

    def add(
        self,
        field: int,
        values: pa.Array,
        cells: npt.NDArray[np.int64],
        keys: npt.NDArray[np.int64],
    ) -> None:
        """Record the values of ``field`` in cells ``cells`` of ``values`` (present cells:
        a chunk's new dictionary values, or the cells a key cache had to hash), whose keys
        are ``keys``; a value seen before is counted once."""
        prints = fingerprints(values, cells)
        self._reserve(keys.shape[0])
        self.size += int(
            _insert(self.keys, self.prints, self.fields, keys, prints, _NO_FIELDS, field)
        )

    def counts(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(distinct values per field, distinct keys per field, distinct keys overall)."""
        used = self.fields >= 0
        keys, fields = self.keys[used], self.fields[used]
        values = np.bincount(fields, minlength=self.num_fields)
        ordered = np.sort(keys)
        total = 1 + int(np.count_nonzero(ordered[1:] != ordered[:-1])) if keys.shape[0] else 0
        if total == keys.shape[0]:  # no key twice (the usual case): a key per value
            per_field = values
        else:  # some key stands for several values (a collision): count (field, key) pairs
            order = np.lexsort((keys, fields))
            k, f = keys[order], fields[order]
            new = np.ones(k.shape[0], dtype=bool)
            new[1:] = (k[1:] != k[:-1]) | (f[1:] != f[:-1])
            per_field = np.bincount(f[new], minlength=self.num_fields)
        return (
            tuple(int(v) for v in values),
            tuple(int(v) for v in per_field),
            total,
        )
