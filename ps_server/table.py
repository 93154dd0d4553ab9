"""One embedding table of a Staged-PS shard, held wholly in host memory.

Rows live in contiguous arrays (values, optimizer state, version, iteration
of last change) that grow without copying (``ps_server.row_arrays``),
addressed through a compiled :class:`~ps_server.row_index.RowIndex`, which
also holds each row's key. Every operation is a handful of vectorized array
calls or compiled loops on a whole request. ``expected_rows`` sizes the index
and reserves the arrays up front, so a table that reaches it never rehashes.
At 50M rows of dim 16 with AdaGrad a row costs about 1.2x its ideal 144 bytes
(docs/figures.md, "The PS at 50M rows").

Locking: every public method takes the table's lock for its whole run, so a
request sees and leaves the table in a consistent state. The shard store
orders locks as ``commit lock -> table lock`` (see ``store.py``).
Validation happens before any mutation; memory is charged to the shard's
:class:`MemoryBudget` before any array grows.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument
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
from ps_server.kernels import gather_pull, gather_records, scatter_add_rows, scatter_records
from ps_server.memory import MemoryBudget
from ps_server.parallel import in_parts
from ps_server.row_arrays import RowArray
from ps_server.row_index import RowIndex

NEVER_CHANGED = -1


@dataclass(frozen=True)
class RowBlock:
    """Rows of one table, in the order of ``keys``."""

    keys: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    state: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int64]
    changed: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def sum_duplicates(
    keys: npt.NDArray[np.int64],
    grads: npt.NDArray[np.float32],
    steps: npt.NDArray[np.int32] | None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int32] | None]:
    """Distinct keys with their summed gradients and largest step counts (an immediate push)."""
    unique, inverse = distinct(keys)
    summed = np.zeros((unique.shape[0], grads.shape[1]), dtype=np.float32)
    scatter_add_rows(summed, inverse, grads)
    if steps is None:
        return unique, summed, None
    most = np.ones(unique.shape[0], dtype=np.int32)
    np.maximum.at(most, inverse, steps)
    return unique, summed, most


def paced_steps(
    steps: npt.NDArray[np.int32], iteration: int, changed: npt.NDArray[np.int64]
) -> npt.NDArray[np.int32]:
    """The steps a committed row takes: at most one per iteration since it last changed
    (at least 1), the pace of synchronous training. Steps beyond that were taken by the
    same iterations of other workers, whose pushes reached an earlier commit."""
    room = np.maximum(iteration - changed, 1)
    return np.minimum(steps, room).astype(np.int32)


@dataclass
class WorkingRows:
    """Copies of rows that a commit or an immediate push updates before it stores them:
    computed whole, checked, and only then written into the table."""

    slots: npt.NDArray[np.int64]  # each key's row in the table, -1: not created yet
    keys: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    state: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int64]
    changed: npt.NDArray[np.int64]
    its: list[int] = field(default_factory=list)  # the iterations a commit applies
    updates: int = 0  # gradient rows a commit applies
    records: npt.NDArray[np.int64] | None = None  # the block the four arrays are views of

    def apply(
        self,
        optimizer: Optimizer,
        at: npt.NDArray[np.int64] | None,
        grads: npt.NDArray[np.float32],
        it: int,
        steps: npt.NDArray[np.int32] | None,
    ) -> None:
        """One iteration's summed gradients on rows ``at`` (distinct; None: every row, in
        order, updated in place without a gather): ``optimizer``, clock +1."""
        if at is None:
            with np.errstate(over="ignore", invalid="ignore"):  # checked before it is stored
                optimizer.apply_steps(self.values, self.state, grads, steps)
            self.versions += 1
            self.changed[:] = it
            return
        values, state = self.values[at], self.state[at]
        with np.errstate(over="ignore", invalid="ignore"):
            optimizer.apply_steps(values, state, grads, steps)
        self.values[at], self.state[at] = values, state
        self.versions[at] += 1
        self.changed[at] = it


class StagedTable:
    """Host-memory rows of one table on one shard, with per-iteration gradient buffers."""

    def __init__(
        self,
        spec: TableSpec,
        budget: MemoryBudget,
        committed_iteration: int,
        expected_rows: int = 0,
    ) -> None:
        """``expected_rows``: rows to size the index and reserve the arrays for (0: grow
        as keys arrive; either way the table holds any number of rows)."""
        self.spec = spec
        self.dim = spec.dim
        self.state_width = spec.state_width
        self.lock = threading.Lock()
        self.committed_iteration = committed_iteration
        self._budget = budget
        self._charged = 0
        self._pending_row_reserve = 0
        self._index = RowIndex(expected_rows)
        # One record per row: version, change mark, values, state (padded to 8 bytes).
        self._words = 2 + (self.dim + self.state_width + 1) // 2
        self._records = RowArray((self._words,), np.int64, expected_rows)
        self._buffers: dict[int, GradBuffer] = {}
        self._account(self._exact_bytes(), "creating the table")

    # Each row is one record (array of structs): a pull or a commit touches one place
    # per row, not one per column, which at 50M rows is 2-3x fewer cache and TLB misses
    # (docs/figures.md, "The PS at 50M rows"). The columns below are strided views of
    # the records, made on each use: the records live in their RowArray only, so a grow
    # can extend the mapping in place. Never keep a view across a call that creates rows.
    def _columns(
        self, records: npt.NDArray[np.int64]
    ) -> tuple[
        npt.NDArray[np.float32],
        npt.NDArray[np.float32],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
    ]:
        """Views of a ``[n, words]`` block of records: values, state, versions, changes."""
        floats = records.view(np.float32)
        state = 4 + self.dim
        return (
            floats[:, 4:state],
            floats[:, state : state + self.state_width],
            records[:, 0],
            records[:, 1],
        )

    @property
    def _values(self) -> npt.NDArray[np.float32]:
        return self._columns(self._records.array)[0]

    @property
    def _state(self) -> npt.NDArray[np.float32]:
        return self._columns(self._records.array)[1]

    @property
    def _versions(self) -> npt.NDArray[np.int64]:
        return self._records.array[:, 0]

    @property
    def _changed(self) -> npt.NDArray[np.int64]:
        return self._records.array[:, 1]

    # ----- sizes and memory -------------------------------------------------
    @property
    def rows(self) -> int:
        return len(self._index)

    @property
    def capacity(self) -> int:
        """Rows the arrays have room for (reserved address space; untouched pages cost
        no memory)."""
        return self._records.capacity

    @property
    def row_bytes(self) -> int:
        """Bytes per row record: version, change mark (int64 each), values and state,
        padded to 8 bytes (the key lives in the index)."""
        return 8 * self._words

    @property
    def nbytes(self) -> int:
        return self._charged

    @property
    def index_bytes(self) -> int:
        """Bytes of the key index alone (all an empty table holds)."""
        return self._index.nbytes

    def _exact_bytes(self) -> int:
        return (
            self.rows * self.row_bytes
            + self._index.nbytes
            + sum(b.nbytes for b in self._buffers.values())
            + self._pending_row_reserve * self.row_bytes
        )

    def _account(self, total: int, what: str) -> None:
        self._budget.charge(total - self._charged, what)
        self._charged = total

    def _bytes_with_new_rows(self, new_rows: int) -> int:
        grown_index = self._index.bytes_after(self.rows + new_rows) - self._index.nbytes
        return self._charged + new_rows * self.row_bytes + grown_index

    # ----- row creation -----------------------------------------------------
    def _count_missing(self, keys: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]) -> int:
        missing = keys[rows < 0]
        return int(distinct(missing)[0].shape[0]) if missing.shape[0] else 0

    def _ensure_rows(
        self,
        keys: npt.NDArray[np.int64],
        rows: npt.NDArray[np.int64],
        fill: bool = True,
        keys_distinct: bool = False,
    ) -> npt.NDArray[np.int64]:
        """Create the rows of keys whose ``rows`` entry is -1 (memory already charged);
        ``fill=False`` leaves their values and state for the caller to write;
        ``keys_distinct``: the caller's keys hold no duplicates (a commit, a load)."""
        absent = rows < 0
        if not absent.any():
            return rows
        old = self.rows
        rows = rows.copy()
        # Distinct absent keys, in first-occurrence order: rows old..new-1.
        if keys_distinct:
            new_keys = keys[absent]
            rows[absent] = self._index.insert(new_keys)
        else:
            new_keys, inverse = distinct(keys[absent])
            rows[absent] = self._index.insert(new_keys)[inverse]
        new = self.rows
        if new > self.capacity:
            capacity = max(new, 2 * self.capacity, 1024)
            self._records.grow(capacity)
        if fill:
            self._values[old:new] = self.spec.initializer.generate(new_keys, self.dim)
            self._state[old:new] = self.spec.optimizer.init_state(new - old, self.dim)
        self._versions[old:new] = 0
        self._changed[old:new] = NEVER_CHANGED
        return rows

    def _lookup_or_create(self, keys: npt.NDArray[np.int64], what: str) -> npt.NDArray[np.int64]:
        rows = self._index.lookup(keys)
        new_rows = self._count_missing(keys, rows)
        if new_rows:
            self._account(self._bytes_with_new_rows(new_rows), what)
            rows = self._ensure_rows(keys, rows)
            self._account(self._exact_bytes(), what)
        return rows

    # ----- requests ---------------------------------------------------------
    def pull(self, keys: npt.NDArray[np.int64], with_state: bool) -> RowBlock:
        """Rows of ``keys`` in request order, creating unseen keys."""
        n = keys.shape[0]
        values = np.empty((n, self.dim), dtype=np.float32)
        state = np.empty((n, self.state_width if with_state else 0), dtype=np.float32)
        versions = np.empty(n, dtype=np.int64)
        with self.lock:
            rows = self._pull_into(keys, values, versions, state)
            return RowBlock(keys, values, state, versions, self._changed[rows])

    def pull_into(
        self,
        keys: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        versions: npt.NDArray[np.int64],
        state: npt.NDArray[np.float32],
    ) -> None:
        """:meth:`pull` written straight into the caller's ``values [n, dim]``,
        ``versions [n]`` and ``state [n, state_width or 0]`` (a response message's
        payloads, ``ps_server.pull_response``): one gather, no intermediate arrays."""
        with self.lock:
            self._pull_into(keys, values, versions, state)

    def _pull_into(
        self,
        keys: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        versions: npt.NDArray[np.int64],
        state: npt.NDArray[np.float32],
    ) -> npt.NDArray[np.int64]:
        """The rows of ``keys`` (created if unseen) gathered into the outputs; caller
        holds the lock."""
        rows = self._lookup_or_create(keys, f"pull of {keys.shape[0]} keys from {self.name!r}")
        records = self._records.array
        floats = records.view(np.float32)

        def gather(lo: int, hi: int) -> None:
            part = slice(lo, hi)
            gather_pull(records, floats, rows[part], values[part], state[part], versions[part])

        in_parts(rows.shape[0], gather)
        return rows

    def known(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which keys have a row (caller holds the lock)."""
        return self._index.lookup(keys) >= 0

    def versions(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Clock of every key in request order; 0 for unseen keys, which stay unseen."""
        with self.lock:
            rows = self._index.lookup(keys)
            out = np.zeros(keys.shape[0], dtype=np.int64)
            known = rows >= 0
            out[known] = self._versions[rows[known]]
            return out

    def push(
        self,
        iteration: int,
        keys: npt.NDArray[np.int64],
        grads: npt.NDArray[np.float32],
        steps: npt.NDArray[np.int32] | None = None,
        worker: int = 0,
    ) -> bool:
        """Buffer gradients for ``iteration`` (or apply at once); True if applied.
        ``steps``: optimizer steps each gradient row stands for (None: 1 each);
        ``worker``: who pushed (a commit adds workers' sums in worker order)."""
        what = f"push of {keys.shape[0]} gradients to {self.name!r}"
        with self.lock:
            if self.spec.update_mode is UpdateMode.IMMEDIATE:
                unique, summed, unique_steps = sum_duplicates(keys, grads, steps)
                work = self._working_rows(unique)
                work.apply(
                    self.spec.optimizer, None, summed, self.committed_iteration + 1, unique_steps
                )
                check_finite_rows(self.name, "push", work.keys, work.values, work.state)
                rows = self._lookup_or_create(unique, what)
                self._store(rows, work)
                return True
            check_push_iteration(self.name, iteration, self.committed_iteration)
            buffer = self._buffers.get(iteration) or GradBuffer(self.dim)
            growth, new_in_buffer = buffer.growth(keys, worker)
            new_rows = int((self._index.lookup(new_in_buffer) < 0).sum())
            self._account(self._charged + growth + new_rows * self.row_bytes, what)
            # Conservative: a key new to the table in two pending iterations is
            # reserved twice until the buffers are committed.
            self._pending_row_reserve += new_rows
            buffer.add(keys, grads, steps, worker)
            self._buffers[iteration] = buffer
            self._account(self._exact_bytes(), what)
            return False

    def prepare_commit(self, iteration: int, lr_scale: float = 1.0) -> WorkingRows | None:
        """Every buffer of an iteration <= ``iteration`` applied, in order, to copies of
        the rows, with the optimizer's lr times ``lr_scale``; InvalidArgument if a value or
        state would not be finite. Nothing changes until :meth:`finish_commit`. Caller holds
        ``self.lock``."""
        its = sorted(i for i in self._buffers if i <= iteration)
        if not its:
            return None
        contents = [self._buffers[it].contents() for it in its]
        optimizer = scaled(self.spec.optimizer, lr_scale)
        if len(its) == 1:  # the usual case: one buffer, its keys already distinct
            union = contents[0][0]
            work = self._working_rows(union)
            _, grads, steps = contents[0]
            work.apply(optimizer, None, grads, its[0], paced_steps(steps, its[0], work.changed))
            start = union.shape[0]
        else:
            union, inverse = distinct(np.concatenate([k for k, _, _ in contents]))
            work = self._working_rows(union)
            start = 0
            for it, (keys, grads, steps) in zip(its, contents, strict=True):
                at = inverse[start : start + keys.shape[0]]
                work.apply(optimizer, at, grads, it, paced_steps(steps, it, work.changed[at]))
                start += keys.shape[0]
        work.its, work.updates = its, start
        what = f"commit of iteration {its[-1]}"
        check_finite_rows(self.name, what, union, work.values, work.state, COMMIT_HINT)
        return work

    def finish_commit(self, iteration: int, work: WorkingRows | None) -> int:
        """Store what :meth:`prepare_commit` computed and drop the applied buffers; return
        the rows updated. Caller holds ``self.lock``."""
        updated = 0
        if work is not None:
            self._store(self._ensure_rows(work.keys, work.slots, False, True), work)
            for it in work.its:
                del self._buffers[it]
            updated = work.updates
        self.committed_iteration = max(self.committed_iteration, iteration)
        if not self._buffers:
            self._pending_row_reserve = 0
        # Shrinking the charge cannot fail: rows were reserved when pushed.
        self._account(self._exact_bytes(), "commit")
        return updated

    def _working_rows(self, keys: npt.NDArray[np.int64]) -> WorkingRows:
        """Copies of the rows of distinct ``keys``; absent ones as they would be created.
        Whole records, copied in one pass: the four arrays are views of one block."""
        rows = self._index.lookup(keys)
        block = np.empty((keys.shape[0], self._words), dtype=np.int64)
        block[:, 0] = 0
        block[:, 1] = NEVER_CHANGED
        records = self._records.array
        in_parts(rows.shape[0], lambda lo, hi: gather_records(records, rows[lo:hi], block[lo:hi]))
        work = WorkingRows(rows, keys, *self._columns(block), records=block)
        absent = rows < 0
        if absent.any():
            new = np.flatnonzero(absent)
            work.values[new] = self.spec.initializer.generate(keys[new], self.dim)
            work.state[new] = self.spec.optimizer.init_state(new.shape[0], self.dim)
        return work

    def _store(self, rows: npt.NDArray[np.int64], work: WorkingRows) -> None:
        if work.records is not None:  # rows are distinct: the parts write disjoint records
            records, block = self._records.array, work.records
            in_parts(
                rows.shape[0], lambda lo, hi: scatter_records(records, rows[lo:hi], block[lo:hi])
            )
            return
        self._values[rows] = work.values
        self._state[rows] = work.state
        self._versions[rows] = work.versions
        self._changed[rows] = work.changed

    def write_back(
        self,
        keys: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        state: npt.NDArray[np.float32],
        base_versions: npt.NDArray[np.int64],
        new_versions: npt.NDArray[np.int64],
    ) -> None:
        """Store rows a worker updated, only if every stored version equals its base."""
        check_write_back(keys, base_versions, new_versions)
        with self.lock:
            rows = self._index.lookup(keys)
            present = rows >= 0
            stored = np.zeros(keys.shape[0], dtype=np.int64)
            stored[present] = self._versions[rows[present]]
            check_versions_unchanged(self.name, keys, stored, base_versions)
            rows = self._lookup_or_create(keys, f"write_back of {keys.shape[0]} rows")
            self._values[rows] = values
            self._state[rows] = state
            self._versions[rows] = new_versions
            self._changed[rows] = self.committed_iteration + 1

    def export(self, since_iteration: int) -> RowBlock:
        """Rows changed after ``since_iteration`` (every row when it is negative)."""
        with self.lock:
            n = self.rows
            if since_iteration < 0:
                rows = np.arange(n)
            else:
                rows = np.flatnonzero(self._changed[:n] > since_iteration)
            return RowBlock(
                self._index.keys_by_row()[rows],
                self._values[rows],
                self._state[rows],
                self._versions[rows],
                self._changed[rows],
            )

    def snapshot(self) -> RowBlock:
        """A copy of every committed row (pending gradient buffers are not part of it)."""
        return self.export(-1)

    def load_rows(self, block: RowBlock) -> None:
        """Fill an empty table with ``block`` (snapshot restore)."""
        with self.lock:
            if self.rows:
                raise InvalidArgument(f"table {self.name!r} is not empty")
            n = len(block)
            self._account(self._bytes_with_new_rows(n), f"loading {n} rows into {self.name!r}")
            rows = self._ensure_rows(block.keys, np.full(n, -1, dtype=np.int64), False, True)
            self._values[rows] = block.values
            self._state[rows] = block.state
            self._versions[rows] = block.versions
            self._changed[rows] = block.changed
            self._account(self._exact_bytes(), "load")

    @property
    def name(self) -> str:
        return self.spec.name
