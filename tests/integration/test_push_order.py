"""A commit's sums do not depend on the order pushes arrive in (issue #14, section 5).

Float addition is not associative: in float32 ``(1 + 2**-24) + 2**-24`` is 1
but ``(2**-24 + 2**-24) + 1`` is ``1 + 2**-23``. Three workers push the same
keys in different arrival orders to real shards (Staged-PS and Cached-PS): the
committed rows are equal bit for bit, because the PS adds the workers' sums in
worker order. The control, every push marked as worker 0, shows that the
arrival orders really do give different sums.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heraldps.client import PSClient
from heraldps.errors import InvalidArgument
from heraldps.init import Zeros
from heraldps.optim import SGD
from tests.conftest import ClusterFactory

KEYS = np.array([7, 8, 9, 10], dtype=np.int64)
TINY = 2.0**-24
# Worker w's gradients: per key, one worker sends 1.0 and two send 2**-24.
GRADS = {
    0: np.array([[1.0], [TINY], [TINY], [0.5]], dtype=np.float32),
    1: np.array([[TINY], [1.0], [TINY], [0.25]], dtype=np.float32),
    2: np.array([[TINY], [TINY], [1.0], [0.125]], dtype=np.float32),
}
ORDERS = ([0, 1, 2], [2, 1, 0], [1, 2, 0])
# SGD with lr 1 from zeros: minus the sum, added in worker order 0, 1, 2.
IN_WORKER_ORDER = -np.array([[1.0], [1.0], [1.0 + 2 * TINY], [0.875]], dtype=np.float32)


def committed(client: PSClient, iteration: int, order: list[int], tag: bool) -> np.ndarray:
    """Push every worker's gradients in ``order`` to a fresh table, commit, pull."""
    table = f"t{iteration}"
    client.create_table(table, 1, SGD(lr=1.0), Zeros())
    for w in order:
        client.push_gradients(table, KEYS, GRADS[w], iteration, worker=w if tag else 0)
    client.commit(iteration)
    values, _ = client.pull(table, KEYS)
    return values


@pytest.mark.parametrize("store", ["staged", "cached"])
def test_arrival_order_does_not_change_the_committed_bits(
    cluster: ClusterFactory, store: str, tmp_path: Path
) -> None:
    extra = {}
    if store == "cached":  # a small host cache per table: the test makes seven tables
        extra = {"store": "cached", "data_dir": str(tmp_path / "lmdb"), "cache_gb": 0.001}
    _, client = cluster(num_shards=2, **extra)
    for i, order in enumerate(ORDERS):
        assert np.array_equal(committed(client, i, order, tag=True), IN_WORKER_ORDER), order
    untagged = [committed(client, 10 + i, order, tag=False) for i, order in enumerate(ORDERS)]
    assert not all(np.array_equal(v, untagged[0]) for v in untagged[1:])


def test_a_negative_worker_id_is_refused(cluster: ClusterFactory) -> None:
    _, client = cluster(num_shards=1)
    client.create_table("t", 1, SGD(lr=1.0), Zeros())
    with pytest.raises(InvalidArgument, match="worker"):
        client.push_gradients("t", KEYS, GRADS[0], 0, worker=-1)
    client.commit(0)
    values, _ = client.pull("t", KEYS)
    assert not values.any()
