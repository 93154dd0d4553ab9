"""Global batches of a data set, and a worker's samples laid out for the model.

The feeder cuts the global batches (``global_batches``) and submits them with
their samples; the scheduler names samples by their index in the global
batch and hands each worker its samples inside its plan, where ``select``
lays them out (distinct keys, per-field rows) for the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from heraldps.data import SparseDataset
from heraldps.data.global_batches import global_batches as global_batches  # re-exported
from heraldps.errors import InvalidArgument
from heraldps.keyindex import distinct


@dataclass(frozen=True)
class MiniBatch:
    """``keys``: the distinct keys of the samples, in first-occurrence order;
    ``field_rows[b, f]``: position in ``keys`` of sample b's key of field f, -1 if absent."""

    keys: npt.NDArray[np.int64]
    field_rows: npt.NDArray[np.int64]
    dense: npt.NDArray[np.float32]
    labels: npt.NDArray[np.float32]

    @property
    def samples(self) -> int:
        return int(self.labels.shape[0])


def select(batch: SparseDataset, samples: npt.NDArray[np.int64] | None = None) -> MiniBatch:
    """The mini-batch of ``samples`` (indices into ``batch``; all of them when None)."""
    if batch.fields is None:
        raise InvalidArgument("the dataset does not record each key's field; read it with "
                              "heraldps.data (stream or read_all)")  # fmt: skip
    if samples is not None:
        if samples.shape[0] and (samples.min() < 0 or samples.max() >= batch.rows):
            raise InvalidArgument(
                f"sample indices must be in 0..{batch.rows - 1}, got {int(samples.min())}.."
                f"{int(samples.max())}"
            )
        batch = batch.take(samples)
    assert batch.fields is not None
    owner = np.repeat(np.arange(batch.rows), np.diff(batch.offsets))
    keys, inverse = distinct(batch.keys)
    field_rows = np.full((batch.rows, len(batch.sparse_columns)), -1, dtype=np.int64)
    field_rows[owner, batch.fields] = inverse
    return MiniBatch(keys, field_rows, batch.dense, batch.labels)
