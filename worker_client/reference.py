"""Single-process synchronous training: what every mode with staleness 0 must equal.

The same global batches, model, initializers and optimizer functions as the
cluster, with no PS, cache or scheduler: each iteration computes the
gradient of the mean loss over the whole global batch, sums it per key and
applies the optimizer once per touched row (a row's version counts the
iterations that updated it), and applies the dense gradient to the dense
rows in the PS's row layout. The cluster may differ only by float32
summation order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from heraldps.data.dataset import SparseDataset
from heraldps.job import TrainingJob
from heraldps.keyindex import KeyIndex
from heraldps.optim import scaled
from worker_client.minibatch import global_batches, select


class ReferenceTrainer:
    """Embedding rows in growable arrays; dense parameters as the PS's rows."""

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        self.model = job.model()
        self.optimizer = job.make_optimizer()
        self.initializer = job.make_initializer()
        dim = job.embedding_dim
        self.index = KeyIndex()
        self.values = np.zeros((0, dim), np.float32)
        self.state = np.zeros((0, self.optimizer.state_width(dim)), np.float32)
        self.versions = np.zeros(0, np.int64)
        self.dense_param = job.dense_parameter(self.model.dense_size)
        self.dense_rows = self.dense_param.to_rows(self.model.init_dense())
        self.dense_optimizer = job.dense_optimizer()
        self.dense_state = self.dense_optimizer.init_state(
            self.dense_param.rows, self.dense_param.row_width
        )
        self.losses: list[float] = []

    def _rows(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        known = len(self.index)
        rows = self.index.insert(keys)
        added = len(self.index) - known
        if added:
            fresh = np.empty(added, np.int64)
            fresh[rows[rows >= known] - known] = keys[rows >= known]
            dim = self.job.embedding_dim
            self.values = np.concatenate([self.values, self.initializer.generate(fresh, dim)])
            self.state = np.concatenate([self.state, self.optimizer.init_state(added, dim)])
            self.versions = np.concatenate([self.versions, np.zeros(added, np.int64)])
        return rows

    def step(self, batch: SparseDataset, iteration: int = 0, lr_scale: float = 1.0) -> None:
        """One global batch; ``iteration`` numbers it (from 0), which dropout masks use;
        ``lr_scale`` multiplies both optimizers' lr (a schedule's, as the plans carry it)."""
        mb = select(batch, np.arange(batch.rows, dtype=np.int64))
        rows = self._rows(mb.keys)
        dense = self.dense_param.from_rows(self.dense_rows)
        loss, emb_grad, dense_grad, running = self.model.forward_backward(
            dense, self.values[rows], mb.field_rows, mb.dense, mb.labels,
            loss_scale=float(batch.rows),
            sample_ids=iteration * batch.rows + np.arange(batch.rows, dtype=np.int64),
        )  # fmt: skip
        values, state = self.values[rows], self.state[rows]
        scaled(self.optimizer, lr_scale).apply(values, state, emb_grad)
        self.values[rows], self.state[rows] = values, state
        self.versions[rows] += 1
        scaled(self.dense_optimizer, lr_scale).apply(
            self.dense_rows, self.dense_state, self.dense_param.to_rows(dense_grad)
        )
        if running is not None:  # batch norm's running statistics: written, not trained
            running.write_into(self.dense_rows)
        self.losses.append(loss / batch.rows)

    def train(self, dataset: SparseDataset, lr_scales: Sequence[float] = ()) -> None:
        """The job's global batches of ``dataset``; iteration t with ``lr_scales[t]`` (1.0
        past the end)."""
        for iteration, batch in enumerate(
            global_batches(dataset, self.job.global_batch, self.job.iterations, self.job.epochs)
        ):
            scale = lr_scales[iteration] if iteration < len(lr_scales) else 1.0
            self.step(batch, iteration, scale)

    def rows_of(
        self, keys: npt.NDArray[np.int64]
    ) -> tuple[np.ndarray, np.ndarray, npt.NDArray[np.int64]]:
        """Values, state and versions of ``keys`` (unseen keys: initial rows, version 0)."""
        rows = self._rows(keys)
        return self.values[rows], self.state[rows], self.versions[rows]
