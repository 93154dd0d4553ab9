"""The shuffled-naive control's batches and the model comparison (launcher/divergence.py)."""

from __future__ import annotations

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.data import DataSpec, SparseDataset, read_all
from heraldps.data.global_batches import InMemoryBatches
from launcher.divergence import ShuffledBatches, model_difference

TRAIN, _ = bundled_data()


def samples(batch: SparseDataset) -> list[tuple[float, tuple[int, ...]]]:
    """Each sample as (label, keys), sorted: a batch's samples in no order."""
    return sorted(
        (float(batch.labels[i]), tuple(batch.keys[batch.offsets[i] : batch.offsets[i + 1]]))
        for i in range(batch.rows)
    )


def test_shuffled_batches_hold_the_same_samples_in_another_order() -> None:
    data = read_all(DataSpec(str(TRAIN), stop_row=1024))
    plain = list(InMemoryBatches(data, 128, 5).iter_from(0))
    shuffled = list(ShuffledBatches(data, 128, 5, seed=3).iter_from(0))
    assert len(shuffled) == len(plain) == 5
    for a, b in zip(plain, shuffled, strict=True):
        assert samples(a) == samples(b)
        assert not np.array_equal(a.labels, b.labels) or not np.array_equal(a.keys, b.keys)
        assert b.fields is not None and b.fields.shape == b.keys.shape
    # A resumed feeder submits the same batches; another seed, another order.
    resumed = list(ShuffledBatches(data, 128, 5, seed=3).iter_from(2))
    assert all(np.array_equal(a.keys, b.keys) for a, b in zip(resumed, shuffled[2:], strict=True))
    other = next(ShuffledBatches(data, 128, 5, seed=4).iter_from(0))
    assert not np.array_equal(other.keys, shuffled[0].keys)


def model(keys: list[int], values: list[float], versions: list[int]) -> dict[str, np.ndarray]:
    n = len(keys)
    return {
        "keys": np.array(keys, np.int64),
        "values": np.array(values, np.float32).reshape(n, 1),
        "state": np.zeros((n, 1), np.float32),
        "versions": np.array(versions, np.int64),
        "dense_values": np.ones((2, 3), np.float32),
        "dense_state": np.zeros((2, 3), np.float32),
    }


def test_models_compare_key_by_key_whatever_order_the_ps_returned() -> None:
    a = model([5, 1, 9], [0.5, 0.1, 0.9], [2, 1, 3])
    same = model([1, 9, 5], [0.1, 0.9, 0.5], [1, 3, 2])
    assert model_difference(a, same).bit_identical
    near = model([9, 1, 5], [0.9, 0.1, 0.5 + 2**-20], [3, 1, 2])
    diff = model_difference(a, near)
    assert not diff.bit_identical and diff.versions_equal
    assert diff.largest == diff.values == pytest.approx(2**-20, rel=1e-6)
    assert not model_difference(a, model([5, 1, 9], [0.5, 0.1, 0.9], [2, 1, 4])).versions_equal
    with pytest.raises(ValueError, match="different keys"):
        model_difference(a, model([5, 1, 8], [0.5, 0.1, 0.9], [2, 1, 3]))
