"""Key routing and deterministic initializers."""

from __future__ import annotations

import numpy as np
import pytest

from heraldps.client.routing import count, plan_requests
from heraldps.init import Normal, Uniform, Zeros, initializer_from_proto
from heraldps.sharding import shard_of, split_by_shard


def test_shards_are_balanced_and_stable() -> None:
    keys = np.arange(300_000, dtype=np.int64)
    counts = np.bincount(shard_of(keys, 3), minlength=3)
    assert counts.min() > 0.97 * 100_000
    assert np.array_equal(shard_of(keys, 3), shard_of(keys.copy(), 3))


def test_adding_a_shard_moves_keys_only_to_the_new_shard() -> None:
    keys = np.random.default_rng(0).integers(-(2**62), 2**62, 100_000)
    before, after = shard_of(keys, 4), shard_of(keys, 5)
    moved = before != after
    assert np.all(after[moved] == 4)
    assert 0.15 < moved.mean() < 0.25  # about 1/5


def test_split_by_shard_reassembles_in_caller_order() -> None:
    keys = np.random.default_rng(2).integers(0, 1000, 5000)
    order, slices = split_by_shard(keys, 3)
    shards = shard_of(keys, 3)
    out = np.empty_like(keys)
    for s, part in enumerate(slices):
        assert np.all(shards[order[part]] == s)
        out[order[part]] = keys[order[part]]
    assert np.array_equal(out, keys)


@pytest.mark.parametrize("shards", [1, 3])
def test_requests_cut_each_shard_part_into_equal_pieces(shards: int) -> None:
    keys = np.random.default_rng(4).integers(-(2**62), 2**62, 10_001)
    for per_request in (700, 4000, 10**6):
        plan = plan_requests(keys, shards, per_request)
        covered = np.zeros(keys.shape[0], dtype=np.int64)
        for shard in range(shards):
            sizes = [count(index, keys.shape[0]) for s, index in plan if s == shard]
            assert max(sizes) <= per_request and max(sizes) - min(sizes) <= 1
            assert len(sizes) == -(-sum(sizes) // per_request)
        for shard, index in plan:
            covered[index] += 1
            assert np.all(shard_of(keys[index], shards) == shard)
        assert (covered == 1).all()
    assert plan_requests(keys[:0], 1, 10) == []


@pytest.mark.parametrize("init", [Normal(std=0.5, seed=3), Uniform(-1, 2, seed=9), Zeros()])
def test_row_depends_only_on_seed_and_key(init: Normal | Uniform | Zeros) -> None:
    keys = np.array([5, -1, 1 << 40, 5, 123], dtype=np.int64)
    rows = init.generate(keys, 8)
    assert rows.dtype == np.float32 and rows.shape == (5, 8)
    assert np.array_equal(rows[0], rows[3])
    alone = np.concatenate([init.generate(keys[i : i + 1], 8) for i in range(5)])
    assert np.array_equal(rows, alone)
    assert np.array_equal(initializer_from_proto(init.to_proto()).generate(keys, 8), rows)


def test_initializer_distributions() -> None:
    keys = np.arange(20_000, dtype=np.int64)
    n = Normal(std=0.1, mean=1.0, seed=1).generate(keys, 16)
    assert abs(n.mean() - 1.0) < 0.002 and abs(n.std() - 0.1) < 0.002
    u = Uniform(-0.5, 1.5, seed=1).generate(keys, 16)
    assert u.min() >= -0.5 and u.max() < 1.5 and abs(u.mean() - 0.5) < 0.01
    other_seed = Normal(std=0.1, mean=1.0, seed=2).generate(keys, 16)
    assert not np.array_equal(n, other_seed)
