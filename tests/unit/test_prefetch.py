"""The prefetch hint compiles for the arrays the kernels use and changes nothing."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.jit import njit
from heraldps.prefetch import prefetch


@njit()
def _sum_with_prefetch(rows: npt.NDArray[np.int64], column: npt.NDArray[np.uint64]) -> int:
    total = 0
    for i in range(rows.shape[0]):
        prefetch(rows, (i * 7) % rows.shape[0])
        prefetch(column, i)
        total += rows[i, 0] + np.int64(column[i])
    return total


def test_prefetch_on_2d_rows_and_strided_columns_leaves_values_alone() -> None:
    rows = np.arange(40, dtype=np.int64).reshape(20, 2)
    column = rows.view(np.uint64)[:, 1]  # a strided view, as the mirror's record fields are
    before = rows.copy()
    assert _sum_with_prefetch(rows, column) == int(rows.sum())
    assert np.array_equal(rows, before)
