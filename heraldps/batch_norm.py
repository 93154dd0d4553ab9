"""Batch normalization of a hidden layer with the statistics of the global batch.

A worker holds only its share of a global batch, so the batch's mean and variance,
and the two sums the backward pass needs, are reduced over every worker with the
caller's ``batch_sum`` (None: this process holds the whole batch). Forward: one
reduction of ``[count, sum(z - c), sum((z - c)^2)]``, shifted by ``c``, the running
mean (the same on every worker), so float32 sums of values far from zero do not
cancel; backward: one of ``[sum(dxhat), sum(dxhat * xhat)]``. Local sums are taken in
float64 and sent as float32; the reduced sums are the same bits on every worker, so
everything derived from them (the statistics, the new running statistics) is too.

The arithmetic is torch.nn.BatchNorm1d's: normalize with the biased batch variance,
update ``running_var`` with the unbiased one (``N / (N - 1)``), momentum 0.1, eps 1e-5.
Written over an array module ``xp`` (NumPy or CuPy) with explicit dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from heraldps.arrays import to_host

f32, f64 = np.float32, np.float64
EPS = 1e-5  # added to the variance (torch's default)
MOMENTUM = 0.1  # of the running statistics (torch's default)

#: Sums a float32 vector over every worker of the global batch (the same bits on each).
BatchSum = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]


class Normalized(NamedTuple):
    """What the backward pass of one layer needs, and the layer's new running statistics."""

    xhat: Any  # [B, H] float32: (z - mean) * inv_std
    inv_std: Any  # [H] float32
    count: Any  # [1] float32: samples in the global batch (at least 1)
    running_mean: Any  # [H] float32, after this step
    running_var: Any  # [H] float32, after this step


def reduce(xp: Any, local: Any, batch_sum: BatchSum | None) -> Any:
    """``local`` (float64 on the device) summed over the global batch, as float32 on the
    device: cast, then all-reduced by ``batch_sum`` (one host round trip) if given."""
    sums = local.astype(f32)
    if batch_sum is None:
        return sums
    return xp.asarray(np.asarray(batch_sum(to_host(sums)), dtype=f32))


def normalize_train(
    xp: Any, z: Any, running_mean: Any, running_var: Any, batch_sum: BatchSum | None
) -> Normalized:
    """``z`` ``[B, H]`` normalized with the global batch's mean and biased variance."""
    width = z.shape[1]
    d = z - running_mean  # float32, as every worker computes it
    d64 = d.astype(f64)
    count = xp.full(1, z.shape[0], dtype=f64)
    sums = reduce(xp, xp.concatenate([count, d64.sum(axis=0), (d64 * d64).sum(axis=0)]),
                  batch_sum).astype(f64)  # fmt: skip
    n = xp.maximum(sums[0:1], f64(1))  # an empty global batch: zeros, not NaN
    shift = sums[1 : 1 + width] / n
    var = xp.maximum(sums[1 + width :] / n - shift * shift, f64(0))
    mean = running_mean.astype(f64) + shift
    inv_std = (f64(1) / xp.sqrt(var + f64(EPS))).astype(f32)
    xhat = (z - mean.astype(f32)) * inv_std
    unbiased = var * n / xp.maximum(n - f64(1), f64(1))  # one sample: its variance, 0
    m = f64(MOMENTUM)
    new_mean = (m * mean + (f64(1) - m) * running_mean.astype(f64)).astype(f32)
    new_var = (m * unbiased + (f64(1) - m) * running_var.astype(f64)).astype(f32)
    return Normalized(xhat, inv_std, n.astype(f32), new_mean, new_var)


def normalize_eval(xp: Any, z: Any, running_mean: Any, running_var: Any) -> Any:
    """``z`` normalized with the running statistics (prediction)."""
    inv_std = (f64(1) / xp.sqrt(running_var.astype(f64) + f64(EPS))).astype(f32)
    return (z - running_mean) * inv_std


def backward(xp: Any, dxhat: Any, norm: Normalized, batch_sum: BatchSum | None) -> Any:
    """d loss / d z from d loss / d xhat: the standard batch-norm input gradient,
    ``inv_std * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))`` over the global batch."""
    local = xp.concatenate([dxhat.astype(f64).sum(axis=0),
                            (dxhat * norm.xhat).astype(f64).sum(axis=0)])  # fmt: skip
    sums = reduce(xp, local, batch_sum)
    width = dxhat.shape[1]
    n = norm.count
    mean_dxhat, mean_dxhat_xhat = sums[:width] / n, sums[width:] / n
    return norm.inv_std * (dxhat - mean_dxhat - norm.xhat * mean_dxhat_xhat)
