"""Dense parameters (e.g. MLP weights) stored as rows of a table.

A flat tensor is cut into rows of ``row_width`` floats (the last one
zero-padded) under keys ``0..rows-1``, so it trains with exactly the
push/commit semantics of embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from heraldps.client.tables import TableAdmin
from heraldps.init import Zeros
from heraldps.optim import Optimizer

DENSE_ROW_WIDTH = 256


@dataclass(frozen=True)
class DenseParameter:
    """A dense tensor stored as rows ``0..rows-1`` of a table (see ``create_dense``)."""

    name: str
    size: int
    row_width: int

    @property
    def rows(self) -> int:
        return -(-self.size // self.row_width)

    @property
    def keys(self) -> npt.NDArray[np.int64]:
        return np.arange(self.rows, dtype=np.int64)

    def to_rows(self, flat: npt.ArrayLike) -> npt.NDArray[np.float32]:
        flat = np.asarray(flat, dtype=np.float32).reshape(-1)
        if flat.shape[0] != self.size:
            raise ValueError(f"dense {self.name!r} has {self.size} elements, got {flat.shape[0]}")
        padded = np.zeros(self.rows * self.row_width, dtype=np.float32)
        padded[: self.size] = flat
        return padded.reshape(self.rows, self.row_width)

    def from_rows(self, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return rows.reshape(-1)[: self.size].copy()


class DenseParameters(TableAdmin):
    """Create, pull and push dense tensors through their tables."""

    def create_dense(
        self,
        name: str,
        size: int,
        optimizer: Optimizer,
        initial: npt.ArrayLike | None = None,
        row_width: int = DENSE_ROW_WIDTH,
    ) -> DenseParameter:
        """Store a dense tensor as table ``name``.

        ``initial`` is written with a version-guarded write-back (base 0), so it
        lands only on untouched rows (``VersionConflict`` once they trained).
        """
        dense = DenseParameter(name, size, min(row_width, size))
        self.create_table(name, dense.row_width, optimizer, Zeros())
        if initial is not None:
            rows = dense.to_rows(initial)
            state = optimizer.init_state(dense.rows, dense.row_width)
            zeros = np.zeros(dense.rows, dtype=np.int64)
            self.write_back(name, dense.keys, rows, state, zeros, zeros)
        return dense

    def pull_dense(self, dense: DenseParameter) -> npt.NDArray[np.float32]:
        values, _ = self.pull(dense.name, dense.keys)
        return dense.from_rows(values)

    def push_dense_gradients(
        self, dense: DenseParameter, grad: npt.ArrayLike, iteration: int, worker: int = 0
    ) -> None:
        self.push_gradients(dense.name, dense.keys, dense.to_rows(grad), iteration,
                            worker=worker)  # fmt: skip
