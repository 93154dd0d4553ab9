"""Dropout masks that depend only on what a sample is, never on who trains it.

A hidden unit's mask bit is a counter-based hash (splitmix64) of (job seed, layer,
the sample's global index, unit), where the global index is ``iteration x global batch
+ index in the global batch``. Whichever worker a plan hands a sample to, and in
whichever mode, the sample drops the same units, so dropout changes no mode's model and
Herald still changes only the traffic. Written over an array module ``xp`` with
uint64 arithmetic (wrapping, as in C), so NumPy and CuPy draw the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
    stream = _mix_host(_mix_host(seed) ^ (layer + 1) * GOLDEN)
    units = xp.arange(width, dtype=np.uint64)
    counter = sample_ids.astype(np.uint64)[:, None] * np.uint64(width) + units[None, :]
    bits = _mix(counter * np.uint64(GOLDEN) + np.uint64(stream))
    return (bits >> np.uint64(64 - UNIFORM_BITS)).astype(np.float32) * np.float32(
        2.0**-UNIFORM_BITS
    )


def dropout_mask(xp: Any, rate: float, seed: int, layer: int, sample_ids: Any, width: int) -> Any:
    """Inverted-dropout mask ``[samples, width]``: 0 for a dropped unit, ``1 / (1 - rate)``
    for a kept one, so a layer's expected output is the same with and without dropout."""
    keep = uniforms(xp, seed, layer, sample_ids, width) >= np.float32(rate)
    return keep.astype(np.float32) * np.float32(1.0 / (1.0 - rate))
