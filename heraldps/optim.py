"""Server-side optimizers as pure, vectorized, in-place array functions.

Each optimizer updates a block of rows with the block's summed gradient:
``apply(values, state, grads)``. State lives beside the value it belongs to
(``[n, state_width]`` float32) and travels with it (pull with state,
write-back, snapshots), so a row updated in a worker cache with the same
function equals the row the PS would produce, bit for bit: every operation is
float32 in a fixed order, written once over the array module (NumPy here,
CuPy in GPU worker caches).

State layouts: SGD none; AdaGrad ``[acc(dim)]``; Adam ``[m(dim), v(dim), t]``
where ``t`` is the row's own step count (sparse Adam: a row's bias
correction advances only when the row is updated).

``apply_steps(values, state, grads, steps)`` applies gradients that each
stand for ``steps[i]`` optimizer steps (the sum of that many steps'
gradients, as a HET worker accumulates them under staleness) as that many
steps of their mean, so a row's state advances by as many steps as the
updates it received (see docs/workers.md, "Staleness and adaptive optimizers").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument
from heraldps.v1 import types_pb2

Array = Any  # numpy.ndarray or cupy.ndarray of float32


def _array_module(a: Array) -> Any:
    """The module that owns ``a``: NumPy, CuPy, or whatever an array names through the
    array API's ``__array_namespace__`` (a device-array test double)."""
    if isinstance(a, np.ndarray):
        return np
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    namespace = getattr(a, "__array_namespace__", None)
    return np if namespace is None else namespace()


MAX_STEPS = 1024  # steps one gradient row may stand for (bounds the PS's work per row)


def _apply_as_steps(
    apply: Callable[[Array, Array, Array], None],
    values: Array,
    state: Array,
    grads: Array,
    steps: npt.NDArray[np.int32] | None,
) -> None:
    """``apply`` row i ``steps[i]`` times with ``grads[i] / steps[i]``; rows of one step
    take exactly ``apply(values, state, grads)``. One pass per step count, not per row."""
    if steps is None or not np.any(steps > 1):
        apply(values, state, grads)
        return
    xp = _array_module(values)
    counts = xp.asarray(steps.astype(np.float32))[:, None]
    mean = grads / counts
    for done in range(int(steps.max())):
        rows = xp.asarray(np.flatnonzero(steps > done))
        v, st = values[rows], state[rows]
        apply(v, st, mean[rows])
        values[rows], state[rows] = v, st


def _check_positive(name: str, **params: float) -> None:
    for key, value in params.items():
        if not (math.isfinite(value) and value > 0):
            raise InvalidArgument(f"{name}: {key} must be a finite number > 0, got {value}")


@dataclass(frozen=True)
class SGD:
    """``value -= lr * grad``."""

    lr: float = 0.01

    def __post_init__(self) -> None:
        _check_positive("sgd", lr=self.lr)

    def state_width(self, dim: int) -> int:
        return 0

    def init_state(self, rows: int, dim: int) -> np.ndarray:
        return np.zeros((rows, 0), dtype=np.float32)

    def apply(self, values: Array, state: Array, grads: Array) -> None:
        values -= np.float32(self.lr) * grads

    def apply_steps(
        self, values: Array, state: Array, grads: Array, steps: npt.NDArray[np.int32] | None
    ) -> None:
        """k SGD steps of ``g / k`` are one step of ``g``: the step counts change nothing."""
        self.apply(values, state, grads)

    def to_proto(self) -> types_pb2.Optimizer:
        return types_pb2.Optimizer(sgd=types_pb2.SgdOptimizer(lr=self.lr))


