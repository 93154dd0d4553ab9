"""``SparseDataset``: rows of sparse keys in CSR form, labels and dense features.

Every reader path yields these (``heraldps.data.reader``); the scheduler, workers and
the simulator consume them. ``concat`` joins the bounded chunks of a stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.jit import njit


@dataclass(frozen=True, eq=False)
class SparseDataset:
    """Rows of sparse keys in CSR form, with labels and dense features.

    ``keys[offsets[r]:offsets[r + 1]]`` are row ``r``'s keys, in
    ``sparse_columns`` order, one per non-empty categorical cell;
    ``fields[i]`` is the position in ``sparse_columns`` of the column key
    ``i`` came from (models need it to place a key's embedding; None for
    hand-built datasets that do not say). Missing dense cells are 0.0.
    Equality is identity (arrays make ``==`` ambiguous).
    """

    offsets: npt.NDArray[np.int64]
    keys: npt.NDArray[np.int64]
    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    sparse_columns: tuple[str, ...]
    dense_columns: tuple[str, ...]
    fields: npt.NDArray[np.int32] | None = None

    def __post_init__(self) -> None:
        _check_dataset(self)

    @property
    def rows(self) -> int:
        return int(self.labels.shape[0])

    def distinct_keys(self) -> int:
        """Number of distinct keys: the embedding rows this data touches."""
        return int(np.unique(self.keys).size)

    def row_slice(self, start: int, stop: int) -> SparseDataset:
        """Rows ``[start, stop)`` as views, with offsets rebased to 0."""
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(
                f"row_slice({start}, {stop}) is out of range for {self.rows} rows; "
                f"use 0 <= start <= stop <= {self.rows}"
            )
        offsets = self.offsets[start : stop + 1] - self.offsets[start]
        offsets.flags.writeable = False
        keys = slice(int(self.offsets[start]), int(self.offsets[stop]))
        return SparseDataset(
            offsets=offsets,
            keys=self.keys[keys],
            labels=self.labels[start:stop],
            dense=self.dense[start:stop],
            sparse_columns=self.sparse_columns,
            dense_columns=self.dense_columns,
            fields=None if self.fields is None else self.fields[keys],
        )

    def take(self, rows: npt.NDArray[np.int64]) -> SparseDataset:
        """The rows ``rows`` (any order, repeats allowed) as a new dataset: one compiled
        pass copies each row's keys (and fields) in place."""
        if rows.shape[0] and (rows.min() < 0 or rows.max() >= self.rows):
            raise ValueError(
                f"row indices must be in 0..{self.rows - 1}, got {int(rows.min())}.."
                f"{int(rows.max())}"
            )
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        starts = self.offsets[rows]
        lengths = self.offsets[rows + 1] - starts
        offsets = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        keys = np.empty(int(offsets[-1]), dtype=np.int64)
        _gather_runs(self.keys, starts, offsets, keys)
        fields = None
        if self.fields is not None:
            fields = np.empty(int(offsets[-1]), dtype=np.int32)
            _gather_runs(self.fields, starts, offsets, fields)
        return SparseDataset(
            offsets=offsets,
            keys=keys,
            labels=self.labels[rows],
            dense=self.dense[rows],
            sparse_columns=self.sparse_columns,
            dense_columns=self.dense_columns,
            fields=fields,
        )

    def batches(self, batch_size: int, limit: int | None = None) -> Iterator[SparseDataset]:
        """Consecutive full batches; the partial tail is dropped so every step has equal size."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        count = self.rows // batch_size
        if limit is not None:
            count = min(count, limit)
        return (self.row_slice(b * batch_size, (b + 1) * batch_size) for b in range(count))


@njit(nogil=True)
def _gather_runs(
    source: npt.NDArray[Any],
    starts: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    out: npt.NDArray[Any],
) -> None:  # pragma: no cover - compiled
    """``out[offsets[i]:offsets[i + 1]]`` = the run of ``source`` from ``starts[i]``."""
    for i in range(starts.shape[0]):
        s = starts[i]
        o = offsets[i]
        for j in range(offsets[i + 1] - o):
            out[o + j] = source[s + j]


def _check_dataset(ds: SparseDataset) -> None:
    """Reject inconsistent arrays at construction, not deep inside a training step."""
    rows = ds.labels.shape[0]
    problems = []
    if ds.offsets.dtype != np.int64 or ds.keys.dtype != np.int64:
        problems.append("offsets and keys must be int64")
    if ds.labels.dtype != np.float32 or ds.dense.dtype != np.float32:
        problems.append("labels and dense must be float32")
    if ds.labels.ndim != 1 or ds.keys.ndim != 1 or ds.offsets.shape != (rows + 1,):
        problems.append(f"need labels [rows], keys [n], offsets [rows + 1] with rows={rows}")
    elif ds.offsets[0] != 0 or ds.offsets[-1] != ds.keys.shape[0]:
        problems.append("offsets must start at 0 and end at len(keys)")
    elif rows and bool(np.any(np.diff(ds.offsets) < 0)):
        problems.append("offsets must be non-decreasing")
    if ds.dense.shape != (rows, len(ds.dense_columns)):
        problems.append(f"dense must have shape (rows, {len(ds.dense_columns)})")
    if ds.fields is not None and (ds.fields.dtype != np.int32 or ds.fields.shape != ds.keys.shape):
        problems.append("fields must be int32 with one entry per key")
    if problems:
        raise ValueError("inconsistent SparseDataset: " + "; ".join(problems))


def concat(parts: Sequence[SparseDataset]) -> SparseDataset:
    """The rows of ``parts`` one after another, as one dataset (a few NumPy concatenations).

    All parts must have the same columns; ``fields`` is kept only when every part has it.
    """
    if not parts:
        raise ValueError("concat needs at least one SparseDataset")
    first = parts[0]
    for part in parts[1:]:
        if (part.sparse_columns, part.dense_columns) != (first.sparse_columns, first.dense_columns):
            raise ValueError(
                "concat needs parts with the same columns; got "
                f"{part.sparse_columns}/{part.dense_columns} after "
                f"{first.sparse_columns}/{first.dense_columns}"
            )
    if len(parts) == 1:
        return first
    key_counts = np.array([p.keys.shape[0] for p in parts], dtype=np.int64)
    shifts = np.concatenate([[0], np.cumsum(key_counts)[:-1]])
    offsets = np.concatenate(
        [np.zeros(1, dtype=np.int64)]
        + [p.offsets[1:] + s for p, s in zip(parts, shifts, strict=True)]
    )
    fields = (
        None
        if any(p.fields is None for p in parts)
        else np.concatenate([p.fields for p in parts if p.fields is not None])
    )
    keys = np.concatenate([p.keys for p in parts])
    labels = np.concatenate([p.labels for p in parts])
    dense = np.concatenate([p.dense for p in parts])
    for array in (offsets, keys, labels, dense, fields):
        if array is not None:
            array.flags.writeable = False
    return SparseDataset(
        offsets,
        keys,
        labels,
        dense,
        sparse_columns=first.sparse_columns,
        dense_columns=first.dense_columns,
        fields=fields,
    )
