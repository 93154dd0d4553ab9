"""Table admin: create, describe and list the tables of every shard."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heraldps.client import rpc
from heraldps.client.arguments import check_name, integer
from heraldps.client.core import ShardClient
from heraldps.errors import InvalidArgument, TableExists, shown
from heraldps.init import Initializer, Zeros
from heraldps.optim import Optimizer
from heraldps.spec import MAX_DIM, TableSpec, UpdateMode
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
        with this spec; ``TableExists`` if with another).

        Every shard's tables are read first: a different spec for ``name`` on any
        shard raises ``TableExists`` before any shard creates anything. A shard that
        fails after that (it died, the memory cap) raises its error once every
        shard has answered, with a note naming the shards that created the table;
        calling again with the same spec completes it (an equal spec is a no-op).
        """
        dim = integer(dim, f"create_table {shown(name)}: dim", 1, MAX_DIM)
        if not isinstance(optimizer, Optimizer):
            raise InvalidArgument(
                f"create_table {shown(name)}: optimizer must be SGD, AdaGrad or Adam (from "
                f"heraldps.optim), got {shown(optimizer)}"
            )
        if initializer is not None and not isinstance(initializer, Initializer):
            raise InvalidArgument(
                f"create_table {shown(name)}: initializer must be Zeros, Uniform or Normal "
                f"(from heraldps.init), got {shown(initializer)}"
            )
        spec = TableSpec(name, dim, initializer or Zeros(), optimizer, _update_mode(update_mode))
        self._refuse_conflicts(spec.canonical())
        request = ps_pb2.CreateTableRequest(spec=spec.to_proto())
        calls = [self._unary(s, "CreateTable", request, True) for s in range(self.num_shards)]
        outcomes = [rpc.settled(call) for call in calls]
        errors = [e for _, e in outcomes if e is not None]
        if errors:
            created = [a for a, (r, _) in zip(self.addresses, outcomes, strict=True)
                       if r is not None and r.created]  # fmt: skip
            errors[0].add_note(
                f"create_table {name!r}: created on {created or 'no shard'}; the other shards "
                "failed. Fix the cause and call create_table again with the same spec"
            )
            raise errors[0]
        self._widths[name] = (dim, spec.state_width)
        return any(r is not None and r.created for r, _ in outcomes)

    def _refuse_conflicts(self, spec: TableSpec) -> None:
        """``TableExists`` if any shard holds ``spec.name`` with another spec."""
        for address, response in zip(
            self.addresses, self._all_shards("ListTables", ps_pb2.ListTablesRequest()), strict=True
        ):
            for info in response.tables:
                if info.spec.name == spec.name and TableSpec.from_proto(info.spec) != spec:
                    raise TableExists(
                        f"table {spec.name!r} already exists on this shard with a "
                        f"different spec (existing: {TableSpec.from_proto(info.spec)}, "
                        f"requested: {spec}); nothing was created on any shard. Pick another "
                        "name or send the existing spec",
                        address=address,
                    )

    def describe_table(self, name: str) -> TableStats:
        check_name(name)
        infos = self._all_shards("DescribeTable", ps_pb2.DescribeTableRequest(table=name))
        return _merge_infos(infos)

    def list_tables(self) -> dict[str, TableStats]:
        per_shard = self._all_shards("ListTables", ps_pb2.ListTablesRequest())
        by_name: dict[str, list[types_pb2.TableInfo]] = {}
        for response in per_shard:
            for info in response.tables:
                by_name.setdefault(info.spec.name, []).append(info)
        return {name: _merge_infos(infos) for name, infos in sorted(by_name.items())}


def _update_mode(mode: str | UpdateMode) -> UpdateMode:
    """An ``UpdateMode`` or its name (either case)."""
    if isinstance(mode, UpdateMode):
        return mode
    known = ", ".join(m.name.lower() for m in UpdateMode)
    if isinstance(mode, str) and mode.upper() in UpdateMode.__members__:
        return UpdateMode[mode.upper()]
    raise InvalidArgument(f"update_mode must be one of {known}, got {shown(mode)}")


def _merge_infos(infos: Sequence[types_pb2.TableInfo]) -> TableStats:
    first = infos[0]
    return TableStats(
        spec=TableSpec.from_proto(first.spec),
        state_width=first.state_width,
        rows=sum(i.rows for i in infos),
        bytes=sum(i.bytes for i in infos),
    )
