"""Dense transforms and the exact streamed statistics they use.

Per column, on float64 values with NaN marking a missing cell:

- ``log1p``: ``log1p(max(x, 0))`` (Criteo's usual preprocessing); missing -> 0.0.
- ``standardize``: ``(x - mean) / std``; missing -> 0.0 (the mean); a constant column
  (std 0) -> 0.0 everywhere.
- ``minmax``: ``(x - min) / (max - min)``, in [0, 1] on the data it was fitted on (not
  clipped elsewhere); missing -> the mean's position ``(mean - min) / (max - min)``, the
  same mean imputation as ``standardize``; a constant column (max == min) -> 0.0.
- ``raw``: ``x``; missing -> 0.0.

Statistics (``DenseStats``) come from a full first pass (``reader.scan``) and are merged
per chunk with Chan et al.'s pairwise update in float64, so they do not depend on how the
stream was cut into chunks beyond float64 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from heraldps.data.errors import DataError
from heraldps.data.spec import NEEDS_STATS, DataSpec, DenseStats

Floats = npt.NDArray[np.float64]


def apply(
    values: Floats, transform: str, stats: DenseStats | None, column: str
) -> npt.NDArray[np.float32]:
    """One column's values (NaN = missing) transformed to float32."""
    missing = np.isnan(values)
    if transform in NEEDS_STATS and stats is None:
        raise DataError(_needs_stats(column, transform))
    if transform == "log1p":
        out = np.log1p(np.maximum(np.where(missing, 0.0, values), 0.0))
    elif transform == "raw":
        out = np.where(missing, 0.0, values)
    elif transform == "standardize":
        assert stats is not None
        if stats.max > stats.min and stats.std > 0.0:
            out = np.where(missing, 0.0, (values - stats.mean) / stats.std)
        else:
            out = np.zeros_like(values)
    elif transform == "minmax":
        assert stats is not None
        span = stats.max - stats.min
        if span > 0.0:
            filled = np.where(missing, stats.mean, values)
            out = (filled - stats.min) / span
        else:
            out = np.zeros_like(values)
    else:
        raise DataError(f"unknown dense transform {transform!r}")
    return out.astype(np.float32)


def apply_columns(
    values: Floats,
    transforms: tuple[str, ...],
    stats: tuple[DenseStats, ...] | None,
    columns: tuple[str, ...],
) -> npt.NDArray[np.float32]:
    """Dense columns ``values[column, row]`` (NaN = missing; overwritten as scratch) as
    float32 ``[row, column]``: one vectorized pass over the whole block when every column
    has the same transform (the usual case), else ``apply`` per column. The arithmetic is
    ``apply``'s, element by element, so both give the same bits."""
    count, rows = values.shape
    out = np.empty((rows, count), dtype=np.float32)
    if count == 0:
        return out
    kinds = set(transforms)
    if len(kinds) > 1 or (kinds & set(NEEDS_STATS) and stats is None):
        for j in range(count):
            out[:, j] = apply(
                values[j], transforms[j], None if stats is None else stats[j], columns[j]
            )
        return out
    (transform,) = kinds
    missing = np.isnan(values)
    if transform == "log1p":
        np.copyto(values, 0.0, where=missing)
        np.maximum(values, 0.0, out=values)
        np.log1p(values, out=values)
    elif transform == "raw":
        np.copyto(values, 0.0, where=missing)
    elif transform == "standardize":
        assert stats is not None
        mean = np.array([s.mean for s in stats])[:, None]
        std = np.array([s.std for s in stats])[:, None]
        usable = np.array([s.max > s.min and s.std > 0.0 for s in stats])
        values -= mean
        values /= np.where(usable[:, None], std, 1.0)
        np.copyto(values, 0.0, where=missing | ~usable[:, None])
    elif transform == "minmax":
        assert stats is not None
        mean = np.array([s.mean for s in stats])[:, None]
        low = np.array([s.min for s in stats])[:, None]
        span = np.array([s.max - s.min for s in stats])[:, None]
        usable = span > 0.0
        np.copyto(values, np.broadcast_to(mean, values.shape), where=missing)
        values -= low
        values /= np.where(usable, span, 1.0)
        np.copyto(values, 0.0, where=~np.broadcast_to(usable, values.shape))
    else:
        raise DataError(f"unknown dense transform {transform!r}")
    out[...] = values.T
    return out


def _needs_stats(column: str, transform: str) -> str:
    return (
        f"dense column {column!r} uses transform {transform!r}, which needs statistics from a "
        "first pass; run scan(spec) and read with spec.with_stats(profile.dense_stats)"
    )


def require_stats(spec: DataSpec) -> None:
    """Refuse, before reading, a spec whose transforms need statistics it does not have."""
    if spec.dense_stats is None:
        for column, transform in zip(spec.dense(), spec.transforms(), strict=True):
            if transform in NEEDS_STATS:
                raise DataError(_needs_stats(column, transform))


@dataclass
class StatsAccumulator:
    """Streamed count, missing, mean, M2, min, max of one column."""

    column: str
    count: int = 0
    missing: int = 0
    mean: float = 0.0
    m2: float = 0.0
    low: float = field(default=np.inf)
    high: float = field(default=-np.inf)

    def add(self, values: Floats) -> None:
        """Fold in one chunk (NaN = missing)."""
        present = values[~np.isnan(values)]
        self.missing += int(values.shape[0] - present.shape[0])
        n = int(present.shape[0])
        if n == 0:
            return
        mean = float(present.mean())
        m2 = float(np.square(present - mean).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total
        self.low = min(self.low, float(present.min()))
        self.high = max(self.high, float(present.max()))

    def stats(self) -> DenseStats:
        """The statistics so far; an all-missing column has mean, std, min, max 0."""
        if self.count == 0:
            return DenseStats(self.column, 0, self.missing, 0.0, 0.0, 0.0, 0.0)
        std = float(np.sqrt(max(self.m2 / self.count, 0.0)))
        return DenseStats(
            self.column, self.count, self.missing, self.mean, std, self.low, self.high
        )
