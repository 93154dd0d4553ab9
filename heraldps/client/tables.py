"""Table admin: create, describe and list the tables of every shard."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heraldps.client.core import ShardClient
from heraldps.init import Initializer, Zeros
from heraldps.optim import Optimizer
from heraldps.spec import TableSpec, UpdateMode
from heraldps.v1 import ps_pb2, types_pb2


@dataclass(frozen=True)
class TableStats:
    """A table summed over every shard."""

    spec: TableSpec
    state_width: int
    rows: int
    bytes: int


class TableAdmin(ShardClient):
    """Tables are created on every shard at once; a key's row lives on one of them."""

    def create_table(
        self,
        name: str,
        dim: int,
        optimizer: Optimizer,
        initializer: Initializer | None = None,
        update_mode: str | UpdateMode = UpdateMode.SYNCHRONOUS,
    ) -> bool:
        """Create ``name`` on every shard; True if any shard created it (False: it existed
        with this spec; ``TableExists`` if with another)."""
        if isinstance(update_mode, str):
            update_mode = UpdateMode[update_mode.upper()]
        spec = TableSpec(name, dim, initializer or Zeros(), optimizer, update_mode)
        responses = self._all_shards("CreateTable", ps_pb2.CreateTableRequest(spec=spec.to_proto()))
        self._widths[name] = (dim, spec.state_width)
        return any(r.created for r in responses)

    def describe_table(self, name: str) -> TableStats:
        infos = self._all_shards("DescribeTable", ps_pb2.DescribeTableRequest(table=name))
        return _merge_infos(infos)

    def list_tables(self) -> dict[str, TableStats]:
        per_shard = self._all_shards("ListTables", ps_pb2.ListTablesRequest())
        by_name: dict[str, list[types_pb2.TableInfo]] = {}
        for response in per_shard:
            for info in response.tables:
                by_name.setdefault(info.spec.name, []).append(info)
        return {name: _merge_infos(infos) for name, infos in sorted(by_name.items())}


def _merge_infos(infos: Sequence[types_pb2.TableInfo]) -> TableStats:
    first = infos[0]
    return TableStats(
        spec=TableSpec.from_proto(first.spec),
        state_width=first.state_width,
        rows=sum(i.rows for i in infos),
        bytes=sum(i.bytes for i in infos),
    )
