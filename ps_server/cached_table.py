"""One embedding table of a Cached-PS shard: rows in LMDB, hot rows in host memory.

The same request semantics as :class:`~ps_server.table.StagedTable` (the
servicer cannot tell them apart). Reads go cache -> LMDB -> initializer (a
key never seen is created on first touch, deterministically, as on the
Staged-PS); every change is written through to LMDB inside the caller's
write transaction, so the cache only ever holds clean rows. Gradient
buffers of uncommitted iterations live in memory, as on the Staged-PS: a
crash loses only gradients whose iteration was never committed.

Locking: the shard store holds its write lock (one LMDB writer at a time)
before it takes a table lock, for every change; reads take the table lock
and a read transaction.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.keyindex import distinct
from heraldps.optim import Optimizer, scaled
from heraldps.spec import TableSpec, UpdateMode
from ps_server.checks import (
    COMMIT_HINT,
    check_finite_rows,
    check_push_iteration,
    check_versions_unchanged,
    check_write_back,
)
from ps_server.grad_buffer import GradBuffer
from ps_server.kernels import copy_clocks, copy_rows
from ps_server.lmdb_rows import LmdbRows
from ps_server.memory import MemoryBudget
from ps_server.row_cache import RowCache, capacity_for
from ps_server.table import RowBlock, paced_steps, sum_duplicates


@dataclass
class CachePolicy:
    """Per-table host cache settings (HugeCTR's HMEM-cache knobs, see row_cache.py)."""

    cache_bytes: int
    target_hit_rate: float = 1.0
    max_num_evict: int = -1


@dataclass
class _Rows:
    """Working copies of rows (cache, disk or fresh), in the order of ``keys``."""

    keys: npt.NDArray[np.int64]
    slots: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    state: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int64]
    changed: npt.NDArray[np.int64]


