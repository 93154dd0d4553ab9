"""PushGradientsRequest.steps on real shard servers: a gradient row that stands for k
optimizer steps is applied as k steps of its mean, at most one per iteration since the row
last changed, on the Staged-PS and the Cached-PS; malformed step counts are
INVALID_ARGUMENT and leave nothing behind."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps import wire
from heraldps.client import PSClient
from heraldps.errors import InvalidArgument
from heraldps.init import Normal
from heraldps.optim import MAX_STEPS, AdaGrad, Adam, Optimizer
from heraldps.spec import UpdateMode
from heraldps.v1 import ps_pb2, ps_pb2_grpc
from tests.conftest import ClusterFactory

DIM = 4


def pushed_and_expected(ps: PSClient, opt: Optimizer) -> tuple[np.ndarray, ...]:
    """Two pushes to one iteration with overlapping keys and step counts, and the rows
    the documented rule gives: gradients summed, the largest step count per key."""
    ps.create_table("emb", dim=DIM, optimizer=opt, initializer=Normal(std=0.1, seed=5))
    keys = np.arange(40, dtype=np.int64)
    ps.push_gradients("emb", keys, np.full((40, DIM), 0.1, np.float32), 0)
    ps.commit(0)  # every row has optimizer state to start from
    values, versions, state = ps.pull_with_state("emb", keys)
    rng = np.random.default_rng(3)
    first, second = keys[:30], keys[10:]
    g1 = rng.normal(size=(30, DIM)).astype(np.float32)
    g2 = rng.normal(size=(30, DIM)).astype(np.float32)
    s1 = rng.integers(1, 4, 30).astype(np.int32)
    s2 = rng.integers(1, 4, 30).astype(np.int32)
    ps.push_gradients("emb", first, g1, 5, steps=s1)  # 5 iterations after the last change
    ps.push_gradients("emb", second, g2, 5, steps=s2)
    assert ps.commit(5) == 40
    summed = np.zeros((40, DIM), np.float32)
    summed[first] += g1
    summed[second] += g2
    steps = np.ones(40, np.int32)
    np.maximum.at(steps, first, s1)
    np.maximum.at(steps, second, s2)
    opt.apply_steps(values, state, summed, steps)
    got_values, got_versions, got_state = ps.pull_with_state("emb", keys)
    np.testing.assert_allclose(got_values, values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_state, state, rtol=1e-5, atol=1e-6)
    assert np.array_equal(got_versions, versions + 1)  # one commit: one version, any steps
    return got_state, steps


@pytest.mark.parametrize("store", ["staged", "cached"])
def test_rows_advance_by_their_steps(store: str, cluster: ClusterFactory, tmp_path: Path) -> None:
    extra = {"store": "cached", "data_dir": str(tmp_path)} if store == "cached" else {}
    _, ps = cluster(2, **extra)
    state, steps = pushed_and_expected(ps, Adam(lr=0.01))
    assert np.array_equal(state[:, -1], 1 + steps)  # Adam's bias-correction step counts


def test_adagrad_accumulates_k_mean_squares(cluster: ClusterFactory) -> None:
    _, ps = cluster(1)
    pushed_and_expected(ps, AdaGrad(lr=0.1, initial_accumulator=0.1))


@pytest.mark.parametrize("store", ["staged", "cached"])
def test_a_row_takes_at_most_one_step_per_iteration_since_it_changed(
    store: str, cluster: ClusterFactory, tmp_path: Path
) -> None:
    """Synchronous training's pace: steps that overlap iterations whose commit already
    moved the row are not taken again (their gradient still is, in fewer steps)."""
    extra = {"store": "cached", "data_dir": str(tmp_path)} if store == "cached" else {}
    _, ps = cluster(1, **extra)
    opt = Adam(lr=0.01)
    ps.create_table("emb", dim=DIM, optimizer=opt, initializer=Normal(std=0.1, seed=5))
    keys = np.array([1, 2, 3], np.int64)
    ps.push_gradients("emb", keys[:2], np.ones((2, DIM), np.float32), 4)
    ps.commit(4)  # keys 1 and 2 changed at iteration 4; key 3 never did
    values, _, state = ps.pull_with_state("emb", keys)
    grads = np.full((3, DIM), 0.3, np.float32)
    ps.push_gradients("emb", keys, grads, 6, steps=[3, 1, 3])
    ps.commit(6)
    got_values, _, got_state = ps.pull_with_state("emb", keys)
    assert got_state[:, -1].tolist() == [1 + 2, 1 + 1, 0 + 3]  # min(3, 6 - 4), 1, min(3, 7)
    opt.apply_steps(values, state, grads, np.array([2, 1, 3], np.int32))
    np.testing.assert_allclose(got_values, values, rtol=1e-5, atol=1e-6)
    ps.push_gradients("emb", keys[:1], grads[:1], 7, steps=[3])
    ps.commit(7)
    assert ps.pull_with_state("emb", keys[:1])[2][0, -1] == 4  # one iteration: one step


def test_an_immediate_table_applies_steps_on_arrival(cluster: ClusterFactory) -> None:
    _, ps = cluster(1)
    ps.create_table("fast", dim=2, optimizer=Adam(lr=0.01), update_mode=UpdateMode.IMMEDIATE)
    keys = np.array([7, 7, 8], np.int64)
    ps.push_gradients("fast", keys, np.ones((3, 2), np.float32), 0, steps=[2, 3, 1])
    _, versions, state = ps.pull_with_state("fast", np.array([7, 8]))
    assert state[:, -1].tolist() == [3.0, 1.0] and versions.tolist() == [1, 1]


def test_bad_steps_are_invalid_and_nothing_is_buffered(cluster: ClusterFactory) -> None:
    servers, ps = cluster(1)
    ps.create_table("emb", dim=DIM, optimizer=Adam(lr=0.01), initializer=Normal(std=1, seed=1))
    keys = np.array([1, 2], np.int64)
    before = ps.pull_with_state("emb", keys)
    channel = grpc.insecure_channel(f"127.0.0.1:{servers[0].port}")
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    grads = wire.encode_floats(np.ones((2, DIM), np.float32))
    for steps, match in [
        (np.array([1], np.int32), "expected 2 little-endian int32"),
        (np.array([1, 0], np.int32), "steps[1] is 0"),
        (np.array([-3, 1], np.int32), "steps[0] is -3"),
        (np.array([1, MAX_STEPS + 1], np.int32), f"1 to {MAX_STEPS}"),
    ]:
        request = ps_pb2.PushGradientsRequest(
            table="emb", iteration=0, keys=wire.encode_keys(keys), grads=grads,
            steps=wire.encode_counts(steps),
        )  # fmt: skip
        with pytest.raises(grpc.RpcError) as err:
            stub.PushGradients(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert match in (err.value.details() or ""), err.value.details()
    channel.close()
    with pytest.raises(InvalidArgument, match="steps must be 2 integers"):
        ps.push_gradients("emb", keys, np.ones((2, DIM)), 0, steps=[1.5, 2.0])
    assert ps.commit(0) == 0  # nothing reached a buffer
    after = ps.pull_with_state("emb", keys)
    for x, y in zip(before, after, strict=True):
        assert np.array_equal(x, y)
