"""Dropout masks that depend only on what a sample is, never on who trains it.

A hidden unit's mask bit is a counter-based hash (splitmix64) of (job seed, layer,
the sample's global index, unit), where the global index is ``iteration x global batch
+ index in the global batch``. Whichever worker a plan hands a sample to, and in
whichever mode, the sample drops the same units, so dropout changes no mode's model and
Herald still changes only the traffic. Written over an array module ``xp`` with
uint64 arithmetic (wrapping, as in C), so NumPy and CuPy draw the same bits. On NumPy
a compiled kernel draws the same mask in one pass (the array form makes a temporary
per operation: a third of a BARS-shape training step went there).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.jit import njit

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's stream increment
UNIFORM_BITS = 24  # a float32 holds every multiple of 2**-24 in [0, 1) exactly


def _mix_host(x: int) -> int:
    """splitmix64's finalizer on a Python int (the per-layer stream seed)."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _mix(x: Any) -> Any:
    """splitmix64's finalizer on a uint64 xp array (the products wrap)."""
    u = np.uint64
    x = x ^ (x >> u(30))
    x = x * u(0xBF58476D1CE4E5B9)
    x = x ^ (x >> u(27))
    x = x * u(0x94D049BB133111EB)
    return x ^ (x >> u(31))


def uniforms(xp: Any, seed: int, layer: int, sample_ids: Any, width: int) -> Any:
    """``[len(sample_ids), width]`` float32 uniforms in [0, 1), one per (sample, unit)."""
    stream = _stream(seed, layer)
    units = xp.arange(width, dtype=np.uint64)
    counter = sample_ids.astype(np.uint64)[:, None] * np.uint64(width) + units[None, :]
    bits = _mix(counter * np.uint64(GOLDEN) + np.uint64(stream))
    return (bits >> np.uint64(64 - UNIFORM_BITS)).astype(np.float32) * np.float32(
        2.0**-UNIFORM_BITS
    )


def _stream(seed: int, layer: int) -> int:
    return _mix_host(_mix_host(seed) ^ (layer + 1) * GOLDEN)


@njit(nogil=True)
def _mask_kernel(
    sample_ids: npt.NDArray[np.int64],
    width: int,
    stream: np.uint64,
    rate: np.float32,
    scale: np.float32,
) -> npt.NDArray[np.float32]:  # pragma: no cover - compiled
    """:func:`dropout_mask` on NumPy, element by element: the same uint64 and float32
    operations as :func:`uniforms`, so the same mask bit for bit."""
    out = np.empty((sample_ids.shape[0], width), dtype=np.float32)
    golden = np.uint64(GOLDEN)
    shift = np.uint64(64 - UNIFORM_BITS)
    unit = np.float32(2.0**-UNIFORM_BITS)
    zero = np.float32(0.0)
    for i in range(sample_ids.shape[0]):
        base = np.uint64(sample_ids[i]) * np.uint64(width)
        for j in range(width):
            x = (base + np.uint64(j)) * golden + stream
            x = x ^ (x >> np.uint64(30))
            x = x * np.uint64(0xBF58476D1CE4E5B9)
            x = x ^ (x >> np.uint64(27))
            x = x * np.uint64(0x94D049BB133111EB)
            x = x ^ (x >> np.uint64(31))
            out[i, j] = scale if np.float32(x >> shift) * unit >= rate else zero
    return out


def dropout_mask(xp: Any, rate: float, seed: int, layer: int, sample_ids: Any, width: int) -> Any:
    """Inverted-dropout mask ``[samples, width]``: 0 for a dropped unit, ``1 / (1 - rate)``
    for a kept one, so a layer's expected output is the same with and without dropout."""
    scale = np.float32(1.0 / (1.0 - rate))
    if xp is np:
        ids = np.ascontiguousarray(sample_ids, dtype=np.int64)
        stream = np.uint64(_stream(seed, layer))
        return _mask_kernel(ids, int(width), stream, np.float32(rate), scale)
    keep = uniforms(xp, seed, layer, sample_ids, width) >= np.float32(rate)
    return keep.astype(np.float32) * scale
