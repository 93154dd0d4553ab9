"""A single-process PyTorch DeepFM: the baseline ``bench_quality.py`` measures heraldps against.

Written for the benchmark, independently of heraldps's NumPy model, but the same model and
training as ``heraldps train`` (heraldps/model.py, heraldps/optim.py):

- logit = FM second-order term over the field embeddings + MLP(field embeddings, dense
  features) + a linear term on the dense features + a bias (no first-order sparse term);
- MLP layers Linear -> BatchNorm1d -> activation -> dropout (FuxiCTR's order; BN optional),
  then a Linear of width 1; He-uniform weights for hidden layers feeding a ReLU (Glorot for
  the others and the output), zero biases, zero linear term;
- embedding rows Normal(0, 0.01); one table, each field's raw values mapped to their own rows
  (values unseen in training share one row per field);
- Adam on the embedding rows a batch uses only (sparse Adam with a per-row step count, as
  the PS applies it), with ``l2 * w`` added to the gradient of each used row once (unique
  rows counted once: ``(l2 / 2) * ||rows used||^2``); ``torch.optim.Adam`` on the dense
  parameters with coupled ``weight_decay``; the mean logloss of the batch;
- validation AUC after every epoch, learning rate x0.1 when it does not improve, early stop
  after ``patience`` epochs without improvement, the best epoch's model evaluated on test.

Run alone (from the repository root; needs the ``torch`` extra)::

    nice -n 10 python benchmarks/torch_deepfm.py --data ../shared/data/frappe_x1
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import torch
from torch import nn

from worker_client.evaluation import auc, logloss

FRAPPE_FIELDS = (
    "user", "item", "daytime", "weekday", "isweekend", "homework", "cost", "weather", "country",
    "city",
)  # fmt: skip


@dataclass(frozen=True)
class TorchConfig:
    """Model and training settings; the defaults are BARS's DeepFM on Frappe_x1."""

    embedding_dim: int = 10
    hidden: tuple[int, ...] = (400, 400, 400)
    activation: str = "relu"  # relu, leaky_relu, tanh, sigmoid
    dropout: float = 0.2
    batch_norm: bool = True
    lr: float = 1e-3
    eps: float = 1e-6  # heraldps's Adam job default (torch's own is 1e-8)
    batch_size: int = 4096
    embedding_l2: float = 0.05
    weight_decay: float = 0.0
    # "rows": Adam on the rows a batch uses (the PS's); "table": torch.optim.Adam on the whole
    # table, whose untouched rows keep moving with their moments (a plain PyTorch model's).
    embedding_adam: str = "rows"
    max_epochs: int = 100
    patience: int = 2
    lr_decay: float = 0.1
    seed: int = 0
    threads: int = 2


@dataclass(frozen=True)
class Columns:
    """Which columns of the CSV files are the label, the sparse and the dense features."""

    label: str = "label"
    sparse: tuple[str, ...] = FRAPPE_FIELDS
    dense: tuple[str, ...] = ()
    dense_transform: str = "standardize"  # or log1p (Criteo's counts) or raw


@dataclass
class Split:
    """One split in memory: row indices into the one embedding table, dense x, labels."""

    rows: torch.Tensor  # int64 [n, fields]
    dense: torch.Tensor  # float32 [n, dense]
    labels: torch.Tensor  # float32 [n]

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class Encoding:
    """Each field's training values -> embedding rows; row ``offset[f]`` is field f's
    row for values unseen in training. Dense statistics are the training split's."""

    vocab: list[np.ndarray]
    offsets: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    columns: Columns

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])


