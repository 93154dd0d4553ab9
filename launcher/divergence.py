"""How far two runs' models are apart, and how far chance alone moves them.

Every mode with staleness 0 trains the same model up to float32 summation
order: a key's gradient and the dense gradient are sums over the global
batch, and which worker holds which sample decides the order of the terms.
The modes that assign samples alike (naive, on_demand, het) end bit-identical,
as do location_aware, herald and herald_pipelined; between the two groups the
models differ by rounding. ``ShuffledBatches`` is the yardstick for that
rounding: naive with each global batch's samples permuted (the same batches,
the same loss, another order of the same terms). A mode whose distance from
naive is within these controls' differs from it by summation order only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from heraldps.data import SparseDataset
from heraldps.data.global_batches import InMemoryBatches

#: The arrays of a model read back from the PS (``run_mode(..., keep_model=True)``).
ROW_FIELDS = ("values", "state")
DENSE_FIELDS = ("dense_values", "dense_state")


@dataclass(frozen=True)
class ShuffledBatches(InMemoryBatches):
    """The run's global batches, each with its samples in a seeded random order.

    Batch ``t`` holds the same samples as in ``InMemoryBatches``; the permutation
    depends only on ``(seed, t)``, so a resumed feeder submits the same batches."""

    seed: int = 0

    def iter_from(self, start: int) -> Iterator[SparseDataset]:
        for t, batch in enumerate(super().iter_from(start), start):
            order = np.random.default_rng([self.seed, t]).permutation(batch.rows)
            yield batch.take(order.astype(np.int64))


@dataclass(frozen=True)
class ModelDifference:
    """Largest absolute differences between two models, field by field."""

    values: float  # embedding rows
    state: float  # their optimizer state
    dense_values: float
    dense_state: float
    versions_equal: bool

    @property
    def largest(self) -> float:
        """The largest difference over embeddings, dense parameters and optimizer state."""
        return max(self.values, self.state, self.dense_values, self.dense_state)

    @property
    def bit_identical(self) -> bool:
        return self.largest == 0.0 and self.versions_equal


def _by_key(model: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = np.argsort(model["keys"], kind="stable")
    return {f: model[f][order] for f in ("keys", "versions", *ROW_FIELDS)}


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        raise ValueError(f"the models' arrays differ in shape: {a.shape} and {b.shape}")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def model_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> ModelDifference:
    """Compare two final models key by key (the PS returns rows in no set order).

    Both runs must have trained the same keys, as any two runs over the same batches do."""
    rows_a, rows_b = _by_key(a), _by_key(b)
    if not np.array_equal(rows_a["keys"], rows_b["keys"]):
        raise ValueError(
            f"the models hold different keys ({len(rows_a['keys'])} and {len(rows_b['keys'])}); "
            "compare runs over the same batches"
        )
    return ModelDifference(
        values=_max_abs(rows_a["values"], rows_b["values"]),
        state=_max_abs(rows_a["state"], rows_b["state"]),
        dense_values=_max_abs(a["dense_values"], b["dense_values"]),
        dense_state=_max_abs(a["dense_state"], b["dense_state"]),
        versions_equal=bool(np.array_equal(rows_a["versions"], rows_b["versions"])),
    )
