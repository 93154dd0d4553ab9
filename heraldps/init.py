"""Deterministic row initializers.

The value of a new row depends only on (initializer, seed, key): element ``j``
of key ``k`` is drawn from a counter-based generator keyed by
``splitmix64(seed ^ splitmix64(k)) + j``. No state is carried between calls,
so any number of shards, any order of first touch and any worker produce the
same row for the same key. (Uniform: element j uses counter j; normal: the
pair (2p, 2p+1) is one Box-Muller draw from counters 2p and 2p+1.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument
from heraldps.jit import njit
from heraldps.sharding import splitmix64
from heraldps.v1 import types_pb2

_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# The largest |z| a Box-Muller draw reaches: the smallest u1 is 0.5 * 2**-53 (``_unit``),
# so the radius is at most sqrt(-2 ln(2**-54)) ~ 8.65 standard deviations.
MAX_NORMAL_SIGMAS = math.sqrt(-2.0 * math.log(0.5 * _TO_UNIT))


@njit(nogil=True, inline="always")
def _unit(bits: np.uint64) -> float:  # pragma: no cover - compiled
    """53 random bits -> a float in (0, 1)."""
    return (np.float64(bits >> np.uint64(11)) + 0.5) * _TO_UNIT


@njit(nogil=True)
def _uniform_rows(
    keys: npt.NDArray[np.int64], dim: int, seed: np.uint64, low: float, high: float
) -> npt.NDArray[np.float32]:  # pragma: no cover - compiled
    out = np.empty((keys.shape[0], dim), dtype=np.float32)
    scale = high - low
    for i in range(keys.shape[0]):
        base = splitmix64(seed ^ splitmix64(np.uint64(keys[i])))
        for j in range(dim):
            out[i, j] = low + scale * _unit(splitmix64(base + np.uint64(j)))
    return out


@njit(nogil=True)
def _normal_rows(
    keys: npt.NDArray[np.int64], dim: int, seed: np.uint64, mean: float, std: float
) -> npt.NDArray[np.float32]:  # pragma: no cover - compiled
    """Box-Muller: element pair (2p, 2p+1) shares two uniforms (cos and sin branches)."""
    out = np.empty((keys.shape[0], dim), dtype=np.float32)
    for i in range(keys.shape[0]):
        base = splitmix64(seed ^ splitmix64(np.uint64(keys[i])))
        for p in range((dim + 1) // 2):
            u1 = _unit(splitmix64(base + np.uint64(2 * p)))
            u2 = _unit(splitmix64(base + np.uint64(2 * p + 1)))
            radius = std * math.sqrt(-2.0 * math.log(u1))
            angle = 2.0 * math.pi * u2
            out[i, 2 * p] = mean + radius * math.cos(angle)
            if 2 * p + 1 < dim:
                out[i, 2 * p + 1] = mean + radius * math.sin(angle)
    return out


@dataclass(frozen=True)
class Zeros:
    """Every element 0."""

    seed: int = 0

    def generate(self, keys: npt.NDArray[np.int64], dim: int) -> npt.NDArray[np.float32]:
        return np.zeros((keys.shape[0], dim), dtype=np.float32)

    def to_proto(self) -> types_pb2.Initializer:
        return types_pb2.Initializer(zeros=types_pb2.ZerosInit(), seed=self.seed)


@dataclass(frozen=True)
class Uniform:
    """Elements uniform in ``[low, high)``."""

    low: float = -0.05
    high: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise InvalidArgument(
                f"uniform initializer needs finite low < high, got low={self.low}, high={self.high}"
            )
        if max(abs(self.low), abs(self.high)) > _FLOAT32_MAX:
            raise InvalidArgument(
                f"uniform initializer: low={self.low}, high={self.high} reach beyond float32 "
                f"(|x| <= {_FLOAT32_MAX:.4g}); rows would hold Inf. Pick smaller bounds"
            )

    def generate(self, keys: npt.NDArray[np.int64], dim: int) -> npt.NDArray[np.float32]:
        keys = np.ascontiguousarray(keys, np.int64)
        rows: npt.NDArray[np.float32] = _uniform_rows(
            keys, dim, np.uint64(self.seed), self.low, self.high
        )
        return rows

    def to_proto(self) -> types_pb2.Initializer:
        return types_pb2.Initializer(
            uniform=types_pb2.UniformInit(low=self.low, high=self.high), seed=self.seed
        )


@dataclass(frozen=True)
class Normal:
    """Elements from ``N(mean, std^2)`` (Box-Muller on two counter streams)."""

    std: float = 0.01
    mean: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and math.isfinite(self.std) and self.std >= 0):
            raise InvalidArgument(
                f"normal initializer needs finite mean and std >= 0, got mean={self.mean}, "
                f"std={self.std}"
            )
        reach = abs(self.mean) + MAX_NORMAL_SIGMAS * self.std
        if reach > _FLOAT32_MAX:
            raise InvalidArgument(
                f"normal initializer: mean={self.mean}, std={self.std} can draw values up to "
                f"|mean| + {MAX_NORMAL_SIGMAS:.2f} std = {reach:.4g}, beyond float32 "
                f"({_FLOAT32_MAX:.4g}); rows would hold Inf. Pick a smaller mean or std"
            )

    def generate(self, keys: npt.NDArray[np.int64], dim: int) -> npt.NDArray[np.float32]:
        keys = np.ascontiguousarray(keys, np.int64)
        rows: npt.NDArray[np.float32] = _normal_rows(
            keys, dim, np.uint64(self.seed), self.mean, self.std
        )
        return rows

    def to_proto(self) -> types_pb2.Initializer:
        return types_pb2.Initializer(
            normal=types_pb2.NormalInit(mean=self.mean, std=self.std), seed=self.seed
        )


Initializer = Zeros | Uniform | Normal


def initializer_from_proto(msg: types_pb2.Initializer) -> Initializer:
    """Build an initializer from its wire form; an unset kind means zeros."""
    kind = msg.WhichOneof("kind")
    if kind == "uniform":
        return Uniform(low=msg.uniform.low, high=msg.uniform.high, seed=msg.seed)
    if kind == "normal":
        return Normal(std=msg.normal.std, mean=msg.normal.mean, seed=msg.seed)
    return Zeros(seed=msg.seed)