@dataclass(frozen=True)
class AdaGrad:
    """``acc += grad^2; value -= lr * grad / (sqrt(acc) + eps)``."""

    lr: float = 0.01
    initial_accumulator: float = 0.0
    eps: float = 1e-10

    def __post_init__(self) -> None:
        _check_positive("adagrad", lr=self.lr)
        if not (math.isfinite(self.initial_accumulator) and self.initial_accumulator >= 0):
            raise InvalidArgument(
                f"adagrad: initial_accumulator must be >= 0, got {self.initial_accumulator}"
            )
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise InvalidArgument(f"adagrad: eps must be >= 0, got {self.eps}")

    def state_width(self, dim: int) -> int:
        return dim

    def init_state(self, rows: int, dim: int) -> np.ndarray:
        return np.full((rows, dim), self.initial_accumulator, dtype=np.float32)

    def apply(self, values: Array, state: Array, grads: Array) -> None:
        xp = _array_module(values)
        state += grads * grads
        values -= np.float32(self.lr) * grads / (xp.sqrt(state) + np.float32(self.eps))

    def apply_steps(
        self, values: Array, state: Array, grads: Array, steps: npt.NDArray[np.int32] | None
    ) -> None:
        """Row i as ``steps[i]`` AdaGrad steps of its mean gradient."""
        _apply_as_steps(self.apply, values, state, grads, steps)

    def to_proto(self) -> types_pb2.Optimizer:
        return types_pb2.Optimizer(
            adagrad=types_pb2.AdagradOptimizer(
                lr=self.lr, initial_accumulator=self.initial_accumulator, eps=self.eps
            )
        )


@dataclass(frozen=True)
class Adam:
    """Adam with bias correction and a per-row step count."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        _check_positive("adam", lr=self.lr)
        for key, beta in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not (math.isfinite(beta) and 0.0 <= beta < 1.0):
                raise InvalidArgument(f"adam: {key} must be in [0, 1), got {beta}")
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise InvalidArgument(f"adam: eps must be >= 0, got {self.eps}")

    def state_width(self, dim: int) -> int:
        return 2 * dim + 1

    def init_state(self, rows: int, dim: int) -> np.ndarray:
        return np.zeros((rows, 2 * dim + 1), dtype=np.float32)

    def apply(self, values: Array, state: Array, grads: Array) -> None:
        xp = _array_module(values)
        dim = values.shape[1]
        m = state[:, :dim]
        v = state[:, dim : 2 * dim]
        step = state[:, 2 * dim :]
        beta1, beta2 = np.float32(self.beta1), np.float32(self.beta2)
        one = np.float32(1.0)
        step += one
        m *= beta1
        m += (one - beta1) * grads
        v *= beta2
        v += (one - beta2) * (grads * grads)
        m_hat = m / (one - xp.power(beta1, step))
        v_hat = v / (one - xp.power(beta2, step))
        values -= np.float32(self.lr) * m_hat / (xp.sqrt(v_hat) + np.float32(self.eps))

    def apply_steps(
        self, values: Array, state: Array, grads: Array, steps: npt.NDArray[np.int32] | None
    ) -> None:
        """Row i as ``steps[i]`` Adam steps of its mean gradient: its step count (bias
        correction) and moments advance as they would have over those steps."""
        _apply_as_steps(self.apply, values, state, grads, steps)

    def to_proto(self) -> types_pb2.Optimizer:
        return types_pb2.Optimizer(
            adam=types_pb2.AdamOptimizer(
                lr=self.lr, beta1=self.beta1, beta2=self.beta2, eps=self.eps
            )
        )


Optimizer = SGD | AdaGrad | Adam


def optimizer_from_proto(msg: types_pb2.Optimizer) -> Optimizer:
    """Build an optimizer from its wire form; an unset kind is an error."""
    kind = msg.WhichOneof("kind")
    if kind == "sgd":
        return SGD(lr=msg.sgd.lr)
    if kind == "adagrad":
        a = msg.adagrad
        return AdaGrad(lr=a.lr, initial_accumulator=a.initial_accumulator, eps=a.eps)
    if kind == "adam":
        a2 = msg.adam
        return Adam(lr=a2.lr, beta1=a2.beta1, beta2=a2.beta2, eps=a2.eps)
    raise InvalidArgument("optimizer: set one of sgd, adagrad or adam")
