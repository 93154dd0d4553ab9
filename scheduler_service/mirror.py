"""The scheduler's exact model of every worker's cache (Herald section 3.2).

Every key the scheduler has seen gets a dense id (``kid``) and one record of
int64 fields, so each stage touches one place in memory per key:

====  ==============  ====================================================
col   field           meaning
====  ==============  ====================================================
0     ``holders``     bit w: worker w holds a *valid* (latest) copy
1     ``present``     bit w: worker w has the key in its cache (maybe stale)
2     ``trainers``    bit w: worker w trains the key in the current batch
3     ``stamp``       batch that last touched the key (scratch)
4     ``seen``        sample that last scored the key (scratch, Algorithm 1)
5     ``dirty_owner`` worker whose copy is newer than the PS's, -1 none
6     ``key``         the int64 key itself
7..   LRU positions   up to 16 workers: int32 position of the key in each
                      worker's LRU queue, -1 when not cached
====  ==============  ====================================================

LRU order is kept as one append-only queue of kids per worker: touching a
key appends it and records its position; an older entry whose position no
longer matches is stale and skipped when the queue is popped for an
eviction. That is exact LRU (the live entry of each key is its latest touch)
at one sequential write per touch, where a linked list costs four random
ones. A full queue is compacted, which also renumbers positions so they fit
in int32. Above 16 workers the positions move to a hash table keyed by
``kid * 64 + worker`` so a record stays small.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps import hostmem
from heraldps.errors import InvalidArgument
from heraldps.keyindex import KeyIndex, empty_slot_table, rehash
from heraldps.modes import MAX_WORKERS
from scheduler_service import kernels

MAX_CAPACITY = 2**29  # LRU positions and kids are int32; a queue holds <= 4x capacity
DENSE_WORKERS = 16  # up to this many workers, LRU positions live in the key's record
_FIELDS = 7
_MIN_ROWS = 1024


class CacheMirror:
    """Which rows every worker caches, in which LRU order, valid or dirty."""

    def __init__(self, num_workers: int, capacity: int) -> None:
        if not 1 <= num_workers <= MAX_WORKERS:
            raise InvalidArgument(f"workers must be in 1..{MAX_WORKERS}, got {num_workers}")
        if not 1 <= capacity <= MAX_CAPACITY:
            raise InvalidArgument(
                f"cache capacity must be in 1..{MAX_CAPACITY} rows per worker, got {capacity}"
            )
        self.num_workers = num_workers
        self.capacity = capacity
        self.index = KeyIndex()
        self.dense = num_workers <= DENSE_WORKERS
        width = _FIELDS + ((num_workers + 1) // 2 if self.dense else 0)
        self._set_records(np.zeros((0, width), np.int64))
        self.queue = np.zeros((num_workers, 0), np.int32)
        self.queue_head = np.zeros(num_workers, np.int64)
        self.queue_tail = np.zeros(num_workers, np.int64)
        self.used = np.zeros(num_workers, np.int64)
        self.table = empty_slot_table(1024 if not self.dense else 1)
        self.samples_seen = 0
        self.batches_seen = 0

    def kids(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Dense ids of ``keys``, registering new ones."""
        known = len(self.index)
        kids = self.index.insert(keys)
        n = len(self.index)
        if n > self._records.shape[0]:
            self._grow_records(max(n, 2 * self._records.shape[0], _MIN_ROWS))
        if n > known:
            kernels.record_keys(kids, keys, known, self.key)
        return kids

    def _grow_records(self, rows: int) -> None:
        old = self._records.shape[0]
        records = hostmem.grown(self._records, rows)
        # stamp, seen: never; dirty_owner: nobody; LRU positions: not cached.
        records[old:, 3:] = -1
        self._set_records(records)

    def _set_records(self, records: npt.NDArray[np.int64]) -> None:
        self._records = records
        as_unsigned = records.view(np.uint64)
        self.holders, self.present = as_unsigned[:, 0], as_unsigned[:, 1]
        self.trainers = as_unsigned[:, 2]
        self.stamp, self.seen, self.dirty_owner = records[:, 3], records[:, 4], records[:, 5]
        self.key = records[:, 6]
        if self.dense:
            first = 2 * _FIELDS
            self.positions = records.view(np.int32)[:, first : first + self.num_workers]
        else:
            self.positions = np.zeros((1, 1), np.int32)

    def reserve(self, wl_offsets: npt.NDArray[np.int64]) -> None:
        """Room for every worker to touch its whole mini-batch (``wl_offsets`` bounds)."""
        need = np.diff(wl_offsets)
        over = np.flatnonzero(self.queue_tail + need > self.queue.shape[1])
        if over.shape[0]:
            for w in over.tolist():
                kernels.compact_queue(
                    w, self.queue, self.queue_head, self.queue_tail, self.positions,
                    self.table, self.dense,
                )  # fmt: skip
            live = int((self.queue_tail[over] + need[over]).max())
            if 2 * live > self.queue.shape[1]:  # keep compactions at least a half queue apart
                length = max(2 * live, _MIN_ROWS)  # live <= 2 x capacity: int32 positions
                queue = np.zeros((self.num_workers, length), np.int32)
                queue[:, : self.queue.shape[1]] = self.queue
                self.queue = queue
        if not self.dense:
            entries = int(self.used.sum()) + int(need.sum())
            size = self.table.shape[0]
            if 2 * entries > size:
                while size < 2 * entries:
                    size *= 2
                table = empty_slot_table(size)
                rehash(self.table, table)
                self.table = table

    def dirty_rows(self) -> int:
        return int((self.dirty_owner[: len(self.index)] >= 0).sum())

    def take_dirty(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(owner, key) of every dirty row, now marked clean: its owner writes it back at a
        checkpoint and keeps it cached, the valid copy it was (holders do not change)."""
        owners = self.dirty_owner[: len(self.index)]
        kids = np.flatnonzero(owners >= 0)
        workers, keys = owners[kids].copy(), self.key[kids].copy()
        owners[kids] = -1
        return workers, keys
