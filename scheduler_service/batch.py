"""The scheduler's input: one global batch of sparse samples as CSR."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from heraldps.data.dataset import SparseDataset
from heraldps.errors import InvalidArgument


@dataclass(frozen=True)
class Batch:
    """Sample ``i`` has keys ``keys[offsets[i]:offsets[i + 1]]`` (any order, duplicates allowed).

    ``iteration`` numbers the batch; the scheduler requires consecutive
    iterations. The batch is split evenly: ``samples_per_worker`` samples
    for each of the ``num_workers`` workers. ``data``, when the feeder sent whole
    samples, is the batch itself (its offsets and keys are ``offsets`` and ``keys``);
    each worker's plan then carries its samples.

    ``lr_scale`` multiplies every optimizer's learning rate in this iteration (its plans
    and its commit carry it); ``flush``: the PS must hold the exact model once the
    iteration is committed (every dirty row written back, plans released at once);
    ``checkpoint``: also snapshot the PS once it is committed (implies ``flush``).
    """

    iteration: int
    offsets: npt.NDArray[np.int64]
    keys: npt.NDArray[np.int64]
    num_workers: int
    data: SparseDataset | None = None
    lr_scale: float = 1.0
    flush: bool = False
    checkpoint: bool = False

    def __post_init__(self) -> None:
        offsets, keys = self.offsets, self.keys
        if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0:
            raise InvalidArgument("batch offsets must be 1-D CSR row pointers starting at 0")
        if np.any(np.diff(offsets) < 0) or offsets[-1] != keys.shape[0]:
            raise InvalidArgument(
                f"batch offsets must be non-decreasing and end at len(keys)={keys.shape[0]}, "
                f"got last offset {int(offsets[-1])}"
            )
        if self.num_workers < 1:
            raise InvalidArgument(f"num_workers must be >= 1, got {self.num_workers}")
        if self.samples == 0 or self.samples % self.num_workers:
            raise InvalidArgument(
                f"a batch of {self.samples} samples cannot be split evenly over "
                f"{self.num_workers} workers; send a multiple of {self.num_workers} samples"
            )

    @classmethod
    def of_samples(
        cls,
        iteration: int,
        data: SparseDataset,
        num_workers: int,
        lr_scale: float = 1.0,
        flush: bool = False,
        checkpoint: bool = False,
    ) -> Batch:
        """A batch of whole samples: planned by their keys, handed out with the plans."""
        return cls(iteration, data.offsets, data.keys, num_workers, data, lr_scale,
                   flush or checkpoint, checkpoint)  # fmt: skip

    @classmethod
    def from_arrays(
        cls, iteration: int, offsets: npt.ArrayLike, keys: npt.ArrayLike, num_workers: int
    ) -> Batch:
        return cls(
            iteration,
            np.ascontiguousarray(offsets, dtype=np.int64),
            np.ascontiguousarray(keys, dtype=np.int64),
            num_workers,
        )

    @property
    def samples(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def samples_per_worker(self) -> int:
        return self.samples // self.num_workers

    def sample_keys(self, sample: int) -> npt.NDArray[np.int64]:
        return self.keys[self.offsets[sample] : self.offsets[sample + 1]]
