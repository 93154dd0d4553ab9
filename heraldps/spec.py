"""Table specs: what a table is, validated once at the edge."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from heraldps.errors import InvalidArgument, shown
from heraldps.init import Initializer, Zeros, initializer_from_proto
from heraldps.optim import SGD, Optimizer, optimizer_from_proto
from heraldps.v1 import types_pb2

MAX_DIM = 65536
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")  # whole name: fullmatch, never "$"


class UpdateMode(enum.Enum):
    """When pushed gradients reach the rows (see types.proto)."""

    SYNCHRONOUS = types_pb2.UPDATE_MODE_SYNCHRONOUS
    IMMEDIATE = types_pb2.UPDATE_MODE_IMMEDIATE


@dataclass(frozen=True)
class TableSpec:
    """Name, row width, initializer, optimizer and update mode of a table."""

    name: str
    dim: int
    initializer: Initializer = field(default_factory=Zeros)
    optimizer: Optimizer = field(default_factory=SGD)
    update_mode: UpdateMode = UpdateMode.SYNCHRONOUS

    def __post_init__(self) -> None:
        validate_table_name(self.name)
        if not 1 <= self.dim <= MAX_DIM:
            raise InvalidArgument(
                f"table {self.name!r}: dim must be in 1..{MAX_DIM}, got {self.dim}"
            )

    @property
    def state_width(self) -> int:
        return self.optimizer.state_width(self.dim)

    def to_proto(self) -> types_pb2.TableSpec:
        return types_pb2.TableSpec(
            name=self.name,
            dim=self.dim,
            initializer=self.initializer.to_proto(),
            optimizer=self.optimizer.to_proto(),
            update_mode=self.update_mode.value,
        )

    @classmethod
    def from_proto(cls, msg: types_pb2.TableSpec) -> TableSpec:
        """Validate a wire spec; floats come back rounded to float32 as on the wire."""
        mode = msg.update_mode or types_pb2.UPDATE_MODE_SYNCHRONOUS
        try:
            update_mode = UpdateMode(mode)
        except ValueError:
            raise InvalidArgument(f"table {msg.name!r}: unknown update_mode {mode}") from None
        if not msg.HasField("optimizer"):
            raise InvalidArgument(f"table {msg.name!r}: optimizer is required (sgd, adagrad, adam)")
        return cls(
            name=msg.name,
            dim=msg.dim,
            initializer=initializer_from_proto(msg.initializer),
            optimizer=optimizer_from_proto(msg.optimizer),
            update_mode=update_mode,
        )

    def canonical(self) -> TableSpec:
        """This spec as the server stores it (floats rounded through the wire)."""
        return TableSpec.from_proto(self.to_proto())


def validate_table_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"table name {shown(name)} is invalid: use 1-128 characters from [A-Za-z0-9_.-]"
        )
