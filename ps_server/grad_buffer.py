"""One iteration's pushed gradients, summed per worker and combined in worker order.

Float addition is not associative: ``(a + b) + c`` and ``(a + c) + b`` can
differ in the last bit, so a buffer that summed pushes as they arrived would
store whatever order the network delivered them in, and two runs of one job
would drift apart by ulps (enough, at a ReLU kink, to change which gradients
flow). Each worker's pushes are summed in its own :class:`WorkerSums` (one
worker sends an iteration's pushes in a fixed order), and :meth:`contents`
adds the workers' sums in ascending worker id: the same bits on every run.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps import hostmem
from heraldps.keyindex import KeyIndex, distinct
from ps_server.kernels import scatter_add_rows

Contents = tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int32]]


class WorkerSums:
    """One worker's summed gradients of one iteration, one row per distinct key, with the
    number of optimizer steps each row stands for (the largest of its pushes; 1 unless a
    push said)."""

    def __init__(self, dim: int) -> None:
        self.index = KeyIndex()
        self.keys = np.empty(0, dtype=np.int64)
        self.grads = np.empty((0, dim), dtype=np.float32)
        self.steps = np.empty(0, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + len(self) * self.row_bytes

    @property
    def row_bytes(self) -> int:
        return 8 + 4 * self.grads.shape[1] + 4

    def bytes_after(self, new_keys: int) -> int:
        rows = len(self) + new_keys
        return KeyIndex.bytes_for(rows) + rows * self.row_bytes

    def add(
        self,
        keys: npt.NDArray[np.int64],
        grads: npt.NDArray[np.float32],
        steps: npt.NDArray[np.int32] | None = None,
    ) -> None:
        slots = self.index.insert(keys)
        size = len(self.index)
        if size > self.keys.shape[0]:
            capacity = max(size, 2 * self.keys.shape[0], 256)
            old = self.keys.shape[0]
            self.keys = hostmem.grown(self.keys, capacity)
            self.grads = hostmem.grown(self.grads, capacity)
            self.steps = hostmem.grown(self.steps, capacity)
            self.steps[old:] = 1
        self.keys[slots] = keys
        scatter_add_rows(self.grads, slots, grads)
        if steps is not None:
            np.maximum.at(self.steps, slots, steps)

    def contents(self) -> Contents:
        n = len(self)
        return self.keys[:n], self.grads[:n], self.steps[:n]


class GradBuffer:
    """Every worker's pushes to one iteration of one table, until the commit applies them."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._workers: dict[int, WorkerSums] = {}

    @property
    def nbytes(self) -> int:
        return sum(sums.nbytes for sums in self._workers.values())

    def growth(self, keys: npt.NDArray[np.int64], worker: int) -> tuple[int, npt.NDArray[np.int64]]:
        """What adding ``keys`` from ``worker`` costs: the bytes the buffer grows by, and
        the distinct keys no worker has pushed to this iteration yet."""
        sums = self._workers.get(worker) or WorkerSums(self.dim)
        fresh = distinct(keys[sums.index.lookup(keys) < 0])[0]
        grown = sums.bytes_after(fresh.shape[0]) - sums.nbytes
        for other, held in self._workers.items():
            if other != worker:
                fresh = fresh[held.index.lookup(fresh) < 0]
        return grown, fresh

    def add(
        self,
        keys: npt.NDArray[np.int64],
        grads: npt.NDArray[np.float32],
        steps: npt.NDArray[np.int32] | None = None,
        worker: int = 0,
    ) -> None:
        sums = self._workers.get(worker)
        if sums is None:
            sums = self._workers[worker] = WorkerSums(self.dim)
        sums.add(keys, grads, steps)

    def contents(self) -> Contents:
        """Distinct keys, their gradients summed over workers in ascending worker id, and
        the largest step count any worker pushed for each."""
        parts = [self._workers[w].contents() for w in sorted(self._workers)]
        if not parts:
            return np.empty(0, np.int64), np.empty((0, self.dim), np.float32), np.empty(0, np.int32)
        if len(parts) == 1:
            return parts[0]
        keys, inverse = distinct(np.concatenate([k for k, _, _ in parts]))
        grads = np.zeros((keys.shape[0], self.dim), dtype=np.float32)
        scatter_add_rows(grads, inverse, np.concatenate([g for _, g, _ in parts]))
        steps = np.ones(keys.shape[0], dtype=np.int32)
        np.maximum.at(steps, inverse, np.concatenate([s for _, _, s in parts]))
        return keys, grads, steps
