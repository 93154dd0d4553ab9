"""The optimizer registry: one class per name, the wire form by field name, unchanged bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from heraldps.errors import InvalidArgument
from heraldps.optim import (
    OPTIMIZERS,
    SGD,
    AdaGrad,
    Adam,
    Optimizer,
    optimizer_class,
    optimizer_from_proto,
    register,
)
from heraldps.v1 import types_pb2


def test_every_proto_kind_has_one_registered_class_in_order() -> None:
    kinds = types_pb2.Optimizer.DESCRIPTOR.oneofs_by_name["kind"].fields
    assert list(OPTIMIZERS) == [kind.name for kind in kinds] == ["sgd", "adagrad", "adam"]
    assert {"sgd": SGD, "adagrad": AdaGrad, "adam": Adam} == OPTIMIZERS


def test_wire_form_is_the_one_written_by_hand_before() -> None:
    """The generic conversion sets the same fields the explicit messages did."""
    assert SGD(lr=0.5).to_proto() == types_pb2.Optimizer(sgd=types_pb2.SgdOptimizer(lr=0.5))
    assert AdaGrad(lr=0.1, initial_accumulator=0.1, eps=1e-8).to_proto() == types_pb2.Optimizer(
        adagrad=types_pb2.AdagradOptimizer(lr=0.1, initial_accumulator=0.1, eps=1e-8)
    )
    assert Adam(lr=0.01, eps=1e-6).to_proto() == types_pb2.Optimizer(
        adam=types_pb2.AdamOptimizer(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6)
    )
    back = optimizer_from_proto(Adam(lr=0.01, eps=1e-6).to_proto())
    wire = [float(np.float32(x)) for x in (0.01, 0.9, 0.999, 1e-6)]  # proto floats are 32-bit
    assert back == Adam(*wire)


def test_unknown_names_and_unset_kinds_say_what_exists() -> None:
    with pytest.raises(InvalidArgument, match="sgd, adagrad, adam"):
        optimizer_class("rmsprop")
    with pytest.raises(InvalidArgument, match="set one of sgd, adagrad, adam"):
        optimizer_from_proto(types_pb2.Optimizer())


def test_a_class_the_proto_does_not_carry_is_refused() -> None:
    @dataclass(frozen=True)
    class RMSProp(SGD):
        name: ClassVar[str] = "rmsprop"

    with pytest.raises(TypeError, match="proto Optimizer oneof"):
        register(RMSProp)
    assert "rmsprop" not in OPTIMIZERS


def test_fields_that_differ_from_the_message_are_refused() -> None:
    @dataclass(frozen=True)
    class Sgd2(SGD):
        momentum: float = 0.0  # SgdOptimizer has no such field

    with pytest.raises(TypeError, match="differ"):
        register(Sgd2)

    with pytest.raises(TypeError, match="registered already"):
        register(SGD)
    assert OPTIMIZERS["sgd"] is SGD


def test_an_optimizer_must_implement_the_interface() -> None:
    class Half(Optimizer):  # no apply, no state
        name: ClassVar[str] = "half"

    with pytest.raises(TypeError):
        Half()  # type: ignore[abstract]
