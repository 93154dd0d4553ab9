"""Train a PyTorch CTR model whose embedding table lives on heraldps.

``PSEmbedding`` is the adapter: an ``nn.Module`` whose forward pulls the rows of
a batch's distinct keys from the PS shards and whose backward pushes their
gradients (one summed row per distinct key) for the iteration. After
``loss.backward()`` the training loop commits the iteration, and the PS applies
the table's optimizer once per key. The embedding optimizer therefore lives on
the PS (here SGD); the small dense network is an ordinary PyTorch module with
a local ``torch.optim.SGD``.

Needs CPU PyTorch (``pip install -e '.[torch]'``). Run from the repository root:

    python examples/pytorch_adapter.py                    # starts two shards in this process
    python examples/pytorch_adapter.py --ps 127.0.0.1:7001,127.0.0.1:7002

It trains on the Criteo sample bundled with heraldps and prints the loss.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from heraldps.bundled import bundled_data
from heraldps.client import PSClient
from heraldps.data import DataSpec, SparseDataset, read_all
from heraldps.init import Normal
from heraldps.optim import SGD


class PSEmbedding(nn.Module):
    """Embedding rows pulled from a heraldps table; their gradients go back to it.

    ``forward(keys, iteration)`` returns the rows of ``keys`` (any shape) as
    ``[*keys.shape, dim]``. In training mode with gradients enabled, backward
    pushes the gradient of each distinct key (summed over its occurrences) to
    the PS for ``iteration``; nothing changes on the PS until the caller
    commits that iteration. Call backward once per forward: a second backward
    would push the gradients again. In ``eval()`` mode or under
    ``torch.no_grad()`` it only pulls, and ``iteration`` may be left out.
    """

    def __init__(self, ps: PSClient, table: str, dim: int) -> None:
        super().__init__()
        self.ps = ps
        self.table = table
        self.dim = dim
        self.pulled_rows = 0
        self.pushed_rows = 0

    def forward(self, keys: torch.Tensor, iteration: int | None = None) -> torch.Tensor:
        flat = keys.detach().reshape(-1).cpu().numpy().astype(np.int64, copy=False)
        distinct, inverse = np.unique(flat, return_inverse=True)
        values, _ = self.ps.pull(self.table, distinct)
        self.pulled_rows += distinct.size
        rows = torch.from_numpy(values)
        if self.training and torch.is_grad_enabled():
            if iteration is None:
                raise ValueError("PSEmbedding: pass the iteration to push gradients for, or eval()")
            target = iteration
            rows.requires_grad_(True)
            rows.register_hook(lambda grad: self._push(distinct, grad, target))
        return rows[torch.from_numpy(inverse.reshape(-1))].reshape(*keys.shape, self.dim)

    def _push(self, keys: np.ndarray, grad: torch.Tensor, iteration: int) -> None:
        self.ps.push_gradients(self.table, keys, grad.detach().cpu().numpy(), iteration)
        self.pushed_rows += keys.size


@dataclass(frozen=True)
class Batch:
    """One mini-batch as tensors: each key with the sample and field it fills."""

    keys: torch.Tensor  # int64 [nnz]
    sample: torch.Tensor  # int64 [nnz]: the row of the batch the key belongs to
    field: torch.Tensor  # int64 [nnz]: the categorical column it came from
    dense: torch.Tensor  # float32 [batch, num_dense]
    labels: torch.Tensor  # float32 [batch]


def to_batch(data: SparseDataset) -> Batch:
    if data.fields is None:
        raise ValueError("the dataset has no field positions; read it with heraldps.data.read_all")
    counts = np.diff(data.offsets)
    sample = np.repeat(np.arange(data.rows, dtype=np.int64), counts)
    return Batch(
        keys=torch.from_numpy(data.keys.copy()),
        sample=torch.from_numpy(sample),
        field=torch.from_numpy(data.fields.astype(np.int64)),
        dense=torch.from_numpy(data.dense.copy()),
        labels=torch.from_numpy(data.labels.copy()),
    )


class CTRHead(nn.Module):
    """The dense part: field embeddings (a missing cell stays zero) and dense features -> logit."""

    def __init__(self, num_fields: int, num_dense: int, dim: int, hidden: int = 32) -> None:
        super().__init__()
        self.num_fields = num_fields
        self.dim = dim
        self.mlp = nn.Sequential(
            nn.Linear(num_fields * dim + num_dense, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, rows: torch.Tensor, batch: Batch) -> torch.Tensor:
        size = batch.labels.shape[0]
        fields = rows.new_zeros(size, self.num_fields, self.dim)
        # One key per (sample, field): a plain, differentiable out-of-place scatter.
        fields = fields.index_put((batch.sample, batch.field), rows)
        logits: torch.Tensor = self.mlp(torch.cat([fields.flatten(1), batch.dense], dim=1))
        return logits.squeeze(1)


def train(
    ps: PSClient,
    table: str,
    head: CTRHead,
    batches: Iterable[SparseDataset],
    lr: float,
    first_iteration: int,
) -> list[float]:
    """One PS iteration per batch: pull, forward, backward (pushes), commit; the batch losses."""
    embedding = PSEmbedding(ps, table, head.dim)
    optimizer = torch.optim.SGD(head.parameters(), lr=lr)
    losses = []
    for step, data in enumerate(batches):
        iteration = first_iteration + step
        batch = to_batch(data)
        rows = embedding(batch.keys, iteration)
        loss = nn.functional.binary_cross_entropy_with_logits(head(rows, batch), batch.labels)
        optimizer.zero_grad()
        loss.backward()  # pushes the embedding gradients of this iteration
        optimizer.step()
        ps.commit(iteration)  # the PS applies its optimizer to the pushed rows
        losses.append(loss.item())
    return losses


@contextmanager
def local_shards(count: int) -> Iterator[list[str]]:
    """``count`` shards inside this process on free ports (for a run without ``--ps``)."""
    from ps_server.server import PSConfig, PSServer

    servers = [
        PSServer(PSConfig(host="127.0.0.1", port=0, shard_index=i, num_shards=count))
        for i in range(count)
    ]
    for server in servers:
        server.start()
    try:
        yield [f"127.0.0.1:{server.port}" for server in servers]
    finally:
        for server in servers:
            server.stop(grace=0)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ps",
        default=os.environ.get("HERALDPS_PS", ""),
        help="comma-separated shard addresses in shard order (default: start two here)",
    )
    parser.add_argument("--data", default=str(bundled_data()[0]), help="Criteo TSV file")
    parser.add_argument("--table", default="torch_emb")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=None, help="default: one epoch")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--test-data", default=str(bundled_data()[1]), help="held-out TSV")
    parser.add_argument("--lr", type=float, default=0.2, help="SGD rate of the dense network")
    parser.add_argument(
        "--embedding-lr", type=float, default=1.0, help="SGD rate of the PS table (server side)"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def held_out_loss(ps: PSClient, table: str, head: CTRHead, data: SparseDataset) -> float:
    """Log loss on ``data`` without training (the pull creates rows for unseen keys)."""
    embedding = PSEmbedding(ps, table, head.dim).eval()
    batch = to_batch(data)
    with torch.no_grad():
        logits = head(embedding(batch.keys), batch)
        return nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).item()


def run(args: argparse.Namespace, addresses: list[str]) -> int:
    data = read_all(DataSpec(args.data, "criteo"))
    test = read_all(DataSpec(args.test_data, "criteo"))
    torch.manual_seed(args.seed)
    head = CTRHead(len(data.sparse_columns), len(data.dense_columns), args.dim)
    with PSClient(addresses) as ps:
        ps.wait_ready()
        ps.create_table(
            args.table,
            dim=args.dim,
            optimizer=SGD(lr=args.embedding_lr),
            initializer=Normal(std=0.01, seed=args.seed),
        )
        first = ps.committed_iteration() + 1
        print(f"{len(addresses)} shard(s), table {args.table!r}, first iteration {first}")
        before = held_out_loss(ps, args.table, head, test)
        print(f"held-out loss before training {before:.4f}")
        losses = train(
            ps, args.table, head, data.batches(args.batch_size, args.iterations), args.lr, first
        )
        for step, loss in enumerate(losses):
            if step % 10 == 0 or step == len(losses) - 1:
                print(f"iteration {first + step:4d}  loss {loss:.4f}")
        after = held_out_loss(ps, args.table, head, test)
        rows = ps.describe_table(args.table).rows
    window = max(1, len(losses) // 4)
    start, end = float(np.mean(losses[:window])), float(np.mean(losses[-window:]))
    print(f"training loss, mean of the first {window} batches {start:.4f}, of the last {end:.4f}")
    print(f"held-out loss after training {after:.4f} (before {before:.4f})")
    print(f"the PS table holds {rows} rows")
    if not (end < start and after < before):
        print("the loss did not fall", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.ps:
        return run(args, [a for a in args.ps.split(",") if a])
    with local_shards(2) as addresses:
        return run(args, addresses)


if __name__ == "__main__":
    sys.exit(main())
