"""Compiled row kernels the stores need where NumPy has no single call."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.jit import njit
from heraldps.prefetch import prefetch


@njit(nogil=True)
def scatter_add_rows(
    target: npt.NDArray[np.float32], rows: npt.NDArray[np.int64], src: npt.NDArray[np.float32]
) -> None:  # pragma: no cover - compiled
    """``target[rows[i]] += src[i]`` for every i, duplicates accumulated in order."""
    dim = src.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(dim):
            target[r, j] += src[i, j]


@njit(nogil=True)
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


@njit(nogil=True)
def copy_rows(
    dst: npt.NDArray[np.float32],
    dst_rows: npt.NDArray[np.int64],
    src: npt.NDArray[np.float32],
    src_rows: npt.NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    """``dst[dst_rows[i]] = src[src_rows[i]]``: one pass, no temporary (``src_rows`` may be
    ``arange``-like; pass ``dst_rows`` < 0 to skip an entry)."""
    width = src.shape[1]
    for i in range(dst_rows.shape[0]):
        d = dst_rows[i]
        if d < 0:
            continue
        s = src_rows[i]
        for j in range(width):
            dst[d, j] = src[s, j]


@njit(nogil=True)
def copy_clocks(
    versions: npt.NDArray[np.int64],
    changed: npt.NDArray[np.int64],
    dst_rows: npt.NDArray[np.int64],
    src_versions: npt.NDArray[np.int64],
    src_changed: npt.NDArray[np.int64],
    src_rows: npt.NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    """``copy_rows`` for a row's version and change mark (int64 each)."""
    for i in range(dst_rows.shape[0]):
        d = dst_rows[i]
        if d >= 0:
            versions[d] = src_versions[src_rows[i]]
            changed[d] = src_changed[src_rows[i]]


# Rows ahead of the one being copied whose cache lines are prefetched: a pull's rows
# are scattered over a table of hundreds of MiB, so nearly every one is a miss.
GATHER_PREFETCH = 8


@njit(nogil=True)
def gather_pull(
    values: npt.NDArray[np.float32],
    state: npt.NDArray[np.float32],
    versions: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    out_values: npt.NDArray[np.float32],
    out_state: npt.NDArray[np.float32],
    out_versions: npt.NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    """``out_values[i] = values[rows[i]]``, the same for versions and (when ``out_state``
    has columns) state: one pass over the rows, each row's lines prefetched
    ``GATHER_PREFETCH`` rows ahead. The outputs may be unaligned views (a message)."""
    n = rows.shape[0]
    dim = values.shape[1]
    width = out_state.shape[1]
    stride = state.shape[1]
    flat_values = values.reshape(-1)
    flat_state = state.reshape(-1)
    for i in range(n):
        if i + GATHER_PREFETCH < n:
            ahead = rows[i + GATHER_PREFETCH]
            for k in range(0, dim, 16):  # 16 float32: one 64-byte line
                prefetch(flat_values, ahead * dim + k)
            for k in range(0, width, 16):
                prefetch(flat_state, ahead * stride + k)
            prefetch(versions, ahead)
        r = rows[i]
        for j in range(dim):
            out_values[i, j] = values[r, j]
        for j in range(width):
            out_state[i, j] = state[r, j]
        out_versions[i] = versions[r]


@njit(nogil=True)
def gather_table_rows(
    values: npt.NDArray[np.float32],
    state: npt.NDArray[np.float32],
    versions: npt.NDArray[np.int64],
    changed: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    out_values: npt.NDArray[np.float32],
    out_state: npt.NDArray[np.float32],
    out_versions: npt.NDArray[np.int64],
    out_changed: npt.NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    """Every column of rows ``rows[i]`` into entry ``i`` of the outputs, one prefetching
    pass (a commit's working copies); entries whose row is < 0 are left as they are."""
    n = rows.shape[0]
    dim = values.shape[1]
    width = state.shape[1]
    flat_values = values.reshape(-1)
    flat_state = state.reshape(-1)
    for i in range(n):
        if i + GATHER_PREFETCH < n:
            ahead = rows[i + GATHER_PREFETCH]
            if ahead >= 0:
                for k in range(0, dim, 16):
                    prefetch(flat_values, ahead * dim + k)
                for k in range(0, width, 16):
                    prefetch(flat_state, ahead * width + k)
                prefetch(versions, ahead)
                prefetch(changed, ahead)
        r = rows[i]
        if r < 0:
            continue
        for j in range(dim):
            out_values[i, j] = values[r, j]
        for j in range(width):
            out_state[i, j] = state[r, j]
        out_versions[i] = versions[r]
        out_changed[i] = changed[r]


@njit(nogil=True)
def scatter_table_rows(
    values: npt.NDArray[np.float32],
    state: npt.NDArray[np.float32],
    versions: npt.NDArray[np.int64],
    changed: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    src_values: npt.NDArray[np.float32],
    src_state: npt.NDArray[np.float32],
    src_versions: npt.NDArray[np.int64],
    src_changed: npt.NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    """Entry ``i`` of the sources into every column of row ``rows[i]`` (distinct rows),
    one prefetching pass: a commit storing what it computed."""
    n = rows.shape[0]
    dim = values.shape[1]
    width = state.shape[1]
    flat_values = values.reshape(-1)
    flat_state = state.reshape(-1)
    for i in range(n):
        if i + GATHER_PREFETCH < n:
            ahead = rows[i + GATHER_PREFETCH]
            for k in range(0, dim, 16):
                prefetch(flat_values, ahead * dim + k)
            for k in range(0, width, 16):
                prefetch(flat_state, ahead * width + k)
            prefetch(versions, ahead)
            prefetch(changed, ahead)
        r = rows[i]
        for j in range(dim):
            values[r, j] = src_values[i, j]
        for j in range(width):
            state[r, j] = src_state[i, j]
        versions[r] = src_versions[i]
        changed[r] = src_changed[i]


@njit(nogil=True)
def first_non_finite(
    values: npt.NDArray[np.float32], state: npt.NDArray[np.float32]
) -> int:  # pragma: no cover - compiled
    """The first row with a NaN or Inf in ``values`` or ``state``; -1 if none."""
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if not np.isfinite(values[i, j]):
                return i
        for j in range(state.shape[1]):
            if not np.isfinite(state[i, j]):
                return i
    return -1
