"""The look-ahead window: the keys of the batches a scheduler holds behind the one it plans.

With look-ahead K the scheduler holds the next K - 1 batches before it plans one
(docs/scheduler.md#look-ahead). Its eviction and early write-back passes ask, for a few
keys each, "does a held batch use this key?". The window answers from a hash table of
the held batches' distinct keys, each with how many held batches use it: a batch's keys
go in once when it is submitted and out once before it is planned, so the cost per batch
is the same whatever K, and a question is one probe (``keyindex.table_find``) in the
compiled passes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps import hostmem
from heraldps.jit import njit
from heraldps.keyindex import KeyIndex

EMPTY = np.full((1, 2), -1, dtype=np.int64)
"""A slot table holding no key: the window of a scheduler that holds nothing."""


@njit(nogil=True)
def _count_uses(keys, rows, uses, stamp, batch):  # type: ignore[no-untyped-def]  # pragma: no cover
    """One more held batch uses each distinct key of ``keys`` (``rows``: their index rows):
    ``uses`` of a row counts once per batch (``stamp`` names the batch that last counted
    it). Returns the batch's distinct keys, in first-occurrence order."""
    distinct = np.empty(keys.shape[0], dtype=np.int64)
    n = 0
    for i in range(keys.shape[0]):
        r = rows[i]
        if stamp[r] != batch:
            stamp[r] = batch
            uses[r] += 1
            distinct[n] = keys[i]
            n += 1
    return distinct[:n]


class Window:
    """The distinct keys of the held batches, and how many held batches use each."""

    def __init__(self) -> None:
        self._index = KeyIndex()
        self._uses = np.zeros(1024, np.int64)  # per index row
        self._stamp = np.zeros(1024, np.int64)  # per index row: the batch that last counted it
        self._batches = 0  # batches that ever entered (their stamps)

    def __len__(self) -> int:
        """Distinct keys the held batches use."""
        return len(self._index)

    def enter(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """A batch is held (``keys``: its key occurrences); returns its distinct keys, which
        :meth:`leave` takes when the batch is planned."""
        rows = self._index.insert(keys)
        size = self._index.rows
        if size > self._uses.shape[0]:
            capacity = max(size, 2 * self._uses.shape[0])
            self._uses = hostmem.grown(self._uses, capacity)
            self._stamp = hostmem.grown(self._stamp, capacity)
        self._batches += 1
        distinct: npt.NDArray[np.int64] = _count_uses(keys, rows, self._uses, self._stamp,
                                                      self._batches)  # fmt: skip
        return distinct

    def leave(self, distinct: npt.NDArray[np.int64]) -> None:
        """A held batch leaves (is planned): ``distinct``, what :meth:`enter` returned for
        it; a key no held batch uses any more goes."""
        rows = self._index.lookup(distinct)
        self._uses[rows] -= 1
        self._index.remove(distinct[self._uses[rows] == 0])

    @property
    def slots(self) -> npt.NDArray[np.int64]:
        """The slot table the compiled passes probe (``keyindex.table_find(slots, key) >=
        0``: a held batch uses the key); valid until the next :meth:`enter`."""
        return self._index.slots if len(self._index) else EMPTY
