"""The worker's embedding cache and mini-batch layout on NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from heraldps.datasets import SparseDataset
from heraldps.errors import FailedPrecondition, InvalidArgument
from worker_client.cache import EmbeddingCache
from worker_client.minibatch import global_batches, select


def rows(keys: list[int], dim: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = np.array(keys, dtype=np.int64)
    values = np.repeat(k[:, None], dim, axis=1).astype(np.float32)
    return k, values, np.zeros((len(keys), 1), np.float32)


def test_insert_lookup_remove_and_reuse_slots() -> None:
    cache = EmbeddingCache(4, 2, 1)
    keys, values, state = rows([10, 20, 30])
    slots = cache.insert(keys, values, state, np.array([1, 2, 3]))
    assert len(cache) == 3 and cache.free == 1
    assert cache.slots(np.array([30, 99, 10])).tolist() == [slots[2], -1, slots[0]]
    assert np.array_equal(cache.values[cache.slots(keys)], values)
    assert cache.start[slots].tolist() == [1, 2, 3] and not cache.dirty[slots].any()
    cache.remove(np.array([20]))
    assert cache.slots(np.array([20])).tolist() == [-1] and cache.free == 2
    more, mv, ms = rows([40, 50])
    cache.insert(more, mv, ms, np.zeros(2, np.int64))
    assert cache.free == 0 and sorted(cache.cached_keys().tolist()) == [10, 30, 40, 50]
    with pytest.raises(FailedPrecondition, match="cannot add 1"):
        cache.insert(*rows([60])[:1], mv[:1], ms[:1], np.zeros(1, np.int64))
    with pytest.raises(FailedPrecondition, match="not cached"):
        cache.remove(np.array([20]))


def test_lru_and_lfu_victims_skip_the_rows_kept() -> None:
    for policy, expected in (("lru", [10, 20]), ("lfu", [10, 30])):
        cache = EmbeddingCache(4, 2, 1, policy=policy)
        keys, values, state = rows([10, 20, 30, 40])
        slots = cache.insert(keys, values, state, np.zeros(4, np.int64))
        for _ in range(3):
            cache.touch(slots[[1, 3]])  # 20 and 40: used often, long ago
        cache.touch(slots[[2]])  # 30: used once, recently
        # LRU: 10 (never used), then 20; LFU: 10 (0 uses), then 30 (1 use). 40 is kept.
        victims = cache.victims(2, keep=slots[[3]])
        assert victims.tolist() == expected, policy
    with pytest.raises(FailedPrecondition, match="raise the cache size"):
        cache.victims(4, keep=slots[:1])
    with pytest.raises(InvalidArgument, match="lru, lfu"):
        EmbeddingCache(4, 2, 1, policy="fifo")


def test_select_lays_out_fields_and_distinct_keys() -> None:
    # Sample 0: fields 0, 2; sample 1: fields 0, 1; sample 2: field 1.
    batch = SparseDataset(
        offsets=np.array([0, 2, 4, 5], np.int64),
        keys=np.array([7, 9, 7, 8, 8], np.int64),
        labels=np.array([1, 0, 1], np.float32),
        dense=np.arange(3, dtype=np.float32)[:, None],
        sparse_columns=("a", "b", "c"),
        dense_columns=("d",),
        fields=np.array([0, 2, 0, 1, 1], np.int32),
    )
    mb = select(batch, np.array([1, 2], np.int64))
    assert mb.keys.tolist() == [7, 8]
    assert mb.field_rows.tolist() == [[0, 1, -1], [-1, 1, -1]]
    assert mb.labels.tolist() == [0, 1] and mb.dense[:, 0].tolist() == [1, 2]
    full = select(batch, np.arange(3, dtype=np.int64))
    assert full.keys.tolist() == [7, 9, 8] and full.field_rows[0].tolist() == [0, -1, 1]
    with pytest.raises(InvalidArgument, match="sample indices"):
        select(batch, np.array([3], np.int64))
    assert [b.rows for b in global_batches(batch, 2, None, epochs=3)] == [2, 2, 2]
    assert global_batches(batch, 2, 2, epochs=3)[1].labels.tolist() == [1, 0]
    with pytest.raises(InvalidArgument, match="fewer than one global batch"):
        global_batches(batch, 4, None)
