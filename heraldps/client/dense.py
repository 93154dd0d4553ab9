"""Dense parameters (e.g. MLP weights) stored as rows of a table.

A flat tensor is cut into rows of ``row_width`` floats (the last one
zero-padded) under keys ``0..rows-1``, so it trains with exactly the
push/commit semantics of embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from heraldps.client.arguments import integer
from heraldps.client.tables import TableAdmin
from heraldps.errors import InvalidArgument, shown
from heraldps.init import Zeros
from heraldps.optim import Optimizer
from heraldps.spec import MAX_DIM

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
        array = np.asarray(flat) if isinstance(flat, np.ndarray) else _numbers(flat, self.name)
        if array.dtype.kind not in "iuf":
            raise InvalidArgument(f"dense {self.name!r}: values must be real numbers, got "
                                  f"{array.dtype}")  # fmt: skip
        flat = array.astype(np.float32).reshape(-1)
        if flat.shape[0] != self.size:
            raise InvalidArgument(
                f"dense {self.name!r} has {self.size} elements, got {flat.shape[0]}"
            )
        padded = np.zeros(self.rows * self.row_width, dtype=np.float32)
        padded[: self.size] = flat
        return padded.reshape(self.rows, self.row_width)

    def from_rows(self, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return rows.reshape(-1)[: self.size].copy()


def _numbers(values: npt.ArrayLike, name: str) -> np.ndarray:
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"dense {name!r}: not an array of numbers ({exc})") from None


def _dense(dense: object) -> DenseParameter:
    if not isinstance(dense, DenseParameter):
        raise InvalidArgument(
            f"expected the DenseParameter create_dense returned, got {shown(dense)}"
        )
    return dense


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
        size = integer(size, f"create_dense {shown(name)}: size", 1)
        row_width = integer(row_width, f"create_dense {shown(name)}: row_width", 1, MAX_DIM)
        dense = DenseParameter(name, size, min(row_width, size))
        self.create_table(name, dense.row_width, optimizer, Zeros())
        if initial is not None:
            rows = dense.to_rows(initial)
            state = optimizer.init_state(dense.rows, dense.row_width)
            zeros = np.zeros(dense.rows, dtype=np.int64)
            self.write_back(name, dense.keys, rows, state, zeros, zeros)
        return dense

    def pull_dense(self, dense: DenseParameter) -> npt.NDArray[np.float32]:
        values, _ = self.pull(_dense(dense).name, dense.keys)
        return dense.from_rows(values)

    def push_dense_gradients(
        self, dense: DenseParameter, grad: npt.ArrayLike, iteration: int, worker: int = 0
    ) -> None:
        self.push_gradients(_dense(dense).name, dense.keys, dense.to_rows(grad), iteration,
                            worker=worker)  # fmt: skip
