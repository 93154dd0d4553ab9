"""The scheduler's exact model of every worker's cache (Herald section 3.2).

Every key the scheduler has seen gets a dense id (``kid``, in order of first
sight) and one record of four int64 fields (32 bytes, one cache line access):

====  ==============  ====================================================
col   field           meaning
====  ==============  ====================================================
0     ``holders``     bit w: worker w holds a *valid* (latest) copy
1     ``dirty_owner`` worker whose copy is newer than the PS's, -1 none
2     ``key``         the int64 key itself
3     (spare)         keeps a record inside one 32-byte line
====  ==============  ====================================================

Which keys a worker caches, and in which LRU order, is per worker: an
append-only queue of kids (touching a key appends it) and a position table
mapping each cached kid to its live queue position (``kernels.table_*``: 8-byte
slots of ``kid << 32 | position``, load <= 1/2). A queue entry whose position
no longer matches its kid's is stale and skipped when the queue is popped for
an eviction. That is exact LRU (the live entry of each key is its latest touch)
at one sequential write and one table access per touch. A full queue is
compacted, which also renumbers positions. Per-worker state lets the cache
pass run on two threads, one group of workers each.

Capacity and growth (what the job knows sizes the structures up front):

- ``expected_keys`` (the job's keyset size or a first pass's distinct-key count;
  0 when unknown) sizes the key index and the records, so a run that sees no more
  keys never rehashes or copies them. Past it, both double (one O(keys) copy each,
  amortized O(1) per key).
- Records live on a lazily committed mapping (``heraldps.hostmem``): reserving
  rows costs no memory until a key takes them.
- Queues are reserved at ``min(3 x capacity, 4M)`` entries per worker, lazily
  committed (written front to back); past that they double.
- A worker's position table holds at most ``capacity`` kids; it starts small and
  doubles when its load would pass its threshold, staggered between 1/4 and 1/2 by
  worker (``growth_threshold``), so the 64 tables of a job do not all rehash in the
  same batch.
"""

from __future__ import annotations

import itertools
from functools import partial

import numpy as np
import numpy.typing as npt
from numba.typed import List

from heraldps import hostmem
from heraldps.errors import InvalidArgument
from heraldps.keyindex import KeyIndex
from heraldps.modes import MAX_WORKERS
from scheduler_service import kernels
from scheduler_service.split import run_pieces

MAX_CAPACITY = 2**29  # a queue holds <= 4x capacity entries; positions are < 2**32
_FIELDS = 4
_MIN_ROWS = 1024
_MIN_TABLE = 1024
QUEUE_RESERVE = 2**22  # entries per worker reserved (lazily) before the first growth
PARALLEL_KEYS = 65_536  # batches with fewer keys (distinct keys) number (look up) on one thread
PIECES = 4  # pieces of a split stage (``split.run_pieces``): the two threads balance them


def growth_threshold(worker: int) -> float:
    """Load above which worker ``worker``'s position table doubles: 1/4 .. 1/2 in
    eighths of 1/4 by worker, so tables of workers that cache alike grow apart."""
    return 0.5 - (worker % 8) / 32


def _empty_local(size: int) -> npt.NDArray[np.int64]:
    """A batch's scratch (key, lid) table; big ones on huge pages (``heraldps.hostmem``)."""
    table = hostmem.zeros((size, 2), np.int64)
    table[:, 1] = kernels.EMPTY
    return table


