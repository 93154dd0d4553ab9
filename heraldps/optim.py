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

L2 regularization: every optimizer's ``l2`` (default 0: off) is added to the
gradient of each row the step updates, ``grad + l2 * value``, before the
update and inside ``apply``, once per step (so once per each of ``steps[i]``
steps). That is the gradient of ``(l2 / 2) * ||row||^2`` on the rows a batch
uses: FuxiCTR's embedding regularizer 0.05, ``(0.05 / 2) * ||E||^2``, is
``l2=0.05`` here, applied to the batch's rows instead of the whole table (a
parameter server cannot move every row at every step). For the dense
parameters it is the coupled weight decay of ``torch.optim``'s
``weight_decay`` (not AdamW's decoupled one). Since it lives in ``apply``, a
row updated in a worker cache and at the PS stays bit-identical with it on.

Every optimizer is one :class:`Optimizer` subclass registered by name
(:func:`register`, :data:`OPTIMIZERS`): the proto conversion, the training job
and the CLI look optimizers up there. Adding one is writing its class (a frozen
dataclass whose fields are its proto message's fields), registering it, and
adding its message to the ``Optimizer`` oneof in ``proto/heraldps/v1/types.proto``.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, TypeVar

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


def _regularized(l2: float, values: Array, grads: Array) -> Array:
    """``grads + l2 * values`` (float32), a new array; ``grads`` itself when ``l2`` is 0,
    so an optimizer without L2 computes exactly what it did before the term existed."""
    if l2 == 0.0:
        return grads
    return grads + np.float32(l2) * values


def _check_l2(name: str, l2: float) -> None:
    if not (math.isfinite(l2) and l2 >= 0):
        raise InvalidArgument(f"{name}: l2 must be a finite number >= 0 (0: off), got {l2}")


def _check_positive(name: str, **params: float) -> None:
    for key, value in params.items():
        if not (math.isfinite(value) and value > 0):
            raise InvalidArgument(f"{name}: {key} must be a finite number > 0, got {value}")


class Optimizer(abc.ABC):
    """A row update ``apply(values, state, grads)`` and the state it keeps per row.

    Subclasses are frozen dataclasses whose fields are the parameters their proto
    message carries (same names), registered with :func:`register` under ``name``, the
    proto oneof field and ``--optimizer`` value. ``job_defaults``: the parameters a
    training job uses when it names the optimizer (its ``lr`` overrides ``lr``).
    """

    name: ClassVar[str]
    job_defaults: ClassVar[dict[str, float]]
    lr: float  # every optimizer's learning rate (a schedule scales it: :func:`scaled`)
    l2: float  # every optimizer's field: ``grad + l2 * value`` before the update (0: off)

    @abc.abstractmethod
    def state_width(self, dim: int) -> int:
        """Floats of state per row of ``dim`` values."""

    @abc.abstractmethod
    def init_state(self, rows: int, dim: int) -> np.ndarray:
        """The state of ``rows`` new rows."""

    @abc.abstractmethod
    def apply(self, values: Array, state: Array, grads: Array) -> None:
        """One step of ``grads`` on ``values`` and ``state``, in place."""

    def apply_steps(
        self, values: Array, state: Array, grads: Array, steps: npt.NDArray[np.int32] | None
    ) -> None:
        """Row i as ``steps[i]`` steps of its mean gradient (None: one step each)."""
        _apply_as_steps(self.apply, values, state, grads, steps)

    def to_proto(self) -> types_pb2.Optimizer:
        """The wire form: the oneof field ``name`` set to this optimizer's fields."""
        params = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        kind: dict[str, Any] = {self.name: params}
        return types_pb2.Optimizer(**kind)


def lr_scale_of(wire_value: float) -> float:
    """An iteration's learning-rate multiplier as the wire carries it: 0 (unset) is 1.0;
    a negative or non-finite one is refused."""
    if wire_value == 0.0:
        return 1.0
    if not (math.isfinite(wire_value) and wire_value > 0):
        raise InvalidArgument(f"lr_scale must be a finite number > 0 (0: 1.0), got {wire_value}")
    return float(wire_value)


def scaled(optimizer: Optimizer, lr_scale: float) -> Optimizer:
    """``optimizer`` with learning rate ``lr * lr_scale`` (an iteration of a decayed
    schedule). Every place that applies an iteration's updates (the PS commit, the worker
    caches, the dense replicas, the single-process reference) calls this with the same
    ``lr_scale``. The product starts from the float32 lr that ``apply`` uses (a shard's
    optimizer came over the wire as float32, a worker's from the job as a double), is
    computed in double and rounded to float32 in ``apply``: the same bits everywhere.
    A scale of 1.0 returns ``optimizer`` itself."""
    if lr_scale == 1.0:
        return optimizer
    if not (math.isfinite(lr_scale) and lr_scale > 0):
        raise InvalidArgument(f"lr_scale must be a finite number > 0, got {lr_scale}")
    lr = float(np.float32(optimizer.lr)) * lr_scale
    return replace(optimizer, lr=lr)  # type: ignore[type-var]


OPTIMIZERS: dict[str, type[Optimizer]] = {}
"""Every optimizer by name, in the order registered (the CLI's choices)."""

_O = TypeVar("_O", bound=type[Optimizer])


def register(cls: _O) -> _O:
    """Make ``cls`` an optimizer the wire, the job file and the CLI know by ``cls.name``.
    Its fields must be its proto message's, so conversion both ways is by name."""
    kinds = types_pb2.Optimizer.DESCRIPTOR.oneofs_by_name["kind"].fields
    message = {field.name: field.message_type for field in kinds}.get(cls.name)
    if message is None:
        raise TypeError(f"optimizer {cls.name!r}: add its message to the proto Optimizer oneof")
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    if names != [f.name for f in message.fields]:
        raise TypeError(f"optimizer {cls.name!r}: fields {names} differ from {message.name}'s")
    if cls.name in OPTIMIZERS:
        raise TypeError(f"optimizer {cls.name!r} is registered already")
    OPTIMIZERS[cls.name] = cls
    return cls


def optimizer_class(name: str) -> type[Optimizer]:
    """The optimizer registered as ``name``; an unknown name lists the known ones."""
    cls = OPTIMIZERS.get(name)
    if cls is None:
        raise InvalidArgument(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    return cls


@register
@dataclass(frozen=True)
class SGD(Optimizer):
    """``value -= lr * grad``."""

    name: ClassVar[str] = "sgd"
    job_defaults: ClassVar[dict[str, float]] = {"lr": 0.05}

    lr: float = 0.01
    l2: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("sgd", lr=self.lr)
        _check_l2("sgd", self.l2)

    def state_width(self, dim: int) -> int:
        return 0

    def init_state(self, rows: int, dim: int) -> np.ndarray:
        return np.zeros((rows, 0), dtype=np.float32)

    def apply(self, values: Array, state: Array, grads: Array) -> None:
        values -= np.float32(self.lr) * _regularized(self.l2, values, grads)

    def apply_steps(
        self, values: Array, state: Array, grads: Array, steps: npt.NDArray[np.int32] | None
    ) -> None:
        """k SGD steps of ``g / k`` are one step of ``g``: without L2 the step counts change
        nothing; with it each step decays the row again, so they are taken one by one."""
        if self.l2 == 0.0:
            self.apply(values, state, grads)
        else:
            _apply_as_steps(self.apply, values, state, grads, steps)


@register
@dataclass(frozen=True)
class AdaGrad(Optimizer):
    """``acc += grad^2; value -= lr * grad / (sqrt(acc) + eps)``."""

    name: ClassVar[str] = "adagrad"
    # A positive start (TensorFlow's 0.1) keeps the first steps of rarely seen rows from
    # being lr * g / |g|, which turns float32 rounding noise into full steps.
    job_defaults: ClassVar[dict[str, float]] = {
        "lr": 0.05,
        "initial_accumulator": 0.1,
        "eps": 1e-8,
    }

    lr: float = 0.01
    initial_accumulator: float = 0.0
    eps: float = 1e-10
    l2: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("adagrad", lr=self.lr)
        _check_l2("adagrad", self.l2)
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
        grads = _regularized(self.l2, values, grads)
        state += grads * grads
        values -= np.float32(self.lr) * grads / (xp.sqrt(state) + np.float32(self.eps))


@register
@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with bias correction and a per-row step count. Under ``apply_steps`` a row's
    step count (bias correction) and moments advance as they would have over its steps."""

    name: ClassVar[str] = "adam"
    # eps 1e-6 instead of 1e-8: on a gradient that cancels to ~1e-9, Adam's step is about
    # lr * sign(g), so float32 summation order (which worker's push the PS adds first)
    # would decide a whole step. With 1e-6 the step error stays near lr * noise / eps.
    job_defaults: ClassVar[dict[str, float]] = {"lr": 0.001, "eps": 1e-6}

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    l2: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("adam", lr=self.lr)
        _check_l2("adam", self.l2)
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
        grads = _regularized(self.l2, values, grads)
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


def optimizer_from_proto(msg: types_pb2.Optimizer) -> Optimizer:
    """Build an optimizer from its wire form; an unset kind is an error."""
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise InvalidArgument(f"optimizer: set one of {', '.join(OPTIMIZERS)}")
    cls = OPTIMIZERS.get(kind)
    if cls is None:
        raise InvalidArgument(f"optimizer: {kind!r} is not registered in heraldps.optim")
    params = getattr(msg, kind)
    return cls(**{f.name: getattr(params, f.name) for f in fields(cls)})  # type: ignore[arg-type]
