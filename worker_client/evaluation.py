"""Offline metrics of a CTR model: ROC AUC and logloss (host NumPy, float64)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument

CLIP = 1e-7


def _pair(
    labels: npt.ArrayLike, values: npt.ArrayLike, what: str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Both as 1-D float64 arrays of the same, non-zero length, labels 0/1, values finite."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if y.shape != v.shape:
        raise InvalidArgument(
            f"labels and {what} must have the same length, got {y.shape[0]} and {v.shape[0]}"
        )
    if y.shape[0] == 0:
        raise InvalidArgument(f"labels and {what} are empty; evaluate at least one sample")
    if not np.all((y == 0) | (y == 1)):
        raise InvalidArgument("labels must be 0 or 1")
    if not np.all(np.isfinite(v)):
        raise InvalidArgument(f"{what} contain NaN or Inf; check the model's output")
    return y, v


def auc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """ROC AUC: the probability a random positive outscores a random negative.

    Computed from ranks (Mann-Whitney U); tied scores get their average rank,
    so a tie between a positive and a negative counts one half.
    """
    y, s = _pair(labels, scores, "scores")
    positives = int(np.count_nonzero(y))
    negatives = y.shape[0] - positives
    if positives == 0 or negatives == 0:
        raise InvalidArgument(
            f"AUC needs both classes, got {positives} positives and {negatives} negatives; "
            "evaluate on more samples"
        )
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    # 1-based average rank of each distinct score: ranks before it plus the middle of its run.
    before = np.cumsum(counts) - counts
    ranks = (before + (counts + 1) / 2.0)[inverse.reshape(-1)]
    rank_sum = float(ranks[y == 1].sum())
    u = rank_sum - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))


def logloss(labels: npt.ArrayLike, probabilities: npt.ArrayLike) -> float:
    """Mean binary cross-entropy, probabilities clipped to [1e-7, 1 - 1e-7]."""
    y, p = _pair(labels, probabilities, "probabilities")
    p = np.clip(p, CLIP, 1.0 - CLIP)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