@dataclass
class Result:
    """What a run reached: the best epoch's test figures and the training speed."""

    test_auc: float
    test_logloss: float
    best_epoch: int
    epochs: int
    seconds: float  # the whole run: training, validation and test
    train_seconds: float  # training steps only
    train_samples_per_s: float
    train_cpu_seconds: float  # CPU time of the training steps, all threads (a shared machine)
    epochs_log: list[dict[str, float]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


def read_table(path: Path, columns: Columns) -> pa.Table:
    """The label, sparse and dense columns of a CSV with a header (sparse read as text)."""
    names = [columns.label, *columns.sparse, *columns.dense]
    types = {c: pa.string() for c in columns.sparse}
    types.update({c: pa.float64() for c in columns.dense})
    types[columns.label] = pa.float64()
    options = pacsv.ConvertOptions(include_columns=names, column_types=types)
    return pacsv.read_csv(path, convert_options=options)


def _dense_values(table: pa.Table, columns: Columns) -> np.ndarray:
    out = np.zeros((table.num_rows, len(columns.dense)), dtype=np.float64)
    for j, name in enumerate(columns.dense):
        values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        values = np.where(np.isnan(values), 0.0, values)
        if columns.dense_transform == "log1p":
            values = np.log1p(np.maximum(values, 0.0))
        out[:, j] = values
    return out


def fit_encoding(train: pa.Table, columns: Columns) -> Encoding:
    """Each field's distinct training values, in sorted order, after its unseen-value row."""
    vocab = []
    for name in columns.sparse:
        values = train.column(name).fill_null("").to_numpy(zero_copy_only=False).astype(str)
        vocab.append(np.unique(values))
    sizes = np.array([len(v) + 1 for v in vocab], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    dense = _dense_values(train, columns)
    standardize = columns.dense_transform == "standardize"
    mean = dense.mean(axis=0) if standardize else np.zeros(dense.shape[1])
    std = dense.std(axis=0) if standardize else np.ones(dense.shape[1])
    return Encoding(vocab, offsets, mean, np.where(std > 0, std, 1.0), columns)


def encode(table: pa.Table, enc: Encoding) -> Split:
    rows = np.empty((table.num_rows, len(enc.vocab)), dtype=np.int64)
    for f, name in enumerate(enc.columns.sparse):
        values = table.column(name).fill_null("").to_numpy(zero_copy_only=False).astype(str)
        pos = np.searchsorted(enc.vocab[f], values)
        pos = np.minimum(pos, len(enc.vocab[f]) - 1)
        known = enc.vocab[f][pos] == values
        rows[:, f] = enc.offsets[f] + np.where(known, pos + 1, 0)
    dense = (_dense_values(table, enc.columns) - enc.mean) / enc.std
    labels = table.column(enc.columns.label).to_numpy(zero_copy_only=False)
    return Split(
        torch.from_numpy(rows),
        torch.from_numpy(dense.astype(np.float32)),
        torch.from_numpy(labels.astype(np.float32)),
    )


def load_splits(
    data_dir: Path, columns: Columns, names: tuple[str, str, str] = ("train", "valid", "test")
) -> tuple[Encoding, Split, Split, Split]:
    """``DIR/{train,valid,test}.csv``, encoded with the training split's vocabulary."""
    tables = [read_table(data_dir / f"{n}.csv", columns) for n in names]
    enc = fit_encoding(tables[0], columns)
    train, valid, test = (encode(t, enc) for t in tables)
    return enc, train, valid, test


_ACTIVATIONS = {"relu": nn.ReLU, "leaky_relu": lambda: nn.LeakyReLU(0.01), "tanh": nn.Tanh,
                "sigmoid": nn.Sigmoid}  # fmt: skip
_HE_INIT = ("relu", "leaky_relu")


class TorchDeepFM(nn.Module):
    """DeepFM as heraldps/model.py defines it, with optional batch normalization."""

    def __init__(self, num_rows: int, num_fields: int, num_dense: int, cfg: TorchConfig) -> None:
        super().__init__()
        if cfg.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(_ACTIVATIONS)}")
        self.embedding = nn.Parameter(torch.randn(num_rows, cfg.embedding_dim) * 0.01)
        layers: list[nn.Module] = []
        width = num_fields * cfg.embedding_dim + num_dense
        for hidden in cfg.hidden:
            linear = nn.Linear(width, hidden)
            limit = math.sqrt(6.0 / (width if cfg.activation in _HE_INIT else width + hidden))
            nn.init.uniform_(linear.weight, -limit, limit)
            nn.init.zeros_(linear.bias)
            layers.append(linear)
            if cfg.batch_norm:
                layers.append(nn.BatchNorm1d(hidden))
            layers.append(_ACTIVATIONS[cfg.activation]())
            if cfg.dropout > 0:
                layers.append(nn.Dropout(cfg.dropout))
            width = hidden
        out = nn.Linear(width, 1)
        nn.init.xavier_uniform_(out.weight)
        nn.init.zeros_(out.bias)
        layers.append(out)
        self.mlp = nn.Sequential(*layers)
        self.linear = nn.Parameter(torch.zeros(num_dense))
        self.bias = nn.Parameter(torch.zeros(1))

    def logits(self, x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Logits from the batch's field embeddings ``x`` [B, F, D] and dense features."""
        s = x.sum(dim=1)
        fm = 0.5 * (s * s - (x * x).sum(dim=1)).sum(dim=1)
        h = torch.cat([x.reshape(x.shape[0], -1), dense], dim=1)
        return fm + self.mlp(h)[:, 0] + dense @ self.linear + self.bias

    def forward(self, rows: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.logits(self.embedding[rows], dense)


class RowAdam:
    """Adam on the rows a batch uses, each with its own step count (heraldps.optim.Adam):
    rows a batch does not use keep their value and moments."""

    def __init__(self, table: torch.Tensor, cfg: TorchConfig) -> None:
        self.table = table
        self.lr, self.eps, self.l2 = cfg.lr, cfg.eps, cfg.embedding_l2
        self.beta1, self.beta2 = 0.9, 0.999
        self.m = torch.zeros_like(table)
        self.v = torch.zeros_like(table)
        self.step = torch.zeros(table.shape[0], 1)

    @torch.no_grad()
    def apply(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """``grads``: the summed gradient of each unique row in ``rows``."""
        values = self.table[rows]
        if self.l2:
            grads = grads + self.l2 * values
        m = self.m[rows] * self.beta1 + (1 - self.beta1) * grads
        v = self.v[rows] * self.beta2 + (1 - self.beta2) * grads * grads
        step = self.step[rows] + 1
        m_hat = m / (1 - self.beta1**step)
        v_hat = v / (1 - self.beta2**step)
        self.table[rows] = values - self.lr * m_hat / (v_hat.sqrt() + self.eps)
        self.m[rows], self.v[rows], self.step[rows] = m, v, step


class TableAdam(RowAdam):
    """``torch.optim.Adam`` on the whole table (``embedding_adam="table"``), fed the batch's
    gradient with ``l2 * w`` on the rows the batch uses: every row moves at every step."""

    def __init__(self, table: torch.Tensor, cfg: TorchConfig) -> None:
        super().__init__(table, cfg)
        self.param = torch.nn.Parameter(table, requires_grad=False)
        self.adam = torch.optim.Adam([self.param], lr=cfg.lr, eps=cfg.eps)

    @torch.no_grad()
    def apply(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        full = torch.zeros_like(self.table)
        full[rows] = grads + self.l2 * self.table[rows] if self.l2 else grads
        self.param.grad = full
        for group in self.adam.param_groups:
            group["lr"] = self.lr
        self.adam.step()


def train_step(
    model: TorchDeepFM, rows_opt: RowAdam, dense_opt: torch.optim.Optimizer, batch: Split
) -> float:
    """One step; the loss is the batch's mean logloss. Returns its summed logloss."""
    unique, inverse = torch.unique(batch.rows, return_inverse=True)
    used = model.embedding.detach()[unique].requires_grad_(True)
    logits = model.logits(used[inverse], batch.dense)
    loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
    dense_opt.zero_grad(set_to_none=True)
    loss.backward()
    dense_opt.step()
    assert used.grad is not None
    rows_opt.apply(unique, used.grad)
    return float(loss.detach()) * len(batch)


@torch.no_grad()
def predict(model: TorchDeepFM, split: Split, batch_size: int = 16384) -> np.ndarray:
    model.eval()
    out = [
        torch.sigmoid(model(split.rows[i : i + batch_size], split.dense[i : i + batch_size]))
        for i in range(0, len(split), batch_size)
    ]
    return torch.cat(out).numpy()


def evaluate(model: TorchDeepFM, split: Split) -> tuple[float, float]:
    """(AUC, logloss) with heraldps's metric functions."""
    probs = predict(model, split)
    labels = split.labels.numpy()
    return auc(labels, probs), logloss(labels, probs)


def _batches(split: Split, batch_size: int, generator: torch.Generator) -> list[Split]:
    order = torch.randperm(len(split), generator=generator)
    return [
        Split(split.rows[idx], split.dense[idx], split.labels[idx])
        for idx in (order[i : i + batch_size] for i in range(0, len(split), batch_size))
    ]


def fit(
    train: Split,
    valid: Split,
    test: Split,
    num_rows: int,
    cfg: TorchConfig,
    log: Any = print,
) -> Result:
    """Train with per-epoch validation, plateau decay and early stopping; test the best epoch."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    start = time.perf_counter()
    model = TorchDeepFM(num_rows, train.rows.shape[1], train.dense.shape[1], cfg)
    dense = [p for n, p in model.named_parameters() if n != "embedding"]
    dense_opt = torch.optim.Adam(dense, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.embedding_adam not in ("rows", "table"):
        raise ValueError(f"embedding_adam must be rows or table, got {cfg.embedding_adam!r}")
    rows_opt = (RowAdam if cfg.embedding_adam == "rows" else TableAdam)(model.embedding.data, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    best_auc, best_epoch, best_state, stale = -1.0, 0, None, 0
    train_seconds, train_cpu, trained, epochs_log = 0.0, 0.0, 0, []
    epoch = 0
    for epoch in range(1, cfg.max_epochs + 1):
        model.train()
        batches = _batches(train, cfg.batch_size, generator)
        t0, cpu0 = time.perf_counter(), time.process_time()
        loss_sum = sum(train_step(model, rows_opt, dense_opt, b) for b in batches)
        seconds = time.perf_counter() - t0
        train_seconds += seconds
        train_cpu += time.process_time() - cpu0
        trained += len(train)
        val_auc, val_logloss = evaluate(model, valid)
        line = {"epoch": epoch, "train_logloss": loss_sum / len(train), "valid_auc": val_auc,
                "valid_logloss": val_logloss, "samples_per_s": len(train) / seconds,
                "lr": rows_opt.lr}  # fmt: skip
        epochs_log.append(line)
        log(f"torch epoch {epoch}: train logloss {line['train_logloss']:.5f}  valid AUC "
            f"{val_auc:.5f} logloss {val_logloss:.5f}  {line['samples_per_s']:,.0f} samples/s  "
            f"lr {rows_opt.lr:g}")  # fmt: skip
        if val_auc > best_auc:
            best_auc, best_epoch, stale = val_auc, epoch, 0
            best_state = copy.deepcopy(model.state_dict())
            continue
        stale += 1
        if stale >= cfg.patience:
            break
        rows_opt.lr *= cfg.lr_decay
        for group in dense_opt.param_groups:
            group["lr"] *= cfg.lr_decay
    assert best_state is not None
    model.load_state_dict(best_state)
    test_auc, test_logloss = evaluate(model, test)
    log(f"torch test (epoch {best_epoch}): AUC {test_auc:.5f} logloss {test_logloss:.5f}")
    return Result(
        test_auc=test_auc,
        test_logloss=test_logloss,
        best_epoch=best_epoch,
        epochs=epoch,
        seconds=time.perf_counter() - start,
        train_seconds=train_seconds,
        train_samples_per_s=trained / train_seconds,
        train_cpu_seconds=train_cpu,
        epochs_log=epochs_log,
        config=asdict(cfg),
    )


def run(data_dir: Path, cfg: TorchConfig, columns: Columns = Columns(), log: Any = print) -> Result:
    """Read ``data_dir``'s three splits and :func:`fit`."""
    enc, train, valid, test = load_splits(data_dir, columns)
    return fit(train, valid, test, enc.num_rows, cfg, log)


def _hidden(text: str) -> tuple[int, ...]:
    return tuple(int(w) for w in text.split(",") if w)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("../shared/data/frappe_x1"),
                   help="a directory with train.csv, valid.csv and test.csv")  # fmt: skip
    p.add_argument("--label", default="label")
    p.add_argument("--sparse", default=",".join(FRAPPE_FIELDS))
    p.add_argument("--dense", default="")
    d = TorchConfig()
    p.add_argument("--embedding-dim", type=int, default=d.embedding_dim)
    p.add_argument("--hidden-layers", type=_hidden, default=d.hidden)
    p.add_argument("--activation", default=d.activation, choices=sorted(_ACTIVATIONS))
    p.add_argument("--dropout", type=float, default=d.dropout)
    p.add_argument("--no-batch-norm", action="store_true")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--embedding-l2", type=float, default=d.embedding_l2)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--embedding-adam", choices=("rows", "table"), default=d.embedding_adam)
    p.add_argument("--max-epochs", type=int, default=d.max_epochs)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads)
    args = p.parse_args()
    cfg = TorchConfig(
        embedding_dim=args.embedding_dim, hidden=args.hidden_layers, activation=args.activation,
        dropout=args.dropout, batch_norm=not args.no_batch_norm, lr=args.lr,
        batch_size=args.batch_size, embedding_l2=args.embedding_l2,
        weight_decay=args.weight_decay, embedding_adam=args.embedding_adam,
        max_epochs=args.max_epochs, seed=args.seed,
        threads=args.threads,
    )  # fmt: skip
    columns = Columns(args.label, tuple(args.sparse.split(",")), _hidden_names(args.dense))
    result = run(args.data, cfg, columns)
    print(json.dumps({k: v for k, v in asdict(result).items() if k != "epochs_log"}, indent=2))


def _hidden_names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.split(",") if n)


if __name__ == "__main__":
    main()
