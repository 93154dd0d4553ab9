"""What both kinds of shard store share: the table registry and the read-only requests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from heraldps.errors import UnknownTable
from heraldps.limits import check_name
from heraldps.spec import TableSpec
from ps_server.table import RowBlock


class ShardTable(Protocol):
    """The part of a table (staged or cached) the shared code calls."""

    spec: TableSpec

    def pull(self, keys: npt.NDArray[np.int64], with_state: bool) -> RowBlock: ...

    def export(self, since_iteration: int) -> RowBlock: ...

    def snapshot(self) -> RowBlock: ...


TableT = TypeVar("TableT", bound=ShardTable)


class ShardTables(Generic[TableT]):
    """Tables by name; subclasses create them and own the commit protocol."""

    _tables: dict[str, TableT]

    def table(self, name: str) -> TableT:
        """The table ``name``; InvalidArgument for a name longer than any table's, else
        UnknownTable (both messages show a shortened name)."""
        table = self._tables.get(name)
        if table is None:
            check_name(name)
            raise UnknownTable(name, list(self._tables))
        return table

    def tables(self) -> list[TableT]:
        return [self._tables[name] for name in sorted(self._tables)]

    def pull(self, name: str, keys: npt.NDArray[np.int64], with_state: bool = False) -> RowBlock:
        return self.table(name).pull(keys, with_state)

    def export(self, since_iteration: int, name: str = "") -> Iterator[tuple[TableT, RowBlock]]:
        """Rows changed after ``since_iteration``, table by table."""
        tables = [self.table(name)] if name else self.tables()
        for table in tables:
            yield table, table.export(since_iteration)
