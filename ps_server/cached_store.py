"""A Cached-PS shard (HugeCTR's Cached-PS): every table in one LMDB environment on disk.

``DATA_DIR`` holds one LMDB environment per shard. Besides a named
database per table (``ps_server.lmdb_rows``) it has ``meta``: the format
marker, the shard's identity (index and count), each table's spec (proto
bytes) and the last committed iteration.

Durability: ``Commit(t)`` applies the buffered gradients of every table,
writes the changed rows and the new committed iteration in **one** LMDB write
transaction, and answers only after that transaction is committed (and, with
``durability="sync"``, fsynced). After ``kill -9`` at any moment a restart
from the same directory serves exactly the last acknowledged commit: LMDB's
copy-on-write pages make a transaction all-or-nothing. Write-backs and
immediate pushes are written the same way before they are acknowledged.
``durability="periodic"`` opens the environment without fsync on commit and
syncs every ``sync_seconds``: a killed process loses nothing (the pages are
in the OS cache), a power failure may lose the commits of the last period.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import numpy.typing as npt

from heraldps.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)
from heraldps.spec import TableSpec
from heraldps.v1 import types_pb2
from ps_server.cached_table import CachedTable, CachePolicy
from ps_server.checks import check_commit_order, check_initializer, check_same_spec
from ps_server.memory import TABLE_OVERHEAD_BYTES, MemoryBudget
from ps_server.shard_tables import ShardTables
from ps_server.table import RowBlock

FORMAT = b"heraldps-cached-ps/1"
DURABILITY = ("sync", "periodic")
_MAX_TABLES = 1000
_COPIER_THREADS = 4  # helper threads copying cache hits, shared by every table
_CACHE_HINT = "lower --cache-gb (each table's cache counts whole)"


class CachedStore(ShardTables[CachedTable]):
    """Every table of one shard on disk (LMDB) behind per-table host caches."""

    def __init__(
        self,
        data_dir: str | Path,
        shard_index: int = 0,
        num_shards: int = 1,
        policy: CachePolicy | None = None,
        durability: str = "sync",
        max_disk_gb: float = 1024.0,
        sync_seconds: float = 5.0,
        memory_limit_bytes: int | None = None,
    ) -> None:
        """``memory_limit_bytes`` (``--memory-limit-gb``) counts every table's whole
        cache and overhead (charged at CreateTable, so a table that does not fit is
        refused), gradient buffers, and the calls' buffers."""
        if durability not in DURABILITY:
            raise ValueError(f"--durability must be one of {', '.join(DURABILITY)}")
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.policy = policy or CachePolicy(cache_bytes=1 << 30)
        self.durability = durability
        self.budget = MemoryBudget(memory_limit_bytes)
        self.path = Path(data_dir) / f"shard-{shard_index:05d}-of-{num_shards:05d}"
        self.data_dir = Path(data_dir).resolve()  # as opened, whatever the cwd later
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_file = _exclusive_lock(self.path / "heraldps.lock")
        try:
            self._open(durability, max_disk_gb, sync_seconds)
        except BaseException:
            self._lock_file.close()
            raise

    def _open(self, durability: str, max_disk_gb: float, sync_seconds: float) -> None:
        sync = durability == "sync"
        try:
            self.env = lmdb.open(
                str(self.path), map_size=int(max_disk_gb * 2**30), max_dbs=_MAX_TABLES + 1,
                sync=sync, metasync=sync, readahead=False, lock=True,
            )  # fmt: skip
        except lmdb.Error as exc:
            raise FailedPrecondition(
                f"cannot open the Cached-PS data directory {self.path}: {exc}; is it an LMDB "
                "environment written by heraldps, and not in use by another shard process?"
            ) from None
        self.meta = self.env.open_db(b"meta")
        self._commit_lock = threading.RLock()
        self._write_lock = threading.Lock()
        self._tables: dict[str, CachedTable] = {}
        self._copier = ThreadPoolExecutor(_COPIER_THREADS, thread_name_prefix="cache-copy")
        self.committed_iteration = -1
        try:
            self._open_existing()
        except BaseException:
            self._copier.shutdown(wait=False)
            self.env.close()
            raise
        self._stop_sync = threading.Event()
        if not sync:
            threading.Thread(
                target=self._sync_periodically, args=(sync_seconds,), daemon=True
            ).start()

    # ----- on-disk identity --------------------------------------------------
    def _open_existing(self) -> None:
        with self.env.begin(write=True, db=self.meta) as txn:
            fmt = txn.get(b"format")
            identity = json.dumps({"shard_index": self.shard_index, "num_shards": self.num_shards})
            if fmt is None:
                if self.env.stat()["entries"] > 1:  # more than our own 'meta' database
                    raise FailedPrecondition(
                        f"{self.path} holds an LMDB environment not written by heraldps; "
                        "point --data-dir at an empty or heraldps directory"
                    )
                txn.put(b"format", FORMAT)
                txn.put(b"identity", identity.encode())
                txn.put(b"committed_iteration", b"-1")
                return
            if fmt != FORMAT:
                raise FailedPrecondition(
                    f"{self.path} was written in format {fmt!r}, this server reads {FORMAT!r}"
                )
            stored = txn.get(b"identity", b"").decode()
            if stored != identity:
                raise FailedPrecondition(
                    f"{self.path} belongs to {stored}, not to shard {self.shard_index} of "
                    f"{self.num_shards}; start with the shard index and count it was written with"
                )
            self.committed_iteration = int(txn.get(b"committed_iteration", b"-1"))
            cursor = txn.cursor()
            specs = [
                TableSpec.from_proto(types_pb2.TableSpec.FromString(value))
                for key, value in cursor
                if key.startswith(b"spec:")
            ]
        need = len(specs) * self.table_bytes
        try:
            self.budget.charge(need, f"the {len(specs)} tables in {self.path}", _CACHE_HINT)
        except ResourceExhausted as exc:
            raise FailedPrecondition(str(exc)) from None
        for spec in specs:
            self._tables[spec.name] = self._new_table(spec, self.committed_iteration)

    @property
    def table_bytes(self) -> int:
        """What a table holds of the memory limit: its whole cache, and the overhead."""
        return self.policy.cache_bytes + TABLE_OVERHEAD_BYTES

    def _new_table(
        self, spec: TableSpec, committed: int, budget: MemoryBudget | None = None, txn: Any = None
    ) -> CachedTable:
        return CachedTable(spec, self.env, self.policy, committed, self._copier,
                           budget or self.budget, txn)  # fmt: skip

    @contextlib.contextmanager
    def _write_txn(self) -> Iterator[Any]:
        """One LMDB write transaction; disk-full and map-full become RESOURCE_EXHAUSTED."""
        try:
            with self.env.begin(write=True) as txn:
                yield txn
        except lmdb.MapFullError:
            raise ResourceExhausted(
                f"the Cached-PS data in {self.path} reached --max-disk-gb; raise it or add "
                "shards (nothing of this request was written)"
            ) from None
        except lmdb.DiskError as exc:
            raise ResourceExhausted(
                f"writing {self.path} failed ({exc}); free disk space (nothing of this "
                "request was written)"
            ) from None
        except lmdb.Error as exc:
            # On a full disk a short write surfaces from mdb_txn_commit as EIO, not ENOSPC.
            if "Input/output error" not in str(exc) or not _disk_nearly_full(self.path):
                raise
            raise ResourceExhausted(
                f"writing {self.path} failed ({exc}) with the disk full; free disk space "
                "(nothing of this request was written, the shard serves on)"
            ) from None

    def _sync_periodically(self, seconds: float) -> None:
        while not self._stop_sync.wait(seconds):
            with contextlib.suppress(lmdb.Error):
                self.env.sync(True)

    def close(self) -> None:
        self._stop_sync.set()
        self._copier.shutdown(wait=True)
        with contextlib.suppress(lmdb.Error):
            self.env.sync(True)
        self.env.close()
        self._lock_file.close()

    # ----- tables -----------------------------------------------------------
    def create_table(
        self, spec: TableSpec, validate_only: bool = False
    ) -> tuple[CachedTable | None, bool]:
        """Create a table, its cache charged whole to the memory limit (committed only as
        rows arrive); an equal spec again is a no-op. ``validate_only``: every check, and
        the limit, without creating (None, False), as a client does on every shard first."""
        with self._commit_lock, self._write_lock:
            existing = self._tables.get(spec.name)
            if existing is not None:
                check_same_spec(existing.spec, spec)
                return existing, False
            check_initializer(spec)
            if len(self._tables) >= _MAX_TABLES:
                raise ResourceExhausted(
                    f"a Cached-PS shard holds at most {_MAX_TABLES} tables (every table lives "
                    "on every shard); use fewer tables"
                )
            what = f"table {spec.name!r} (--cache-gb and its overhead)"
            if validate_only:
                self.budget.check(self.table_bytes, what, _CACHE_HINT)
                return None, False
            self.budget.charge(self.table_bytes, what, _CACHE_HINT)
            try:
                with self._write_txn() as txn:
                    table = self._new_table(spec, self.committed_iteration, txn=txn)
                    txn.put(f"spec:{spec.name}".encode(), spec.to_proto().SerializeToString(),
                            db=self.meta)  # fmt: skip
            except BaseException:
                self.budget.release(self.table_bytes)
                raise
            self._tables[spec.name] = table
            return table, True

    def drop_table(self, name: str) -> None:
        """Remove an empty table (undoing a CreateTable that did not reach every shard):
        its LMDB database, spec and memory charge. A table with rows or buffered
        gradients is FAILED_PRECONDITION: dropping never loses data."""
        with self._commit_lock, self._write_lock:
            table = self.table(name)
            with table.lock:
                if not table.empty:
                    raise FailedPrecondition(
                        f"table {name!r} holds rows or gradients; only an empty table is "
                        "dropped (nothing was changed)"
                    )
                with self._write_txn() as txn:
                    txn.drop(table.disk.db, delete=True)
                    txn.delete(f"spec:{name}".encode(), db=self.meta)
                del self._tables[name]
            self.budget.release(self.table_bytes)

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
        table = self.table(name)
        with self._write_lock:
            return table.push(iteration, keys, grads, self._write_txn, steps, worker)

    def commit(self, iteration: int, lr_scale: float = 1.0) -> tuple[int, bool]:
        """Apply buffered gradients through ``iteration`` durably (the optimizers' lr times
        ``lr_scale``); (rows updated, already)."""
        with self._commit_lock:
            if check_commit_order(iteration, self.committed_iteration):
                return 0, True
            with self._write_lock:
                tables = self.tables()
                for table in tables:
                    table.lock.acquire()
                try:
                    prepared = []
                    with self._write_txn() as txn:
                        for table in tables:
                            prepared.append(table.prepare_commit(iteration, txn, lr_scale))
                        txn.put(b"committed_iteration", str(iteration).encode(), db=self.meta)
                    # Durable: only now does memory change.
                    updated = 0
                    for table, (rows, its, count) in zip(tables, prepared, strict=True):
                        table.finish_commit(iteration, rows, its)
                        updated += count
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
        table = self.table(name)
        with self._write_lock:
            table.write_back(keys, values, state, base_versions, new_versions, self._write_txn)

    def prefetch(self, name: str, keys: npt.NDArray[np.int64]) -> int:
        return self.table(name).prefetch(keys)

    # ----- snapshots --------------------------------------------------------
    def data_paths(self) -> tuple[Path, ...]:
        """Where a Save must not write: the whole --data-dir, not only this shard's LMDB folder.

        The --data-dir holds every local shard's LMDB folder under the very names a
        snapshot uses (``shard-<i>-of-<S>``), so a snapshot anywhere in it would land on
        or beside a durable store.
        """
        return (self.data_dir,)

    def consistent_snapshot(self) -> tuple[int, list[tuple[TableSpec, RowBlock]]]:
        with self._commit_lock:
            return self.committed_iteration, [(t.spec, t.snapshot()) for t in self.tables()]

    def replace_all(
        self, committed_iteration: int, tables: list[tuple[TableSpec, RowBlock]], apply: bool = True
    ) -> int:
        """Swap in a snapshot's tables in one transaction; nothing changes if it fails.

        ``apply=False`` writes it all the same (so --max-disk-gb and the disk are
        checked) and aborts the transaction: Load's ``validate_only``.
        """
        names = [spec.name for spec, _ in tables]
        if len(set(names)) != len(names):
            raise InvalidArgument("snapshot holds a table twice")
        with self._commit_lock, self._write_lock:
            built: dict[str, CachedTable] = {}
            budget = MemoryBudget(self.budget.limit_bytes)
            budget.charge(len(tables) * self.table_bytes,
                          f"the snapshot's {len(tables)} tables", _CACHE_HINT)  # fmt: skip
            try:
                with self._write_txn() as txn:
                    # Databases of new tables are created in the transaction: a failed or
                    # validate-only load leaves none behind.
                    for spec, _ in tables:
                        built[spec.name] = self._new_table(spec, committed_iteration, budget, txn)
                    for old in self.tables():
                        if old.name not in built:
                            old.disk.clear(txn)
                            txn.delete(f"spec:{old.name}".encode(), db=self.meta)
                    for spec, block in tables:
                        built[spec.name].load_rows(block, txn)
                        txn.put(f"spec:{spec.name}".encode(), spec.to_proto().SerializeToString(),
                                db=self.meta)  # fmt: skip
                    txn.put(b"committed_iteration", str(committed_iteration).encode(),
                            db=self.meta)  # fmt: skip
                    if not apply:
                        raise _DryRun
            except _DryRun:
                pass
            if apply:
                self._tables, self.budget = built, budget
                self.committed_iteration = committed_iteration
            return sum(len(block) for _, block in tables)


class _DryRun(Exception):
    """Raised inside a write transaction to abort it (a validate-only load)."""


def _disk_nearly_full(path: Path) -> bool:
    """Under 1% (at most 64 MiB) of the file system holding ``path`` is free."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return False
    free, size = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
    return free < min(64 * 2**20, size // 100)


def _exclusive_lock(path: Path) -> Any:
    """Hold an exclusive lock on ``path`` for the life of the process (one shard per dir)."""
    handle = open(path, "a+")  # noqa: SIM115 - kept open on purpose
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise FailedPrecondition(
            f"{path.parent} is in use by another heraldps shard process; stop it first or "
            "use another --data-dir"
        ) from None
    return handle
