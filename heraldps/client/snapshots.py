"""Snapshots of every shard (save, load) and incremental export of changed rows."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from heraldps import wire
from heraldps.client import rpc
from heraldps.client.arguments import check_name, check_path, integer
from heraldps.client.core import ShardClient
from heraldps.v1 import ps_pb2


@dataclass(frozen=True)
class ExportedRows:
    """Rows of one table from ``export_incremental``."""

    keys: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    state: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int64]
    changed_iterations: npt.NDArray[np.int64]


class Snapshots(ShardClient):
    """Save, load and export run on every shard; a snapshot loads onto any shard count."""

    def save(self, path: str) -> int:
        """Snapshot every shard under ``path`` (a directory all shards can write); return rows."""
        request = ps_pb2.SaveRequest(path=check_path(path, "save"))
        return sum(r.rows for r in self._all_shards("Save", request))

    def load(self, path: str) -> int:
        """Replace every shard's tables with a snapshot saved from any number of shards.

        Two rounds: every shard first checks the snapshot and that its part fits
        (``validate_only``), and only when all of them accept does any shard load.
        Both rounds wait for every shard's answer. What stays per shard: a shard
        that fails between the rounds (it dies, its disk fills) leaves the others
        loaded and itself as it was; ``load`` raises, and loading again repairs it.
        """
        path = check_path(path, "load")
        check = ps_pb2.LoadRequest(path=path, validate_only=True, fence=self.fence)
        self._all_shards("Load", check)
        self._widths.clear()
        load = ps_pb2.LoadRequest(path=path, fence=self.fence)
        return sum(r.rows for r in self._all_shards("Load", load))

    def export_incremental(self, since_iteration: int, table: str = "") -> dict[str, ExportedRows]:
        """Rows changed by commits after ``since_iteration`` (-1: every row), per table."""
        since_iteration = integer(since_iteration, "export: since_iteration")
        if table != "":
            check_name(table)
        request = ps_pb2.ExportIncrementalRequest(since_iteration=since_iteration, table=table)
        blocks: dict[str, list[ps_pb2.RowBlock]] = {}
        for stub, address in zip(self._stubs, self.addresses, strict=True):
            call = functools.partial(stub.ExportIncremental, request, timeout=self.timeout)
            got = rpc.stream(call, address=address, idempotent=True, policy=self._policy)
            for block in got:
                blocks.setdefault(block.table, []).append(block)
        return {name: _merge_blocks(parts) for name, parts in sorted(blocks.items())}


def _merge_blocks(parts: list[ps_pb2.RowBlock]) -> ExportedRows:
    dim, sw = parts[0].dim, parts[0].state_width
    keys = np.concatenate([wire.decode_keys(p.keys) for p in parts])
    n = keys.shape[0]

    def floats(field: str, width: int) -> npt.NDArray[np.float32]:
        data = b"".join(getattr(p, field) for p in parts)
        return wire.decode_rows(data, n, width, field, check_finite=False)

    return ExportedRows(
        keys=keys,
        values=floats("values", dim),
        state=floats("state", sw),
        versions=np.concatenate([wire.decode_keys(p.versions) for p in parts]),
        changed_iterations=np.concatenate([wire.decode_keys(p.changed_iterations) for p in parts]),
    )
