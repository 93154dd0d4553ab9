"""A worker's share of a global batch, laid out for the model.

The scheduler names samples by their index in the global batch; every
worker reads the same data file and cuts the same global batches, so an
index means the same row everywhere (``global_batches``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from heraldps.datasets import SparseDataset
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


def global_batches(
    dataset: SparseDataset, batch_size: int, iterations: int | None, epochs: int = 1
) -> list[SparseDataset]:
    """Consecutive full batches of ``batch_size`` rows, ``epochs`` passes, capped at
    ``iterations``; a partial last batch of each pass is dropped (as ``simulate`` does)."""
    per_epoch = dataset.rows // batch_size
    if per_epoch == 0:
        raise InvalidArgument(
            f"the data has {dataset.rows} rows, fewer than one global batch of {batch_size}; "
            "lower --workers or --batch-size-per-worker"
        )
    total = per_epoch * epochs if iterations is None else min(iterations, per_epoch * epochs)
    return [
        dataset.row_slice((t % per_epoch) * batch_size, (t % per_epoch + 1) * batch_size)
        for t in range(total)
    ]


def select(batch: SparseDataset, samples: npt.NDArray[np.int64]) -> MiniBatch:
    """The mini-batch of ``samples`` (indices into ``batch``), vectorized."""
    if batch.fields is None:
        raise InvalidArgument("the dataset does not record each key's field; read it with "
                              "heraldps.datasets.read_dataset")  # fmt: skip
    if samples.shape[0] and (samples.min() < 0 or samples.max() >= batch.rows):
        raise InvalidArgument(
            f"sample indices must be in 0..{batch.rows - 1}, got {int(samples.min())}.."
            f"{int(samples.max())}"
        )
    starts = batch.offsets[samples]
    lengths = batch.offsets[samples + 1] - starts
    owner = np.repeat(np.arange(samples.shape[0]), lengths)
    positions = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(
        int(lengths.sum())
    )
    keys, inverse = distinct(batch.keys[positions])
    field_rows = np.full((samples.shape[0], len(batch.sparse_columns)), -1, dtype=np.int64)
    field_rows[owner, batch.fields[positions]] = inverse
    return MiniBatch(keys, field_rows, batch.dense[samples], batch.labels[samples])