def empty_table(size: int) -> npt.NDArray[np.int64]:
    """An all-EMPTY position table; big ones on huge pages: its probes are random."""
    table = hostmem.zeros((size,), np.int64)
    table[:] = kernels.EMPTY
    return table


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class CacheMirror:
    """Which rows every worker caches, in which LRU order, valid or dirty."""

    def __init__(self, num_workers: int, capacity: int, expected_keys: int = 0) -> None:
        if not 1 <= num_workers <= MAX_WORKERS:
            raise InvalidArgument(f"workers must be in 1..{MAX_WORKERS}, got {num_workers}")
        if not 1 <= capacity <= MAX_CAPACITY:
            raise InvalidArgument(
                f"cache capacity must be in 1..{MAX_CAPACITY} rows per worker, got {capacity}"
            )
        if expected_keys < 0:
            raise InvalidArgument(f"expected keys must be >= 0, got {expected_keys}")
        self.num_workers = num_workers
        self.capacity = capacity
        self.expected_keys = expected_keys
        self.index = KeyIndex(expected_keys)
        self._set_records(hostmem.zeros((max(expected_keys, _MIN_ROWS), _FIELDS), np.int64))
        self.queue = hostmem.zeros((num_workers, min(3 * capacity, QUEUE_RESERVE)), np.int32)
        self.queue_head = np.zeros(num_workers, np.int64)
        self.queue_tail = np.zeros(num_workers, np.int64)
        self.used = np.zeros(num_workers, np.int64)
        self.tables = List([empty_table(_MIN_TABLE) for _ in range(num_workers)])
        self.table_sizes = np.full(num_workers, _MIN_TABLE, np.int64)
        self._thresholds = np.array([growth_threshold(w) for w in range(num_workers)])
        self.placeholder = np.zeros(1, np.int64)
        self.fresh = List([self.placeholder for _ in range(num_workers)])
        self._local = [_empty_local(_MIN_TABLE), _empty_local(_MIN_TABLE)]
        self._distinct = [0, 0]  # distinct keys the scratch tables saw last
        self._scratch: dict[str, npt.NDArray[np.int64]] = {}
        self.samples_seen = 0
        self.batches_seen = 0

    # ----- keys ----------------------------------------------------------------
    def local_ids(
        self, keys: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(local id of every key, the batch's distinct keys in first-occurrence order).

        A big batch is numbered in two halves at once, then the second half's numbers
        are joined to the first's (``kernels.merge_local_ids``)."""
        n = keys.shape[0]
        lids = self.scratch("lids", n)
        if n < PARALLEL_KEYS:
            uniq, slots = self._number(0, keys, lids, 0)
            kernels.clear_slots(self._local[0], slots)
            return lids, uniq
        half = n // 2
        self._size_local(0)
        self._size_local(1)
        tables = self._local
        (first, first_slots), (second, second_slots) = run_pieces([
            partial(kernels.local_ids, keys[:half], tables[0], lids, 0),
            partial(kernels.local_ids, keys[half:], tables[1], lids, half),
        ])  # fmt: skip
        if not first.shape[0]:  # a half overflowed its table: number it here, with room
            first, first_slots = self._number(0, keys[:half], lids, 0)
        else:
            self._distinct[0] = first.shape[0]
        if second.shape[0]:
            self._distinct[1] = second.shape[0]
        else:
            second, second_slots = self._number(1, keys[half:], lids, half)
        kernels.clear_slots(self._local[1], second_slots)
        uniq = kernels.merge_local_ids(self._local[0], first, second, lids, half)
        kernels.clear_slots(self._local[0], first_slots)
        return lids, uniq

    def _size_local(self, which: int) -> None:
        """Scratch table ``which`` at load about 1/3 for as many keys as it saw last
        (kept while within 2x of that)."""
        want = max(_MIN_TABLE, _pow2_at_least(3 * self._distinct[which]))
        if not want // 2 <= self._local[which].shape[0] <= 2 * want:
            self._local[which] = _empty_local(want)

    def _number(
        self, which: int, keys: npt.NDArray[np.int64], lids: npt.NDArray[np.int64], start: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``kernels.local_ids`` on scratch table ``which`` (:meth:`_size_local`), doubled
        until the keys fit."""
        self._size_local(which)
        while True:
            uniq, slots = kernels.local_ids(keys, self._local[which], lids, start)
            if uniq.shape[0] or not keys.shape[0]:
                break
            self._local[which] = _empty_local(2 * self._local[which].shape[0])
        self._distinct[which] = uniq.shape[0]
        return uniq, slots

    def key_rows(self, uniq: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """``info`` rows (``kernels.KID``, ``KEY``, ``HOLDERS``, ``TRAINERS`` = 0) of the
        batch's distinct keys, registering new keys (kids in first-occurrence order).

        Looked up in two halves at once for a big batch (one compiled call each); the
        keys not found are then inserted on this thread, the only one that changes the
        index."""
        nb = uniq.shape[0]
        info = self.scratch("info", 4 * nb).view(np.uint64).reshape(nb, 4)
        if nb < PARALLEL_KEYS:  # one thread: register and look up in one pass
            known = len(self.index)
            kids = self.index.insert(uniq)
            self._register(known, uniq[kids >= known] if len(self.index) > known else uniq[:0])
            kernels.rows_of_kids(kids, uniq, self.holders, info)
            return info
        slots, holders = self.index.slots, self.holders
        bounds = np.linspace(0, nb, PIECES + 1).astype(int).tolist()
        run_pieces([
            partial(kernels.key_rows, slots, uniq, holders, info, a, b)
            for a, b in itertools.pairwise(bounds)
        ])  # fmt: skip
        missing = np.flatnonzero(info[:, kernels.KID].view(np.int64) < 0)
        if missing.shape[0]:
            known = len(self.index)
            new_keys = uniq[missing]
            fresh = self.index.insert(new_keys)
            self._register(known, new_keys)
            info[missing, kernels.KID] = fresh.astype(np.uint64)
        return info

    def _register(self, known: int, new_keys: npt.NDArray[np.int64]) -> None:
        """Records for the keys the index just numbered ``known..``, in that order."""
        n = known + new_keys.shape[0]
        if not new_keys.shape[0]:
            return
        if n > self._records.shape[0]:
            self._set_records(hostmem.grown(self._records, max(n, 2 * self._records.shape[0])))
        self.key[known:n] = new_keys
        self.dirty_owner[known:n] = -1

    def _set_records(self, records: npt.NDArray[np.int64]) -> None:
        self._records = records
        self.holders = records.view(np.uint64)[:, 0]
        self.dirty_owner, self.key = records[:, 1], records[:, 2]

    def scratch(self, name: str, size: int) -> npt.NDArray[np.int64]:
        """A per-batch working array of ``size`` int64 (contents undefined), reused from
        batch to batch: a fresh array of megabytes would page-fault on every batch. Only
        for arrays no plan keeps."""
        buffer = self._scratch.get(name)
        if buffer is None or buffer.shape[0] < size:
            buffer = hostmem.zeros((max(size, 2 * (0 if buffer is None else buffer.shape[0])),),
                                   np.int64)  # fmt: skip
            self._scratch[name] = buffer
        return buffer[:size]

    # ----- room ----------------------------------------------------------------
    def reserve(self, wl_offsets: npt.NDArray[np.int64]) -> None:
        """Room in every worker's queue for its whole mini-batch (``wl_offsets`` bounds)."""
        need = np.diff(wl_offsets)
        over = np.flatnonzero(self.queue_tail + need > self.queue.shape[1])
        if over.shape[0]:
            for w in over.tolist():
                kernels.compact_queue(
                    w, self.queue, self.queue_head, self.queue_tail, self.tables[w]
                )
            live = int((self.queue_tail[over] + need[over]).max())
            if 2 * live > self.queue.shape[1]:  # keep compactions at least a half queue apart
                length = max(2 * live, _MIN_ROWS)  # live <= 2 x capacity
                queue = hostmem.zeros((self.num_workers, length), np.int32)
                queue[:, : self.queue.shape[1]] = self.queue
                self.queue = queue

    def fresh_tables(self, need: npt.NDArray[np.int64]) -> None:
        """Allocate a doubled position table (in ``self.fresh``) for every worker whose load
        could pass its threshold in this batch (``need[w]``: keys worker w touches); the
        cache pass moves the entries on the thread that runs the worker."""
        entries = self.used + need
        grow = np.flatnonzero(entries > self._thresholds * self.table_sizes)
        for w in grow.tolist():
            size = int(self.table_sizes[w])
            while entries[w] > self._thresholds[w] * size:
                size *= 2
            self.fresh[w] = hostmem.zeros((size,), np.int64)  # filled by the kernel
            self.table_sizes[w] = size

    # ----- checkpoints -----------------------------------------------------------
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
