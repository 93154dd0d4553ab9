"""Compiled row kernels the stores need where NumPy has no single call."""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt


@numba.njit(cache=True, nogil=True)
def scatter_add_rows(
    target: npt.NDArray[np.float32], rows: npt.NDArray[np.int64], src: npt.NDArray[np.float32]
) -> None:  # pragma: no cover - compiled
    """``target[rows[i]] += src[i]`` for every i, duplicates accumulated in order."""
    dim = src.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(dim):
            target[r, j] += src[i, j]


@numba.njit(cache=True, nogil=True)
def gather_rows(
    src: npt.NDArray[np.float32], rows: npt.NDArray[np.int64]
) -> npt.NDArray[np.float32]:  # pragma: no cover - compiled
    """``src[rows]`` for a 2-D array: a plain row copy loop, faster than fancy indexing."""
    width = src.shape[1]
    out = np.empty((rows.shape[0], width), dtype=src.dtype)
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(width):
            out[i, j] = src[r, j]
    return out
