"""L2 (``Optimizer.l2``) on real shard servers: a row updated at the PS and the same row
updated in a worker cache with the same gradients stay bit-identical, on the Staged-PS and
the Cached-PS, for every optimizer. The PS gets its optimizer over the wire (float32
fields), the cache the Python one a job builds: both must give the same bits. The cache
runs on NumPy and on the CuPy stand-in (``tests.fakecupy``, NumPy's arithmetic behind a
device-array interface), which checks the device code path, not a GPU's arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heraldps.init import Normal
from heraldps.optim import SGD, AdaGrad, Adam, Optimizer
from tests import fakecupy
from tests.conftest import ClusterFactory
from worker_client.cache import EmbeddingCache

DIM = 6
OPTIMIZERS = [
    SGD(lr=0.1, l2=0.05),
    AdaGrad(lr=0.05, initial_accumulator=0.1, eps=1e-8, l2=0.05),
    Adam(lr=0.01, eps=1e-6, l2=0.05),
]


@pytest.mark.parametrize(("store", "xp"), [("staged", np), ("cached", np), ("staged", fakecupy)])
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o.name)
def test_cache_and_ps_rows_stay_bit_identical_with_l2(
    opt: Optimizer, store: str, xp: Any, cluster: ClusterFactory, tmp_path: Path
) -> None:
    extra = {"store": "cached", "data_dir": str(tmp_path)} if store == "cached" else {}
    _, ps = cluster(2, **extra)
    ps.create_table("emb", dim=DIM, optimizer=opt, initializer=Normal(std=0.1, seed=5))
    keys = np.arange(30, dtype=np.int64) * 7
    values, versions, state = ps.pull_with_state("emb", keys)
    start = values.copy()
    cache = EmbeddingCache(64, DIM, opt.state_width(DIM), "lru", xp)
    slots = cache.admit(keys, values, state, versions)
    rng = np.random.default_rng(9)
    for it in range(5):
        grads = rng.normal(size=(keys.shape[0], DIM)).astype(np.float32)
        grads[:10] = 0.0  # rows moved by L2 alone
        cache.mark_trained(slots, xp.asarray(grads), opt)
        ps.push_gradients("emb", keys, grads, it)
        ps.commit(it)
    got_values, _, got_state = ps.pull_with_state("emb", keys)
    cached_values, cached_state = cache.host_rows(keys)
    assert np.array_equal(got_values, cached_values)
    assert np.array_equal(got_state, cached_state)
    # L2 did act: rows with zero gradients shrank (SGD: by (1 - lr * l2) per step).
    assert np.all(np.abs(got_values[:10]) < np.abs(start[:10]))
    if isinstance(opt, SGD):
        expected = start[:10].copy()
        for _ in range(5):
            expected -= np.float32(opt.lr) * (np.float32(opt.l2) * expected)
        assert np.array_equal(got_values[:10], expected)
