"""The shard's memory budget: bytes are charged before any store grows."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from heraldps.errors import ResourceExhausted

# What a table holds beside its rows, charged at CreateTable on both stores: its objects,
# its smallest key index or cache slot map, its metrics, its LMDB handle. Measured:
# about 24 KiB on a Staged-PS and about 60 KiB on a Cached-PS (docs/cached-ps.md,
# "Memory"; benchmarks/bench_table_memory.py).
TABLE_OVERHEAD_BYTES = 128 * 2**10


class MemoryBudget:
    """Counts the bytes a shard's tables hold against ``--memory-limit-gb``.

    Stores charge the bytes a request would add *before* writing anything,
    so a request over the cap fails with RESOURCE_EXHAUSTED and changes
    nothing. What is counted: each table's ``TABLE_OVERHEAD_BYTES``; on a
    Staged-PS keys, values, optimizer state, versions, change marks,
    key-index slots and gradient buffers; on a Cached-PS each table's whole
    ``--cache-gb`` (charged at CreateTable, committed as rows arrive) and
    gradient buffers; and, while a call runs, its request
    (``heraldps.admission``) and the response it builds (``reserve``).
    Python's and gRPC's own start-up memory is not.
    """

    def __init__(self, limit_bytes: int | None = None) -> None:
        self.limit_bytes = limit_bytes
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        return self._used

    def charge(self, nbytes: int, what: str, hint: str = "") -> None:
        """Add ``nbytes`` or raise ResourceExhausted leaving the count unchanged."""
        if nbytes <= 0:
            self.release(-nbytes)
            return
        with self._lock:
            self._refuse_over(nbytes, what, hint)
            self._used += nbytes

    def check(self, nbytes: int, what: str, hint: str = "") -> None:
        """ResourceExhausted if ``nbytes`` more would not fit now; charges nothing."""
        with self._lock:
            self._refuse_over(nbytes, what, hint)

    def _refuse_over(self, nbytes: int, what: str, hint: str) -> None:
        if self.limit_bytes is not None and self._used + nbytes > self.limit_bytes:
            raise ResourceExhausted(
                f"{what} needs {nbytes / 2**20:.1f} MiB more, but the shard holds "
                f"{self._used / 2**20:.1f} MiB of its {self.limit_bytes / 2**20:.1f} MiB "
                f"memory limit; raise --memory-limit-gb, add shards, or "
                f"{hint or 'use --store cached'}"
            )

    def adjust(self, nbytes: int) -> None:
        """Add ``nbytes`` (or give back, when negative) without refusing: for the exact
        count once a change that was charged its estimate is made."""
        with self._lock:
            self._used = max(0, self._used + nbytes)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._used = max(0, self._used - nbytes)

    @contextlib.contextmanager
    def reserve(self, nbytes: int, what: str) -> Iterator[None]:
        """Hold ``nbytes`` while the block runs (a request's or a response's buffers):
        over the limit, ResourceExhausted before anything is built."""
        self.charge(nbytes, what)
        try:
            yield
        finally:
            self.release(nbytes)
