"""Table admin: create, describe and list the tables of every shard."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heraldps.client import rpc
from heraldps.client.arguments import check_name, integer
from heraldps.client.core import ShardClient
from heraldps.errors import InvalidArgument, TableExists, shown
from heraldps.init import Initializer, Zeros
from heraldps.optim import OPTIMIZERS, Optimizer
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

        All shards or none: every shard first checks the spec, its table count and
        its memory limit (``validate_only``), and a refusal there (``TableExists``,
        ``ResourceExhausted``) is raised before any shard creates anything. Should a
        create still fail on a shard (it died, another create took the memory in
        between), the shards that created the table drop it again (it is empty) and
        the error is raised with a note saying so; calling again completes it.
        """
        dim = integer(dim, f"create_table {shown(name)}: dim", 1, MAX_DIM)
        if not isinstance(optimizer, Optimizer):
            raise InvalidArgument(
                f"create_table {shown(name)}: optimizer must be one of "
                f"{', '.join(cls.__name__ for cls in OPTIMIZERS.values())} (from "
                f"heraldps.optim), got {shown(optimizer)}"
            )
        if initializer is not None and not isinstance(initializer, Initializer):
            raise InvalidArgument(
                f"create_table {shown(name)}: initializer must be Zeros, Uniform or Normal "
                f"(from heraldps.init), got {shown(initializer)}"
            )
        spec = TableSpec(name, dim, initializer or Zeros(), optimizer, _update_mode(update_mode))
        self._refuse_conflicts(spec.canonical())
        check = ps_pb2.CreateTableRequest(spec=spec.to_proto(), validate_only=True)
        self._on_every_shard(check, f"create_table {name!r}: refused; nothing was created on "
                             "any shard")  # fmt: skip
        request = ps_pb2.CreateTableRequest(spec=spec.to_proto())
        calls = [self._unary(s, "CreateTable", request, True) for s in range(self.num_shards)]
        outcomes = [rpc.settled(call) for call in calls]
        errors = [e for _, e in outcomes if e is not None]
        if errors:
            created = [s for s, (r, _) in enumerate(outcomes) if r is not None and r.created]
            errors[0].add_note(f"create_table {name!r}: " + self._undo_create(name, created))
            raise errors[0]
        self._widths[name] = (dim, spec.state_width)
        return any(r is not None and r.created for r, _ in outcomes)

    def _on_every_shard(self, request: ps_pb2.CreateTableRequest, note: str) -> None:
        """Send ``request`` to every shard at once; the first error, with ``note``."""
        calls = [self._unary(s, "CreateTable", request, True) for s in range(self.num_shards)]
        errors = [e for _, e in (rpc.settled(call) for call in calls) if e is not None]
        if errors:
            errors[0].add_note(note)
            raise errors[0]

    def _undo_create(self, name: str, created: list[int]) -> str:
        """Drop ``name`` from the shards in ``created`` (they created it empty just now);
        what was done, for the error's note."""
        drop = ps_pb2.DropTableRequest(table=name)
        calls = [(s, self._unary(s, "DropTable", drop, True)) for s in created]
        kept = [self.addresses[s] for s, call in calls if rpc.settled(call)[1] is not None]
        if kept:
            return (
                f"created on some shards only, and it could not be dropped from {kept}; "
                "fix the cause and call create_table again with the same spec"
            )
        dropped = [self.addresses[s] for s in created]
        undone = f" (dropped again from {dropped})" if dropped else ""
        return (
            f"a shard failed, so nothing was created on any shard{undone}; fix the cause "
            "and call create_table again"
        )

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
