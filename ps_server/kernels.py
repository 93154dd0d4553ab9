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


# How far ahead of the row being copied its cache lines are prefetched: a pull's rows
# are scattered over a table of hundreds of MiB to GBs, so nearly every one is a miss.
# About 64 lines in flight, as rows: 32 rows of dim 16 (2 lines each), 12 of dim 64
# (5 lines). Measured on 65,536 rows of dim 16 from 1M, one core: 8 rows ahead 1.6 ms,
# 32 rows 1.1 ms; dim 64 was 3.2-3.3 ms from 8 to 48 rows (its 17 MB of output bound it).
PREFETCH_LINES = 64
MAX_ROWS_AHEAD = 32


@njit(nogil=True, inline="always")
def _rows_ahead(used: int) -> int:  # pragma: no cover
    """Rows to prefetch ahead when each row reads ``used`` 8-byte words."""
    lines = (used + 7) // 8 + 1  # a record's words straddle one more line than they fill
    return max(4, min(MAX_ROWS_AHEAD, PREFETCH_LINES // lines))


@njit(nogil=True, inline="always")
def _prefetch_record(
    flat: npt.NDArray[np.int64], start: np.int64, used: int
) -> None:  # pragma: no cover
    """The cache lines of words ``start..start+used-1`` of ``flat`` (a record of a table's
    records, flattened once by the caller: a reshape per row costs reference-count
    atomics). Only those lines: prefetching lines a pass does not read costs bandwidth."""
    for k in range(0, used, 8):  # 8 int64: one 64-byte line
        prefetch(flat, start + k)
    prefetch(flat, start + used - 1)


@njit(nogil=True)
def gather_pull(
    records: npt.NDArray[np.int64],
    floats: npt.NDArray[np.float32],
    rows: npt.NDArray[np.int64],
    out_values: npt.NDArray[np.float32],
    out_state: npt.NDArray[np.float32],
    out_versions: npt.NDArray[np.int64],
) -> None:  # pragma: no cover - compiled
    """A pull's rows out of a table's records (``ps_server.table``: words 0 and 1 the
    version and change mark, then the values, then the state; ``floats`` is ``records``
    seen as float32): ``out_values[i]``, ``out_versions[i]`` and, when ``out_state`` has
    columns, ``out_state[i]`` from record ``rows[i]``. One pass, each record's lines
    prefetched ``_rows_ahead`` rows ahead; the outputs may be unaligned views (a
    message)."""
    n = rows.shape[0]
    dim = out_values.shape[1]
    width = out_state.shape[1]
    used = 2 + (dim + width + 1) // 2  # version, change mark, values, state if asked
    words = records.shape[1]
    flat = records.reshape(-1)
    ahead = _rows_ahead(used)
    for i in range(n):
        if i + ahead < n:
            _prefetch_record(flat, rows[i + ahead] * words, used)
        r = rows[i]
        for j in range(dim):
            out_values[i, j] = floats[r, 4 + j]
        for j in range(width):
            out_state[i, j] = floats[r, 4 + dim + j]
        out_versions[i] = records[r, 0]


@njit(nogil=True)
def gather_records(
    records: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], out: npt.NDArray[np.int64]
) -> None:  # pragma: no cover - compiled
    """``out[i] = records[rows[i]]``, whole records, prefetched ahead; entries whose row
    is < 0 are left as they are (a commit's working copies)."""
    n = rows.shape[0]
    words = records.shape[1]
    flat = records.reshape(-1)
    ahead = _rows_ahead(words)
    for i in range(n):
        if i + ahead < n and rows[i + ahead] >= 0:
            _prefetch_record(flat, rows[i + ahead] * words, words)
        r = rows[i]
        if r >= 0:
            for j in range(words):
                out[i, j] = records[r, j]


@njit(nogil=True)
def scatter_records(
    records: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], src: npt.NDArray[np.int64]
) -> None:  # pragma: no cover - compiled
    """``records[rows[i]] = src[i]``, whole records, prefetched ahead (a commit storing
    what it computed; distinct rows)."""
    n = rows.shape[0]
    words = records.shape[1]
    flat = records.reshape(-1)
    ahead = _rows_ahead(words)
    for i in range(n):
        if i + ahead < n:
            _prefetch_record(flat, rows[i + ahead] * words, words)
        r = rows[i]
        for j in range(words):
            records[r, j] = src[i, j]


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