class CachedTable:
    """LMDB-backed rows of one table on one shard, with a host cache in front."""

    def __init__(
        self,
        spec: TableSpec,
        env: Any,
        policy: CachePolicy,
        committed_iteration: int,
        copier: Executor,
        budget: MemoryBudget,
        txn: Any = None,
    ) -> None:
        """``copier``: the shard's helper threads that copy cache hits while this
        thread reads misses from LMDB (shared: a thread per table would cost
        every table a stack). ``budget``: the shard's memory budget, which the
        store charged for the cache already; the table charges its gradient
        buffers."""
        self.spec = spec
        self.dim = spec.dim
        self.state_width = spec.state_width
        self.lock = threading.Lock()
        self.committed_iteration = committed_iteration
        self.env = env
        self.disk = LmdbRows(env, spec.name, self.dim, self.state_width, txn)
        capacity = capacity_for(policy.cache_bytes, self.dim, self.state_width)
        self.cache = RowCache(
            capacity, self.dim, self.state_width, policy.target_hit_rate, policy.max_num_evict
        )
        self._buffers: dict[int, GradBuffer] = {}
        self._budget = budget
        self._buffered = 0  # bytes of gradient buffers charged to the budget
        self._copier = copier

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def row_bytes(self) -> int:
        return 24 + 4 * (self.dim + self.state_width)

    @property
    def rows(self) -> int:
        """Rows on disk plus rows created by a pull and still only cached."""
        with self.env.begin() as txn:
            on_disk = self.disk.count(txn)
        return on_disk + self.cache.fresh_rows

    @property
    def empty(self) -> bool:
        """No row on disk or in the cache, no gradient buffered: dropping loses nothing."""
        return not self.rows and not self._buffers

    @property
    def nbytes(self) -> int:
        """Host memory: the cache arrays and the gradient buffers (disk is not counted)."""
        return self.cache.nbytes + sum(b.nbytes for b in self._buffers.values())

    # ----- reading --------------------------------------------------------------
    def _read(self, keys: npt.NDArray[np.int64], txn: Any = None, admit: bool = True) -> _Rows:
        """Rows of distinct ``keys``: cached ones from memory, the rest from disk or fresh."""
        n = keys.shape[0]
        slots = self.cache.lookup(keys)
        hit = slots >= 0
        rows = _Rows(
            keys,
            slots,
            np.empty((n, self.dim), np.float32),
            np.empty((n, self.state_width), np.float32),
            np.empty(n, np.int64),
            np.empty(n, np.int64),
        )
        c = slots[hit]
        positions = np.arange(n, dtype=np.int64)
        to = np.where(hit, positions, -1)  # hits copy from their cache slot, in one pass
        miss = np.flatnonzero(~hit)
        if not miss.shape[0]:
            self._copy_hits(rows, to, slots)
            return rows
        # The hit copies (compiled, GIL released) run on a helper thread while this
        # thread reads the misses from LMDB (py-lmdb holds the GIL): the two overlap.
        copying = self._copier.submit(self._copy_hits, rows, to, slots) if c.shape[0] else None
        missed = keys[miss]
        try:
            if txn is None:
                with self.env.begin() as read_txn:
                    disk = self.disk.get(read_txn, missed)
            else:
                disk = self.disk.get(txn, missed)
        finally:
            if copying is not None:
                copying.result()
        fresh = ~disk.found
        if np.any(fresh):
            disk.values[fresh] = self.spec.initializer.generate(missed[fresh], self.dim)
            disk.state[fresh] = self.spec.optimizer.init_state(int(fresh.sum()), self.dim)
        if miss.shape[0] == n:  # nothing was cached: the disk rows are the answer
            rows.values, rows.state = disk.values, disk.state
            rows.versions, rows.changed = disk.versions, disk.changed
        else:
            copy_rows(rows.values, miss, disk.values, positions)
            copy_rows(rows.state, miss, disk.state, positions)
            rows.versions[miss], rows.changed[miss] = disk.versions, disk.changed
        if admit:
            admitted = self.cache.admit(missed, float(hit.mean()) if n else 1.0, keep=c)
            self.cache.store(
                admitted, disk.values, disk.state, disk.versions, disk.changed, disk.found
            )
            rows.slots[miss] = admitted
        return rows

    def _copy_hits(
        self, rows: _Rows, to: npt.NDArray[np.int64], slots: npt.NDArray[np.int64]
    ) -> None:
        copy_rows(rows.values, to, self.cache.values, slots)
        copy_rows(rows.state, to, self.cache.state, slots)
        copy_clocks(rows.versions, rows.changed, to, self.cache.versions, self.cache.changed, slots)

    def pull(self, keys: npt.NDArray[np.int64], with_state: bool) -> RowBlock:
        with self.lock:
            unique, inverse = distinct(keys)
            rows = self._read(unique)
            if unique.shape[0] == keys.shape[0]:  # distinct request: already in its order
                state = rows.state if with_state else np.empty((keys.shape[0], 0), np.float32)
                return RowBlock(keys, rows.values, state, rows.versions, rows.changed)
            state = rows.state[inverse] if with_state else np.empty((keys.shape[0], 0), np.float32)
            return RowBlock(
                keys, rows.values[inverse], state, rows.versions[inverse], rows.changed[inverse]
            )

    def pull_into(
        self,
        keys: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        versions: npt.NDArray[np.int64],
        state: npt.NDArray[np.float32],
    ) -> None:
        """:meth:`pull` copied into the caller's arrays (a response message's payloads)."""
        block = self.pull(keys, state.shape[1] > 0)
        values[...] = block.values
        versions[...] = block.versions
        state[...] = block.state

    def versions(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        with self.lock:
            unique, inverse = distinct(keys)
            return self._read(unique, admit=False).versions[inverse]

    def prefetch(self, keys: npt.NDArray[np.int64]) -> int:
        """Load rows of ``keys`` into the cache ahead of a pass; return how many are cached."""
        with self.lock:
            unique = distinct(keys)[0]
            slots = self._read(unique).slots
            return int(np.count_nonzero(slots >= 0))

    # ----- writing (caller holds the store's write lock and passes its transaction) ----
    def _write(self, txn: Any, rows: _Rows) -> None:
        """Put ``rows`` on disk in ``txn``; cached copies are refreshed after the commit."""
        self.disk.put(txn, rows.keys, rows.versions, rows.changed, rows.values, rows.state)

    def _refresh_cache(self, rows: _Rows) -> None:
        slots = self.cache.lookup(rows.keys)
        self.cache.store(slots, rows.values, rows.state, rows.versions, rows.changed, True)

    def push(
        self,
        iteration: int,
        keys: npt.NDArray[np.int64],
        grads: npt.NDArray[np.float32],
        txn_factory: Any,
        steps: npt.NDArray[np.int32] | None = None,
        worker: int = 0,
    ) -> bool:
        """Buffer gradients for ``iteration``; an immediate table writes through at once.
        ``steps``: optimizer steps each gradient row stands for (None: 1 each);
        ``worker``: who pushed (a commit adds workers' sums in worker order)."""
        with self.lock:
            if self.spec.update_mode is UpdateMode.IMMEDIATE:
                unique, summed, unique_steps = sum_duplicates(keys, grads, steps)
                rows = self._read(unique, admit=False)
                at = np.arange(unique.shape[0])
                self._apply(
                    rows,
                    at,
                    summed,
                    self.committed_iteration + 1,
                    unique_steps,
                    self.spec.optimizer,
                )
                check_finite_rows(self.name, "push", rows.keys, rows.values, rows.state)
                with txn_factory() as txn:
                    self._write(txn, rows)
                self._refresh_cache(rows)
                return True
            check_push_iteration(self.name, iteration, self.committed_iteration)
            buffer = self._buffers.get(iteration) or GradBuffer(self.dim)
            growth = buffer.growth(keys, worker)[0]
            what = f"push of {keys.shape[0]} gradients to {self.name!r}"
            self._budget.charge(growth, what)
            self._buffered += growth
            buffer.add(keys, grads, steps, worker)
            self._buffers[iteration] = buffer
            self._account_buffers()
            return False

    def _account_buffers(self) -> None:
        """Charge the buffers' exact bytes (a push charged its estimate first)."""
        exact = sum(b.nbytes for b in self._buffers.values())
        self._budget.adjust(exact - self._buffered)
        self._buffered = exact

    def _apply(
        self,
        rows: _Rows,
        at: npt.NDArray[np.int64],
        grads: npt.NDArray[np.float32],
        it: int,
        steps: npt.NDArray[np.int32] | None,
        optimizer: Optimizer,
    ) -> None:
        values, state = rows.values[at], rows.state[at]
        with np.errstate(over="ignore", invalid="ignore"):  # checked before it is written
            optimizer.apply_steps(values, state, grads, steps)
        rows.values[at], rows.state[at] = values, state
        rows.versions[at] += 1
        rows.changed[at] = it

    def prepare_commit(
        self, iteration: int, txn: Any, lr_scale: float = 1.0
    ) -> tuple[_Rows | None, list[int], int]:
        """Apply every buffer <= ``iteration`` (the optimizer's lr times ``lr_scale``) to
        working copies and put them in ``txn``.

        Nothing in memory changes until :meth:`finish_commit`, so a failed
        transaction leaves the table as it was. Caller holds ``self.lock``.
        """
        its = sorted(i for i in self._buffers if i <= iteration)
        if not its:
            return None, its, 0
        contents = [self._buffers[it].contents() for it in its]
        union, inverse = distinct(np.concatenate([k for k, _, _ in contents]))
        rows = self._read(union, txn=txn, admit=False)
        optimizer = scaled(self.spec.optimizer, lr_scale)
        start = 0
        for it, (keys, grads, steps) in zip(its, contents, strict=True):
            at = inverse[start : start + keys.shape[0]]
            self._apply(rows, at, grads, it, paced_steps(steps, it, rows.changed[at]), optimizer)
            start += keys.shape[0]
        what = f"commit of iteration {its[-1]}"
        check_finite_rows(self.name, what, union, rows.values, rows.state, COMMIT_HINT)
        self._write(txn, rows)
        return rows, its, start

    def finish_commit(self, iteration: int, rows: _Rows | None, its: list[int]) -> None:
        """The transaction is durable: drop the applied buffers, refresh cached copies."""
        for it in its:
            del self._buffers[it]
        if its:
            self._account_buffers()
        self.committed_iteration = max(self.committed_iteration, iteration)
        if rows is not None:
            self._refresh_cache(rows)

    def write_back(
        self,
        keys: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        state: npt.NDArray[np.float32],
        base_versions: npt.NDArray[np.int64],
        new_versions: npt.NDArray[np.int64],
        txn_factory: Any,
    ) -> None:
        check_write_back(keys, base_versions, new_versions)
        with self.lock:
            stored = self._read(keys, admit=False).versions
            check_versions_unchanged(self.name, keys, stored, base_versions)
            n = keys.shape[0]
            rows = _Rows(
                keys, np.full(n, -1, np.int64), values, state, new_versions,
                np.full(n, self.committed_iteration + 1, np.int64),
            )  # fmt: skip
            with txn_factory() as txn:
                self._write(txn, rows)
            self._refresh_cache(rows)

    # ----- export and snapshots -------------------------------------------------
    def export(self, since_iteration: int) -> RowBlock:
        """Rows changed after ``since_iteration`` (every row when it is negative)."""
        with self.lock, self.env.begin() as txn:
            keys, disk = self.disk.scan(txn)
            if since_iteration >= 0:
                pick = disk.changed > since_iteration
                return RowBlock(keys[pick], disk.values[pick], disk.state[pick],
                                disk.versions[pick], disk.changed[pick])  # fmt: skip
            # Every row: also those created by a pull and so far only cached.
            c = self.cache.fresh_slots()
            return RowBlock(
                np.concatenate([keys, self.cache.keys[c]]),
                np.concatenate([disk.values, self.cache.values[c]]),
                np.concatenate([disk.state, self.cache.state[c]]),
                np.concatenate([disk.versions, self.cache.versions[c]]),
                np.concatenate([disk.changed, self.cache.changed[c]]),
            )

    def snapshot(self) -> RowBlock:
        return self.export(-1)

    def load_rows(self, block: RowBlock, txn: Any) -> None:
        """Replace every row with ``block`` inside ``txn`` (snapshot load); cache emptied."""
        with self.lock:
            self.disk.clear(txn)
            self.disk.put(txn, block.keys, block.versions, block.changed, block.values,
                          block.state)  # fmt: skip
            self.cache.clear()
