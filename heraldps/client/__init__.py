"""``PSClient``: the Python client of a heraldps parameter-server cluster.

One class made of one module per job: ``core`` routes keys to shards and
moves rows (pull, push, write-back, commit; ``rpc`` holds its futures and
retry rule, ``routing`` the key split), ``tables`` creates and describes
tables, ``dense`` stores dense tensors as rows, ``keysets`` reads HugeCTR
keyset files and prefetches them, ``snapshots`` saves, loads and exports.

Idempotent calls (pull, create/describe/list, commit, save, load, export) are
retried with exponential backoff on ``UNAVAILABLE``; pushes and write-backs are
not (a retry could apply a gradient twice). Every call, pushes included, is
retried when a shard answers RESOURCE_EXHAUSTED with reason ``OVERLOADED``: the
shard was at its concurrency limit and never started it. Every failed RPC raises a typed
``heraldps.errors.HeraldError`` naming the shard, never a raw ``grpc.RpcError``.
"""

from __future__ import annotations

from heraldps.client.claims import Claims
from heraldps.client.dense import DENSE_ROW_WIDTH, DenseParameter, DenseParameters
from heraldps.client.keysets import KeysetPrefetch, read_keyset, write_keyset
from heraldps.client.snapshots import ExportedRows, Snapshots
from heraldps.client.tables import TableStats

__all__ = [
    "DENSE_ROW_WIDTH",
    "DenseParameter",
    "ExportedRows",
    "PSClient",
    "TableStats",
    "read_keyset",
    "write_keyset",
]


class PSClient(Snapshots, KeysetPrefetch, DenseParameters, Claims):
    """A connection to every shard of a cluster, in shard order: tables, rows, snapshots."""
