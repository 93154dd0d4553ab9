"""The Cached-PS host cache: its running count of pull-created rows stays exact."""

from __future__ import annotations

import numpy as np

from ps_server.row_cache import RowCache


def test_fresh_rows_count_matches_a_recount_through_admits_stores_and_evictions() -> None:
    rng = np.random.default_rng(3)
    cache = RowCache(capacity=64, dim=2, state_width=1)
    for _ in range(300):
        keys = np.unique(rng.integers(0, 200, rng.integers(1, 40)))
        slots = cache.lookup(keys)
        hit = slots >= 0
        missed = keys[~hit]
        admitted = cache.admit(missed, float(hit.mean()), keep=slots[hit])
        n = missed.shape[0]
        on_disk = rng.random(n) < 0.5  # some rows came from LMDB, others were just created
        cache.store(admitted, np.zeros((n, 2), np.float32), np.zeros((n, 1), np.float32),
                    np.zeros(n, np.int64), np.full(n, -1, np.int64), on_disk)  # fmt: skip
        if rng.random() < 0.3:  # a commit writes some cached rows through: now on disk
            written = cache.lookup(keys[: max(1, keys.shape[0] // 2)])
            k = written.shape[0]
            cache.store(written, np.ones((k, 2), np.float32), np.ones((k, 1), np.float32),
                        np.ones(k, np.int64), np.zeros(k, np.int64), True)  # fmt: skip
        recount = int(np.count_nonzero(cache.occupied & ~cache.on_disk))
        assert cache.fresh_rows == recount
    assert cache.num_evict > 0
    cache.clear()
    assert cache.fresh_rows == 0 and len(cache) == 0
