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
- A worker's ring holds at most ``capacity`` kids (4 bytes each); it starts at
  1,024 entries and doubles when the keys it caches would not fit, on the thread
  that runs the worker.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import numpy.typing as npt
from numba.typed import List

from heraldps import hostmem
from heraldps.errors import InvalidArgument
from heraldps.keyindex import KeyIndex
from heraldps.modes import MAX_WORKERS
from scheduler_service import kernels
from scheduler_service.split import HELPER

MAX_CAPACITY = 2**30  # rows per worker cache: a ring of int32 kids of this size is 4 GiB
_MIN_ROWS = 1024
_MIN_TABLE = 1024
_MIN_RING = 1024
PARALLEL_KEYS = 65_536  # batches with fewer key occurrences are numbered on one thread alone
NUMBER_CHUNKS = 8  # chunks a big batch is numbered in, the helper reading each one's records


def _empty_local(size: int) -> npt.NDArray[np.int64]:
    """A batch's scratch (key, generation << 32 | lid) table, all slots of generation 0
    (empty); big ones on huge pages (``heraldps.hostmem``)."""
    return hostmem.zeros((size, 2), np.int64)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


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
        self.rings = List([np.zeros(_MIN_RING, np.int32) for _ in range(num_workers)])
        self.heads = np.zeros(num_workers, np.int64)
        self.used = np.zeros(num_workers, np.int64)
        self._local = _empty_local(_MIN_TABLE)
        self._distinct = 0  # distinct keys the scratch table saw last
        self._gen = 0  # generation of the scratch table's live entries (0: none)
        self._scratch: dict[str, npt.NDArray[np.int64]] = {}
        self.samples_seen = 0
        self.batches_seen = 0
        self.forgotten = 0  # keys dropped because no cache held them any more

    # ----- keys ----------------------------------------------------------------
    def number_and_read(self, keys: npt.NDArray[np.int64], parallel: bool) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]
    ]:  # fmt: skip
        """(local id of every key; the ``info`` rows (``kernels.KID``, ``KEY``,
        ``HOLDERS``) of the batch's distinct keys in first-occurrence order; ``hold``, a
        compact copy of the HOLDERS column for the partition). New keys are registered
        (kids in first-occurrence order, or forgotten ones reused).

        The keys are numbered chunk by chunk on this thread; when ``parallel`` (a core is
        idle) the helper reads the records of the keys each chunk found while this thread
        numbers the next (numbering the keys in two halves at once and joining them, or
        reading records in pieces, cost more than it saved on our 2-core VM). The records
        are read in chunk order, by one thread at a time, the only one that changes the
        index; a chunk the helper has not started when the numbering ends is read here."""
        n = keys.shape[0]
        lids = self.scratch("lids", n)
        uniq = self.scratch("uniq", n)
        fields = kernels.INFO_FIELDS
        info = self.scratch("info", fields * n).view(np.uint64).reshape(n, fields)
        hold = self.scratch("hold", n).view(np.uint64)
        self._gen += 1  # the scratch table's old entries now count as empty
        if self._gen == 2**31:  # generations wrap: clear the table once
            self._local = _empty_local(self._local.shape[0])
            self._gen = 1
        want = max(_MIN_TABLE, _pow2_at_least(3 * self._distinct))
        if not want // 2 <= self._local.shape[0] <= 2 * want:  # load about 1/3, kept in 2x
            self._local = _empty_local(want)
        pipelined = parallel and n >= PARALLEL_KEYS
        bounds = np.linspace(0, n, (NUMBER_CHUNKS if pipelined else 1) + 1).astype(int).tolist()
        found = [0] * len(bounds)  # distinct keys numbered by the end of each chunk
        lock = threading.Lock()
        claimed = [False] * (len(bounds) - 1)
        done = [threading.Event() for _ in claimed]
        numbered = [threading.Event() for _ in claimed]

        def claim(c: int) -> bool:
            with lock:
                mine, claimed[c] = not claimed[c], True
            return mine

        def read(c: int) -> None:
            if c:
                done[c - 1].wait()
            numbered[c].wait()
            self._read_rows(uniq, info, hold, found[c], found[c + 1])
            done[c].set()

        def helper(c: int) -> None:
            if claim(c):
                read(c)

        nb = 0
        for c, (a, b) in enumerate(itertools.pairwise(bounds)):
            got = kernels.local_ids(keys, a, b, self._local, self._gen, lids, uniq, nb)
            while got < 0:  # table full: renumber from the start on a table twice the size
                self._local = _empty_local(2 * self._local.shape[0])
                got = kernels.local_ids(keys, 0, b, self._local, self._gen, lids, uniq, 0)
            nb = found[c + 1] = int(got)
            numbered[c].set()
            if pipelined:
                HELPER.submit(helper, c)
        for c in range(len(claimed)):
            if claim(c):
                read(c)
            else:
                done[c].wait()
        self._distinct = nb
        return lids, info[:nb], hold[:nb]

    def _read_rows(
        self, uniq: npt.NDArray[np.int64], info: npt.NDArray[np.uint64],
        hold: npt.NDArray[np.uint64], a: int, b: int,
    ) -> None:  # fmt: skip
        """``info`` and ``hold`` rows of the distinct keys ``uniq[a:b]``: one insert pass
        over the index, then one pass over the records."""
        added = np.zeros(b - a, dtype=bool)
        kids = self.index.insert(uniq[a:b], added)
        self._reserve_records()
        kernels.rows_of_kids(kids, uniq[a:b], added, self.holders, self.key_of, info[a:b],
                             hold[a:b])  # fmt: skip

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

    def cached_keys(self, worker: int) -> npt.NDArray[np.int64]:
        """The keys ``worker`` caches, from the head of its ring (next to come round)."""
        ring = self.rings[worker]
        n, head = int(self.used[worker]), int(self.heads[worker])
        positions = (head + np.arange(n)) & (ring.shape[0] - 1)
        keys: npt.NDArray[np.int64] = self.key_of[ring[positions].astype(np.int64)]
        return keys
