"""The worker's embedding cache and mini-batch layout on NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from heraldps.data import SparseDataset
from heraldps.errors import FailedPrecondition, InvalidArgument
from heraldps.optim import SGD
from worker_client.cache import EmbeddingCache
from worker_client.minibatch import global_batches, select


def rows(keys: list[int], dim: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = np.array(keys, dtype=np.int64)
    values = np.repeat(k[:, None], dim, axis=1).astype(np.float32)
    return k, values, np.zeros((len(keys), 1), np.float32)


def test_admit_lookup_evict_and_reuse_slots() -> None:
    cache = EmbeddingCache(4, 2, 1)
    keys, values, state = rows([10, 20, 30])
    slots = cache.admit(keys, values, state, np.array([1, 2, 3]))
    assert len(cache) == 3 and cache.free == 1
    assert cache.slots(np.array([30, 99, 10])).tolist() == [slots[2], -1, slots[0]]
    assert np.array_equal(cache.host_rows(keys)[0], values)
    assert cache.clocks(slots).tolist() == [1, 2, 3] and not cache.dirty(slots).any()
    cache.evict(np.array([20]))
    assert cache.slots(np.array([20])).tolist() == [-1] and cache.free == 2
    more, mv, ms = rows([40, 50])
    cache.admit(more, mv, ms, np.zeros(2, np.int64))
    assert cache.free == 0 and sorted(cache.cached_keys().tolist()) == [10, 30, 40, 50]
    with pytest.raises(FailedPrecondition, match="cannot add 1"):
        cache.admit(*rows([60]), np.zeros(1, np.int64))
    with pytest.raises(FailedPrecondition, match="not cached"):
        cache.evict(np.array([20]))
    # A held key is refreshed in place (same slot, new value and clock), not added.
    again = cache.admit(np.array([10]), np.full((1, 2), 7, np.float32), ms[:1], np.array([5]))
    assert again.tolist() == [slots[0]] and cache.clocks(again).tolist() == [5]
    assert cache.host_rows(np.array([10]))[0].tolist() == [[7.0, 7.0]]


def test_trained_rows_are_dirty_until_written_back() -> None:
    """The state machine: admit (clean) -> mark_trained (dirty, clock + 1) -> write back."""
    cache = EmbeddingCache(4, 2, 1)
    keys, values, state = rows([10, 20])
    slots = cache.admit(keys, values, state, np.array([3, 0]))
    cache.mark_trained(slots[:1], np.ones((1, 2), np.float32), SGD(lr=0.5))
    assert cache.dirty(slots).tolist() == [True, False] and cache.dirty_keys().tolist() == [10]
    assert cache.clocks(slots).tolist() == [4, 0]
    assert cache.updates_since_fetch(slots).tolist() == [1, 0]
    assert cache.host_rows(keys[:1])[0].tolist() == [[9.5, 9.5]]  # the PS's SGD step
    # A dirty row is never overwritten by the PS's older copy.
    with pytest.raises(FailedPrecondition, match="dirty"):
        cache.admit(keys[:1], values[:1], state[:1], np.array([3]))
    out = cache.rows_for_write_back(keys[:1])
    assert out.base_versions.tolist() == [3] and out.new_versions.tolist() == [4]
    assert cache.dirty(slots[:1]).tolist() == [True]  # nothing changes before the PS stored it
    cache.mark_written(out)
    assert cache.dirty_count() == 0 and cache.updates_since_fetch(slots[:1]).tolist() == [0]
    with pytest.raises(FailedPrecondition, match="not cached"):
        cache.rows_for_write_back(np.array([99]))


def test_rows_pulled_without_state_are_never_updated_here() -> None:
    """A row pulled as its value alone (its gradient goes to the PS) may be trained on, not
    updated: the cache refuses before anything changes, until a pull with state refreshes it."""
    cache = EmbeddingCache(4, 2, 1)
    keys, values, state = rows([10, 20, 30])
    slots = cache.admit(keys, values, state, np.array([1, 1, 1]), np.array([True, False, True]))
    assert np.array_equal(cache.gather(slots), values)
    with pytest.raises(FailedPrecondition, match=r"without their optimizer state.*\[20\]"):
        cache.mark_trained(slots, np.ones((3, 2), np.float32), SGD(lr=0.5))
    assert not cache.dirty(slots).any() and cache.clocks(slots).tolist() == [1, 1, 1]
    assert np.array_equal(cache.host_rows(keys)[0], values)
    cache.admit(keys[1:2], values[1:2], state[1:2], np.array([2]))  # pulled again, with state
    cache.mark_trained(slots, np.ones((3, 2), np.float32), SGD(lr=0.5))
    assert cache.dirty(slots).all()


def test_pending_gradients_are_taken_once() -> None:
    """HET: gradients accumulate per row and leave with take_pending, which cleans the row."""
    cache = EmbeddingCache(4, 2, 0)
    keys, values, _ = rows([10, 20, 30])
    slots = cache.admit(keys, values, np.zeros((3, 0), np.float32), np.zeros(3, np.int64))
    grads = np.arange(6, dtype=np.float32).reshape(3, 2)
    cache.add_pending(slots[:2], grads[:2])
    cache.add_pending(slots[:1], grads[:1])
    cache.mark_trained(slots[:2], grads[:2], SGD(lr=0.1))
    taken = cache.take_pending(slots)  # 30 was never trained: not taken
    assert taken.keys.tolist() == [10, 20]
    assert taken.grads.tolist() == [[0.0, 2.0], [2.0, 3.0]]
    assert taken.steps.tolist() == [2, 1]  # local steps each sum stands for
    assert cache.dirty_count() == 0
    assert cache.take_pending(slots).keys.shape == (0,)
    # Steps start anew after a take and after a refetch.
    cache.add_pending(slots[:1], grads[:1])
    cache.mark_trained(slots[:1], grads[:1], SGD(lr=0.1))
    assert cache.take_pending(slots).steps.tolist() == [1]
    cache.add_pending(slots[:1], grads[:1])
    cache.admit(keys[1:2], values[1:2], np.zeros((1, 0), np.float32), np.ones(1, np.int64))
    cache.mark_trained(slots[1:2], grads[1:2], SGD(lr=0.1))
    cache.add_pending(slots[1:2], grads[1:2])
    assert cache.take_pending(slots[1:2]).steps.tolist() == [1]


def test_lru_and_lfu_victims_skip_the_rows_kept() -> None:
    for policy, expected in (("lru", [10, 20]), ("lfu", [10, 30])):
        cache = EmbeddingCache(4, 2, 1, policy=policy)
        keys, values, state = rows([10, 20, 30, 40])
        slots = cache.admit(keys, values, state, np.zeros(4, np.int64))
        for _ in range(3):
            cache.gather(slots[[1, 3]])  # 20 and 40: used often, long ago
        cache.gather(slots[[2]])  # 30: used once, recently
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
