"""Scoring with an exported model in one process: no shards, no scheduler.

A :class:`Predictor` loads a model directory (``heraldps.model_export``) and scores
data the way the run that trained it evaluated its held-out data: the job's data
spec (columns, dense transforms with the training data's statistics, the key
function) turns rows into keys and dense features, ``select`` lays them out, and the
worker's own ``DeepFM.predict`` runs the forward pass, in chunks of the same
65,536 rows. It lives beside the model it runs (a service may import only the common
package and itself), and the common package keeps the file format.

A key the export lacks (training never updated its row) gets its initializer value,
as a shard answers a pull of an unseen key; ``unseen="zero"`` gives it zeros instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from heraldps.data import DataSpec, SparseDataset, stream
from heraldps.errors import InvalidArgument
from heraldps.job import EMBEDDING_TABLE, TrainingJob
from heraldps.model import DeepFM
from heraldps.model_export import ExportedModel, ModelError, ModelTable, read_model
from worker_client.minibatch import select

EVAL_CHUNK_ROWS = 65_536  # the rows ``heraldps local`` evaluates at once
UNSEEN = ("initializer", "zero")


def rows_of(table: ModelTable, keys: npt.NDArray[np.int64], unseen: str) -> np.ndarray:
    """The rows of ``keys``: the exported row where there is one, else the initializer's
    row (``unseen="initializer"``) or zeros."""
    dim = table.values.shape[1]
    at = np.searchsorted(table.keys, keys)
    found = at < table.keys.shape[0]
    found[found] = table.keys[at[found]] == keys[found]
    out = np.zeros((keys.shape[0], dim), np.float32)
    out[found] = table.values[at[found]]
    missing = ~found
    if unseen == "initializer" and missing.any():
        out[missing] = table.initializer.generate(keys[missing], dim)
    return out


class Predictor:
    """An exported model, ready to score data files and batches of rows."""

    def __init__(self, model: ExportedModel, unseen: str = "initializer") -> None:
        if unseen not in UNSEEN:
            raise InvalidArgument(f"unseen must be one of {', '.join(UNSEEN)}, got {unseen!r}")
        try:
            self.job = TrainingJob.from_json(model.job_json)
        except (ValueError, TypeError) as exc:
            raise ModelError(
                f"the model's job.json does not describe a training job ({exc})"
            ) from None
        if EMBEDDING_TABLE not in model.tables:
            raise ModelError(f"the model has no {EMBEDDING_TABLE!r} table; export it again")
        self.table = model.tables[EMBEDDING_TABLE]
        self.model: DeepFM = self.job.model()
        if self.table.values.shape[1] != self.job.embedding_dim:
            raise ModelError(f"the {EMBEDDING_TABLE!r} table's rows are "
                             f"{self.table.values.shape[1]} wide, the job says "
                             f"{self.job.embedding_dim}")  # fmt: skip
        if model.dense.shape[0] != self.model.dense_size:
            raise ModelError(f"the model's dense vector holds {model.dense.shape[0]} values, "
                             f"the job's DeepFM needs {self.model.dense_size}")  # fmt: skip
        self.dense = model.dense
        self.unseen = unseen

    @classmethod
    def load(cls, path: str | Path, unseen: str = "initializer") -> Predictor:
        """The model directory ``path``, checked (``ModelError`` when it is not one)."""
        return cls(read_model(path), unseen)

    def data_spec(self, path: str, no_label: bool = False) -> DataSpec:
        """How the training run would read ``path``: its columns, transforms and statistics;
        ``no_label``: the file has no label column (every label reads 0)."""
        spec = self.job.data_spec(path)
        if no_label and not spec.no_label:
            spec = DataSpec.from_dict({**spec.to_dict(), "label_column": None, "no_label": True})
        return spec

    def score(self, rows: SparseDataset) -> npt.NDArray[np.float32]:
        """Click probabilities of a batch of rows read with ``heraldps.data``, one per row."""
        mb = select(rows)
        emb = rows_of(self.table, mb.keys, self.unseen)
        return np.asarray(self.model.predict(self.dense, emb, mb.field_rows, mb.dense))

    def chunks(
        self, path: str, no_label: bool = False
    ) -> Iterator[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
        """``(probabilities, labels)`` of the file ``path``, chunk by chunk."""
        for chunk in stream(self.data_spec(path, no_label), EVAL_CHUNK_ROWS):
            yield self.score(chunk), np.asarray(chunk.labels, np.float32)

    def score_file(
        self, path: str, no_label: bool = False
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Probabilities and labels of every row of ``path``, in file order."""
        parts = list(self.chunks(path, no_label))
        if not parts:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        return (np.concatenate([p for p, _ in parts]), np.concatenate([y for _, y in parts]))
