"""The scheduler's exact model of every worker's cache (Herald section 3.2).

Every key the scheduler has seen gets a dense id (``kid``, in order of first
sight), its key (``key_of``) and one record of four 64-bit words (32 bytes, one
cache line access; ``kernels.R_HOLDERS`` ...):

==============  ====================================================
word            meaning
==============  ====================================================
``HOLDERS``     bit w: worker w holds a *valid* (latest) copy
``CACHED``      bit w: worker w caches the key (valid or stale)
``REFERENCED``  bit w: w used the key since its ring entry last came round
``META``        the worker whose copy is newer than the PS's (plus one; 0 none)
                above bit 32; below, the key's lid in the batch that last had it
==============  ====================================================

Each worker's cache is a CLOCK (second chance), the O(1) approximation of LRU
that operating systems use for their page caches: a ring of the kids it caches,
in the order they came in. To make room, the head is taken: a key the worker
trains in the current batch, or one it has used since its entry last came round
(its REFERENCED bit; the bit is cleared), goes round again to the tail; any other
is evicted. New keys join at the tail. A worker's whole cache state is its ring
and its bits in the records: no per-(key, worker) index, so a batch costs one
record access per distinct key plus sequential ring and list writes per
(key, worker) pair (docs/scheduler.md#the-cache-mirror says why not exact LRU).

Capacity and growth (what the job knows sizes the structures up front):

- ``expected_keys`` (the job's keyset size or a first pass's distinct-key count;
  0 when unknown), capped at what the caches can hold (workers x capacity, plus an
  eighth for a batch's new keys), sizes the key index and the records, so a run that
  sees no more keys never rehashes or copies them. Past it, both double (one O(keys) copy each,
  amortized O(1) per key).
- A key no worker caches any more is forgotten (``forget``): index entry and record
  go, and a new key reuses its kid. The mirror holds the keys the caches hold, plus
  one batch's, whatever the vocabulary.
- Records live on a lazily committed mapping (``heraldps.hostmem``): reserving
  rows costs no memory until a key takes them.
- A worker's ring holds at most ``capacity`` kids (4 bytes each); it is reserved
  for the whole cache up front (at most ``RING_RESERVE`` entries; lazily committed),
  and only a bigger cache's ring doubles when the keys it caches would not fit, on
  the thread that runs the worker.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba.typed import List

from heraldps import hostmem
from heraldps.errors import InvalidArgument
from heraldps.keyindex import KeyIndex
from heraldps.modes import MAX_WORKERS
from scheduler_service import kernels

MAX_CAPACITY = 2**30  # rows per worker cache: a ring of int32 kids of this size is 4 GiB
_MIN_ROWS = 1024
_MIN_TABLE = 1024
RING_RESERVE = 2**22  # entries per worker ring reserved (lazily) before any growth


def _empty_local(size: int) -> npt.NDArray[np.int64]:
    """A batch's scratch (key, generation << 32 | lid) table, all slots of generation 0
    (empty); big ones on huge pages (``heraldps.hostmem``)."""
    return hostmem.zeros((size, 2), np.int64)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class Numbering:
    """One batch's keys numbered 0..nb-1 in first-occurrence order (local ids, ``lids``),
    and the rows of its distinct keys: ``info`` (``kernels.KID``, ``KEY``, ``HOLDERS``),
    ``hold`` (a compact copy of the HOLDERS column) and ``held`` (1 where some worker holds
    the key), all valid for ``[:nb]``.

    :meth:`number` numbers a range of key occurrences, after the ranges before it;
    :meth:`read` reads the records of a range of distinct keys (registering new keys:
    kids in first-occurrence order, or forgotten ones reused), ranges in order, one
    thread at a time (the only one that changes the index). The two may run at once on
    different ranges, so one thread numbers while another reads what was found."""

    def __init__(self, mirror: CacheMirror, keys: npt.NDArray[np.int64]) -> None:
        n = keys.shape[0]
        self._mirror = mirror
        self.keys = keys
        self.lids = mirror.scratch("lids", n)
        self.uniq = mirror.scratch("uniq", n)
        fields = kernels.INFO_FIELDS
        self.info = mirror.scratch("info", fields * n).view(np.uint64).reshape(n, fields)
        self.hold = mirror.scratch("hold", n).view(np.uint64)
        self.held = mirror.scratch("held", (n + 7) // 8).view(np.uint8)[:n]
        self.nb = 0

    def number(self, a: int, b: int) -> int:
        """Number occurrences ``a..b-1`` (after ``0..a-1``); returns the distinct keys so
        far. A full scratch table is replaced by one twice the size and every occurrence
        up to ``b`` numbered again: the same numbers, so readers of earlier ranges may
        run meanwhile."""
        mirror = self._mirror
        got = kernels.local_ids(self.keys, a, b, mirror._local, mirror._gen, self.lids,
                                self.uniq, self.nb)  # fmt: skip
        while got < 0:
            mirror._local = _empty_local(2 * mirror._local.shape[0])
            got = kernels.local_ids(self.keys, 0, b, mirror._local, mirror._gen, self.lids,
                                    self.uniq, 0)  # fmt: skip
        self.nb = mirror._distinct = int(got)
        return self.nb

    def read(self, lo: int, hi: int) -> None:
        """The rows of distinct keys ``lo..hi-1`` (after ``0..lo-1``)."""
        self._mirror._read_rows(self.uniq[lo:hi], self.info[lo:hi], self.hold[lo:hi],
                                self.held[lo:hi])  # fmt: skip


class CacheMirror:
    """Which rows every worker caches, in which CLOCK order, valid or dirty."""

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
        # The mirror never holds more keys than the caches can (plus a batch's: an eighth
        # more), whatever the data's vocabulary: a hint past that would only waste index.
        sized = min(expected_keys, num_workers * capacity + num_workers * capacity // 8)
        self.index = KeyIndex(sized)
        rows = max(sized, _MIN_ROWS)
        records = hostmem.zeros((rows, kernels.RECORD_FIELDS), np.uint64)
        self._set_records(records, hostmem.zeros((rows,), np.int64))
        # Room for the whole cache up front, committed only as entries are written: rings
        # that doubled as they filled made every worker copy its ring in the same batch.
        ring = min(_pow2_at_least(capacity), RING_RESERVE)
        self.rings = List([hostmem.zeros((ring,), np.int32) for _ in range(num_workers)])
        self.heads = np.zeros(num_workers, np.int64)
        self.used = np.zeros(num_workers, np.int64)
        self._local = _empty_local(_MIN_TABLE)
        self._distinct = 0  # distinct keys the scratch table saw last
        self._gen = 0  # generation of the scratch table's live entries (0: none)
        self._scratch: dict[str, npt.NDArray[np.int64]] = {}
        self._mark_array = np.zeros(0, bool)  # see _marks
        self.samples_seen = 0
        self.batches_seen = 0
        self.forgotten = 0  # keys dropped because no cache held them any more

    # ----- keys ----------------------------------------------------------------
    def numbering(self, keys: npt.NDArray[np.int64]) -> Numbering:
        """A new batch's numbering (:class:`Numbering`): its keys get local ids chunk by
        chunk, its distinct keys their records."""
        self._gen += 1  # the scratch table's old entries now count as empty
        if self._gen == 2**31:  # generations wrap: clear the table once
            self._local = _empty_local(self._local.shape[0])
            self._gen = 1
        want = max(_MIN_TABLE, _pow2_at_least(3 * self._distinct))
        if not want // 2 <= self._local.shape[0] <= 2 * want:  # load about 1/3, kept in 2x
            self._local = _empty_local(want)
        return Numbering(self, keys)

    def _read_rows(
        self, uniq: npt.NDArray[np.int64], info: npt.NDArray[np.uint64],
        hold: npt.NDArray[np.uint64], held: npt.NDArray[np.uint8],
    ) -> None:  # fmt: skip
        """``info``, ``hold`` and ``held`` rows of the distinct keys ``uniq``, registering
        the new ones: one insert pass over the index, then one pass over the records."""
        added = np.zeros(uniq.shape[0], dtype=bool)
        kids = self.index.insert(uniq, added)
        self._reserve_records()
        kernels.rows_of_kids(kids, uniq, added, self.holders, self.key_of, info, hold, held)

    def _reserve_records(self) -> None:
        """Records (and keys) for every kid the index has handed out; they double."""
        rows = self.index.rows
        if rows > self.records.shape[0]:
            rows = max(rows, 2 * self.records.shape[0])
            self._set_records(hostmem.grown(self.records, rows), hostmem.grown(self.key_of, rows))

    def forget(self, kids: npt.NDArray[np.int64]) -> None:
        """Drop keys no worker caches any more (their last copy was just evicted, so they
        are clean and held nowhere): their index entries and records go, and new keys
        reuse their kids. So the mirror holds the keys the caches hold (plus a batch), not
        every key it has seen."""
        self.index.remove(self.key_of[kids])
        self.records[kids] = 0
        self.forgotten += kids.shape[0]

    def _set_records(self, records: npt.NDArray[np.uint64], key_of: npt.NDArray[np.int64]) -> None:
        self.records = records
        self.flat = records.reshape(-1)  # the same memory, for the atomic bit clears
        self.holders = records[:, kernels.R_HOLDERS]
        self.key_of = key_of

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

    # ----- state for checkpoints and tests ----------------------------------------
    def dirty_owners(self) -> npt.NDArray[np.int64]:
        """The worker holding each kid's row dirty (-1: none), kids ``0..index.rows-1``."""
        meta = self.records[: self.index.rows, kernels.R_META]
        return (meta >> np.uint64(32)).astype(np.int64) - 1

    def dirty_rows(self) -> int:
        return int((self.dirty_owners() >= 0).sum())

    def take_dirty(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(owner, key) of every dirty row, now marked clean: its owner writes it back at a
        checkpoint and keeps it cached, the valid copy it was (holders do not change)."""
        owners = self.dirty_owners()
        kids = np.flatnonzero(owners >= 0)
        self.records[kids, kernels.R_META] &= kernels.LID_BITS
        return owners[kids], self.key_of[kids].copy()

    def take_idle_dirty(
        self,
        examine: npt.NDArray[np.int64],
        info: npt.NDArray[np.uint64],
        window: npt.NDArray[np.int64],
        trained: npt.NDArray[np.int64],
        limit: int | None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(owner, key) of up to ``limit`` (None: every) dirty rows per worker among the
        kids ``examine`` that no worker uses in the batch of ``info`` nor in the batches
        behind it (``window``: the slot table of ``window.Window``) and that are not in
        ``trained`` (updated in the iteration before it), now marked clean: written back
        early, each stays cached at its owner as the valid copy it is (holders do not
        change), so its next local use needs no pull and a later update makes it dirty
        again (docs/scheduler.md#early-write-backs). With a limit, each worker's lowest
        keys go first. Third: the kids to examine next time (still dirty, or in
        ``trained``). Linear in ``examine`` and ``trained`` (``kernels.idle_dirty``)."""
        size = int(max(examine.max(initial=-1), trained.max(initial=-1))) + 1
        owners, keys, kids, left = kernels.idle_dirty(
            self.records,
            self.key_of,
            info,
            window,
            examine,
            trained,
            self._marks(size),
            limit is None,
        )
        if limit is None:
            return owners, keys, np.concatenate([left, trained])
        if owners.shape[0]:
            order = np.lexsort((keys, owners))
            own = owners[order]
            rank = np.arange(own.shape[0]) - np.searchsorted(own, own, side="left")
            keep, later = order[rank < limit], order[rank >= limit]
            left = np.concatenate([left, kids[later]])
            owners, keys, kids = owners[keep], keys[keep], kids[keep]
        self.records[kids, kernels.R_META] &= kernels.LID_BITS
        return owners, keys, np.concatenate([left, trained])

    def _marks(self, size: int) -> npt.NDArray[np.bool_]:
        """A kid-indexed array of False, at least ``size`` long; callers set marks and
        clear them again before they return."""
        if self._mark_array.shape[0] < size:
            self._mark_array = np.zeros(max(size, 2 * self._mark_array.shape[0]), bool)
        return self._mark_array

    def cached_keys(self, worker: int) -> npt.NDArray[np.int64]:
        """The keys ``worker`` caches, from the head of its ring (next to come round)."""
        ring = self.rings[worker]
        n, head = int(self.used[worker]), int(self.heads[worker])
        positions = (head + np.arange(n)) & (ring.shape[0] - 1)
        keys: npt.NDArray[np.int64] = self.key_of[ring[positions].astype(np.int64)]
        return keys
