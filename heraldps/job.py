"""What every process of a training run must agree on: data, model, optimizer, tables.

One frozen dataclass, written to JSON by ``heraldps local`` and read by each
worker, so the workers, the data feeder and the single-process reference all
build the same batches, the same initial model and the same optimizer. Only
the feeder (and the single-process reference) read ``data``: workers get their
samples with their plans, and size the model from the column counts here.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heraldps.activations import ACTIVATIONS
from heraldps.client import DENSE_ROW_WIDTH, DenseParameter, PSClient
from heraldps.data import DataSpec, SparseDataset, read_all
from heraldps.data.spec import FORMATS
from heraldps.errors import InvalidArgument
from heraldps.init import Normal
from heraldps.model import DeepFM, ModelConfig
from heraldps.modes import (
    EARLY_WRITE_BACK_ALL,
    check_look_ahead,
    check_prefetch_plans,
    early_write_back_cap,
    mode_named,
)
from heraldps.optim import Optimizer, optimizer_class

DENSE_SYNCS = ("allreduce", "ps")
EMBEDDING_TABLE = "emb"
DENSE_TABLE = "dense"


def check_hidden_layers(hidden: tuple[int, ...], activation: str) -> None:
    """The MLP's shape and activation, refused with the flag to fix before any process starts."""
    if any(width < 1 for width in hidden):
        raise InvalidArgument(
            f"--hidden-layers widths must be >= 1, got {','.join(map(str, hidden))}; "
            "e.g. --hidden-layers 400,400,400 (an empty value: no hidden layer)"
        )
    if activation not in ACTIVATIONS:
        raise InvalidArgument(f"--activation must be one of {', '.join(ACTIVATIONS)}")


