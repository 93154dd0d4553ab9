"""Snapshots of every shard (save, load) and incremental export of changed rows."""

from __future__ import annotations

import functools
from collections.abc import Callable
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
        parts: dict[str, list[ExportedRows]] = {}
        for name, rows in self.export_blocks(since_iteration, table):
            parts.setdefault(name, []).append(rows)
        return {name: _concatenate(blocks) for name, blocks in sorted(parts.items())}

    def export_blocks(
        self,
        since_iteration: int,
        table: str = "",
        keep: Callable[[ExportedRows], ExportedRows] | None = None,
    ) -> list[tuple[str, ExportedRows]]:
        """What :meth:`export_incremental` returns, as ``(table, rows)`` per streamed block,
        each block decoded (and passed through ``keep``) as it arrives: an exporter that keeps
        only the values of trained rows holds those, never every row's bytes and state."""
        since_iteration = integer(since_iteration, "export: since_iteration")
        if table != "":
            check_name(table)
        request = ps_pb2.ExportIncrementalRequest(since_iteration=since_iteration, table=table)

        def decoded(block: ps_pb2.RowBlock) -> tuple[str, ExportedRows]:
            rows = _decode_block(block)
            return block.table, keep(rows) if keep is not None else rows

        out: list[tuple[str, ExportedRows]] = []
        for stub, address in zip(self._stubs, self.addresses, strict=True):
            call = functools.partial(stub.ExportIncremental, request, timeout=self.timeout)
            out += rpc.stream(call, address=address, idempotent=True, policy=self._policy,
                              each=decoded)  # fmt: skip
        return out


def _decode_block(block: ps_pb2.RowBlock) -> ExportedRows:
    keys = wire.decode_keys(block.keys)
    n = keys.shape[0]
    return ExportedRows(
        keys=keys,
        values=wire.decode_rows(block.values, n, block.dim, "values", check_finite=False),
        state=wire.decode_rows(block.state, n, block.state_width, "state", check_finite=False),
        versions=wire.decode_keys(block.versions),
        changed_iterations=wire.decode_keys(block.changed_iterations),
    )


def _concatenate(blocks: list[ExportedRows]) -> ExportedRows:
    """One table's blocks as one set of arrays (copies: no block's bytes stay referenced)."""
    return ExportedRows(*(np.concatenate([getattr(b, f) for b in blocks])
                          for f in ExportedRows.__dataclass_fields__))  # fmt: skip
