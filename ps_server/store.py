"""A Staged-PS shard: the tables of one shard and its commit protocol.

Locking (documented in docs/ps.md, "Locking"):
- ``_commit_lock`` serialises Commit, CreateTable, Save and Load. Commit
  takes it, then every table's lock (sorted by name), computes every table's
  new rows, checks them (finite values and state), and only then stores them:
  a commit is atomic over the whole shard.
- Each table's own lock covers Pull, PushGradients, WriteBack and Export on
  that table. A push checks its iteration against the table's committed
  iteration *under the table lock*; the commit advances that number under
  the same lock, so a push either lands in the buffer before the commit
  applies it or is rejected as stale: an acknowledged gradient is never lost.
- Requests on different tables run in parallel; NumPy and the compiled
  kernels release the GIL for the heavy parts.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import numpy.typing as npt

from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.keyindex import distinct
from heraldps.spec import TableSpec
from ps_server.checks import check_commit_order, check_initializer, check_same_spec
from ps_server.memory import TABLE_OVERHEAD_BYTES, MemoryBudget
from ps_server.row_index import SLOT_BYTES, capacity_for
from ps_server.shard_tables import ShardTables
from ps_server.table import RowBlock, StagedTable


class StagedStore(ShardTables[StagedTable]):
    """Every table of one shard, held in host memory (HugeCTR's Staged-PS)."""

    def __init__(
        self,
        shard_index: int = 0,
        num_shards: int = 1,
        memory_limit_bytes: int | None = None,
        expected_rows: int = 0,
    ) -> None:
        """``expected_rows``: rows each new table is sized for up front (``--expected-rows``;
        0: tables grow as keys arrive). A snapshot load sizes tables by their rows."""
        if expected_rows < 0:
            raise ValueError(f"expected_rows must be >= 0, got {expected_rows}")
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index must be in 0..{num_shards - 1}, got {shard_index}")
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.budget = MemoryBudget(memory_limit_bytes)
        self.expected_rows = expected_rows
        self.committed_iteration = -1
        self._tables: dict[str, StagedTable] = {}
        self._commit_lock = threading.RLock()

    # ----- tables -----------------------------------------------------------
    def create_table(
        self, spec: TableSpec, validate_only: bool = False
    ) -> tuple[StagedTable | None, bool]:
        """Create a table; an equal spec again is a no-op, a different one an error.
        ``validate_only``: every check, and the memory limit, without creating
        (None, False), as a client does on every shard before it creates."""
        with self._commit_lock:
            existing = self._tables.get(spec.name)
            if existing is not None:
                check_same_spec(existing.spec, spec)
                return existing, False
            check_initializer(spec)
            what = f"table {spec.name!r} (its key index and overhead)"
            if validate_only:
                index = capacity_for(self.expected_rows) * SLOT_BYTES
                self.budget.check(TABLE_OVERHEAD_BYTES + index, what)
                return None, False
            self.budget.charge(TABLE_OVERHEAD_BYTES, what)
            try:
                table = StagedTable(spec, self.budget, self.committed_iteration, self.expected_rows)
            except BaseException:
                self.budget.release(TABLE_OVERHEAD_BYTES)
                raise
            self._tables[spec.name] = table
            return table, True

    def drop_table(self, name: str) -> None:
        """Remove an empty table (undoing a CreateTable that did not reach every shard)
        and give back its memory; one with rows or gradients is FAILED_PRECONDITION."""
        with self._commit_lock:
            table = self.table(name)
            with table.lock:
                if table.rows or table.nbytes > table.index_bytes:
                    raise FailedPrecondition(
                        f"table {name!r} holds rows or gradients; only an empty table is "
                        "dropped (nothing was changed)"
                    )
                del self._tables[name]
                self.budget.release(table.nbytes + TABLE_OVERHEAD_BYTES)

    # ----- training -------------------------------------------------------
    def push(
        self,
        name: str,
        iteration: int,
        keys: npt.NDArray[np.int64],
        grads: npt.NDArray[np.float32],
        steps: npt.NDArray[np.int32] | None = None,
        worker: int = 0,
    ) -> bool:
        return self.table(name).push(iteration, keys, grads, steps, worker)

    def prefetch(self, name: str, keys: npt.NDArray[np.int64]) -> int:
        """Every row already lives in memory: count the distinct keys the table holds."""
        table = self.table(name)
        with table.lock:
            return int(np.count_nonzero(table.known(distinct(keys)[0])))

    def commit(self, iteration: int, lr_scale: float = 1.0) -> tuple[int, bool]:
        """Apply buffered gradients through ``iteration`` (the optimizers' lr times
        ``lr_scale``); return (rows updated, already)."""
        with self._commit_lock:
            if check_commit_order(iteration, self.committed_iteration):
                return 0, True
            tables = self.tables()
            for table in tables:  # sorted by name: the lock order
                table.lock.acquire()
            try:
                # Every table computed and checked before any changes: all or nothing.
                prepared = [table.prepare_commit(iteration, lr_scale) for table in tables]
                updated = sum(
                    table.finish_commit(iteration, work)
                    for table, work in zip(tables, prepared, strict=True)
                )
            finally:
                for table in tables:
                    table.lock.release()
            self.committed_iteration = iteration
            return updated, False

    def write_back(
        self,
        name: str,
        keys: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        state: npt.NDArray[np.float32],
        base_versions: npt.NDArray[np.int64],
        new_versions: npt.NDArray[np.int64],
    ) -> None:
        self.table(name).write_back(keys, values, state, base_versions, new_versions)

    # ----- snapshots --------------------------------------------------------
    def data_paths(self) -> tuple[Path, ...]:
        """Directories a Save must stay out of: none, every row lives in memory."""
        return ()

    def consistent_snapshot(self) -> tuple[int, list[tuple[TableSpec, RowBlock]]]:
        """Copies of every table's committed rows, taken between commits."""
        with self._commit_lock:
            return self.committed_iteration, [(t.spec, t.snapshot()) for t in self.tables()]

    def replace_all(
        self, committed_iteration: int, tables: list[tuple[TableSpec, RowBlock]], apply: bool = True
    ) -> int:
        """Swap in the given tables (snapshot load); nothing changes if any fails to fit.

        ``apply=False`` builds them all the same (so the memory cap is checked) and
        drops them: Load's ``validate_only``.
        """
        with self._commit_lock:
            fresh_budget = MemoryBudget(self.budget.limit_bytes)
            fresh_budget.charge(len(tables) * TABLE_OVERHEAD_BYTES,
                                f"the snapshot's {len(tables)} tables")  # fmt: skip
            built: dict[str, StagedTable] = {}
            for spec, block in tables:
                if spec.name in built:
                    raise InvalidArgument(f"snapshot holds table {spec.name!r} twice")
                rows = max(len(block), self.expected_rows)
                table = StagedTable(spec, fresh_budget, committed_iteration, rows)
                table.load_rows(block)
                built[spec.name] = table
            if apply:
                self.budget = fresh_budget
                self._tables = built
                self.committed_iteration = committed_iteration
            return sum(t.rows for t in built.values())