@dataclass(frozen=True)
class TrainingJob:
    data: str
    format: str = "criteo"
    max_rows: int | None = None  # train on the first rows only (the rest is held out)
    sparse_columns: tuple[str, ...] | None = None
    label_column: str | None = None
    dense_columns: tuple[str, ...] | None = None
    # One per dense column (log1p, standardize, minmax, raw; none: the format's default) and
    # the first pass's statistics they use, so every process transforms with the same numbers.
    dense_transforms: tuple[str, ...] | None = None
    dense_stats: tuple[dict[str, float], ...] | None = None
    no_label: bool = False  # inference-only data: no label column, labels 0
    # Rows of the training data (its first pass), so the feeder knows the batch count
    # without reading the data twice; None: the feeder counts them.
    train_rows: int | None = None
    distinct_keys: int | None = None  # of the training data (first pass): sizes the services
    workers: int = 4
    batch_size_per_worker: int = 128
    iterations: int | None = None
    epochs: int = 1
    cache_rows: int = 1
    # Rows per worker and iteration the scheduler writes back before anyone needs them
    # (on-demand modes; docs/scheduler.md#early-write-backs). -1: every such row; 0: off.
    early_write_back: int = EARLY_WRITE_BACK_ALL
    # Batches the scheduler sees beyond the plan it releases, 1..32
    # (docs/scheduler.md#look-ahead); 1: one batch, as before.
    look_ahead: int = 1
    # herald_pipelined: plans ahead a worker pulls early rows for, 1..8
    # (docs/scheduler.md#prefetch-beyond-the-next-plan); 1: the next plan, as before.
    prefetch_plans: int = 1
    optimizer: str = "adagrad"
    lr: float | None = None
    # L2 on the embedding rows a step updates and on the dense parameters (weight decay):
    # each optimizer's ``l2`` (grad + l2 * value; see heraldps/optim.py). 0: off.
    embedding_l2: float = 0.0
    weight_decay: float = 0.0
    embedding_dim: int = 8
    hidden: tuple[int, ...] = (64, 32)  # MLP hidden layer widths (--hidden-layers)
    activation: str = "relu"  # of the hidden layers: a name in heraldps.activations
    dropout: float = 0.0  # rate on the hidden layers' outputs in training (0: off)
    # Batch normalization of every hidden layer with the global batch's statistics
    # (heraldps/batch_norm.py); needs dense_sync "allreduce".
    batch_norm: bool = False
    seed: int = 0
    staleness: int = 0
    policy: str = "lru"
    device: str = "cpu"
    dense_sync: str = "allreduce"  # or "ps": see worker_client/dense_sync.py
    dense_checkpoint_every: int = 10  # all-reduce: worker 0 stores the dense model this often

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise InvalidArgument(f"--format must be one of {', '.join(FORMATS)}")
        check_hidden_layers(self.hidden, self.activation)
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidArgument(f"--dropout must be in [0, 1), got {self.dropout}; e.g. 0.1")
        optimizer_class(self.optimizer)  # a registered name, or the error that lists them
        l2s = {"--embedding-l2": self.embedding_l2, "--weight-decay": self.weight_decay}
        for flag, l2 in l2s.items():
            if not (math.isfinite(l2) and l2 >= 0):
                raise InvalidArgument(f"{flag} must be a finite number >= 0 (0: off), got {l2}")
        early_write_back_cap(self.early_write_back)  # -1, 0 or a row count
        check_look_ahead(self.look_ahead, "--look-ahead")
        check_prefetch_plans(self.prefetch_plans, "--prefetch-plans")
        if self.staleness < 0:
            raise InvalidArgument(f"--staleness must be >= 0, got {self.staleness}")
        if self.dense_sync not in DENSE_SYNCS:
            raise InvalidArgument(f"--dense-sync must be one of {', '.join(DENSE_SYNCS)}")
        if self.batch_norm and self.dense_sync == "ps":
            raise InvalidArgument(
                "--batch-norm needs the workers' dense all-reduce, which also sums the batch "
                "statistics: use --dense-sync allreduce (or auto) instead of --dense-sync ps"
            )
        if self.dense_checkpoint_every < 0:
            raise InvalidArgument("--dense-checkpoint-every must be >= 0 (0: at the end only)")
        if self.workers < 1 or self.batch_size_per_worker < 1 or self.epochs < 1:
            raise InvalidArgument("--workers, --batch-size-per-worker and --epochs must be >= 1")

    @property
    def global_batch(self) -> int:
        return self.workers * self.batch_size_per_worker

    @property
    def num_fields(self) -> int:
        """Sparse columns per sample: the model's embedding fields."""
        return self.data_spec().num_fields

    @property
    def num_dense(self) -> int:
        """Dense columns per sample."""
        return self.data_spec().num_dense

    def data_spec(self, path: str | None = None, start_row: int = 0) -> DataSpec:
        """What the streaming reader reads: the training data (its first ``max_rows`` rows),
        or ``path`` (held-out data) with the same columns and transforms, from ``start_row``."""
        return DataSpec.from_dict(
            {
                "source": path or self.data,
                "format": self.format,
                "sparse_columns": self.sparse_columns,
                "label_column": self.label_column,
                "dense_columns": self.dense_columns,
                "dense_transforms": self.dense_transforms,
                "dense_stats": self.dense_stats,
                "no_label": self.no_label,
                "start_row": start_row,
                "stop_row": self.max_rows if path is None else None,
            }
        )

    def model(self, xp: Any = np) -> DeepFM:
        """The job's DeepFM over array module ``xp`` (its dense layout and initial values)."""
        config = ModelConfig(
            num_fields=self.num_fields,
            num_dense=self.num_dense,
            embedding_dim=self.embedding_dim,
            hidden=self.hidden,
            seed=self.seed,
            activation=self.activation,
            dropout=self.dropout,
            batch_norm=self.batch_norm,
        )
        return DeepFM(config, xp)

    def make_optimizer(self) -> Optimizer:
        """The embedding rows' optimizer: the registered one ``optimizer`` names, with its
        job defaults (``Optimizer.job_defaults``), the job's ``lr`` where one is set and
        ``l2=embedding_l2``."""
        return self._optimizer(self.embedding_l2)

    def dense_optimizer(self) -> Optimizer:
        """The dense parameters' optimizer: :meth:`make_optimizer`'s, ``l2=weight_decay``."""
        return self._optimizer(self.weight_decay)

    def _optimizer(self, l2: float) -> Optimizer:
        cls = optimizer_class(self.optimizer)
        params = dict(cls.job_defaults)
        if self.lr is not None:
            params["lr"] = self.lr
        if l2:
            params["l2"] = l2
        return cls(**params)

    @property
    def pushes_steps(self) -> bool:
        """Whether HET pushes carry the local steps each accumulated gradient sums: only
        under staleness, and only for optimizers with state or L2 (k SGD steps of ``g / k``
        are one step of ``g`` without L2, so SGD's pushes stay as they were)."""
        stateful = self.make_optimizer().state_width(self.embedding_dim) > 0
        return self.staleness > 0 and (stateful or self.embedding_l2 > 0)

    def row_bytes(self, mode: str) -> dict[str, int]:
        """Payload bytes of one embedding row per direction in ``mode``: keys and versions 8,
        floats 4. A pull is a key, a version and the values; ``pull_state`` is what its
        optimizer state adds where it comes along (``Traffic.state_pulls``). The final
        flush is a write-back under a plan, a gradient push under HET. HET pushes each
        row's local step count too where ``pushes_steps`` (int32, 4)."""
        dim = self.embedding_dim
        state = self.make_optimizer().state_width(dim)
        het = mode_named(mode).het
        steps = 4 if het and self.pushes_steps else 0
        sizes = {
            "pull": 8 + 8 + 4 * dim,
            "pull_state": 4 * state,
            "grad_push": 8 + 4 * dim + steps,
            "write_back": 8 + 8 + 8 + 4 * (dim + state),
        }
        sizes["final_flush"] = sizes["grad_push" if het else "write_back"]
        return sizes

    def make_initializer(self) -> Normal:
        return Normal(std=0.01, seed=self.seed)

    def dense_parameter(self, size: int) -> DenseParameter:
        return DenseParameter(DENSE_TABLE, size, min(DENSE_ROW_WIDTH, size))

    def read(self, path: str | None = None) -> SparseDataset:
        """The whole data in memory, through the streaming reader: small files and tests
        only (training streams its batches with ``heraldps.data.batches``)."""
        return read_all(self.data_spec(path))

    def create_tables(self, ps: PSClient) -> None:
        """The embedding table and the dense table, each with its optimizer (idempotent)."""
        optimizer = self.make_optimizer()
        ps.create_table(EMBEDDING_TABLE, self.embedding_dim, optimizer, self.make_initializer())
        model = self.model()
        dense = self.dense_optimizer()
        ps.create_dense(DENSE_TABLE, model.dense_size, dense, initial=model.init_dense())

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainingJob:
        raw = json.loads(text)
        for name in ("sparse_columns", "dense_columns", "dense_transforms", "dense_stats",
                     "hidden"):  # fmt: skip
            if raw.get(name) is not None:
                raw[name] = tuple(raw[name])
        return cls(**raw)

    @classmethod
    def load(cls, path: str | Path) -> TrainingJob:
        """A flat ``job.json`` (as ``heraldps local`` and ``heraldps train`` write it) or a
        sectioned job file (``heraldps.job_file``): either drives the feeder and workers."""
        from heraldps.job_file import training_job

        return training_job(path)
