"""Each optimizer against a plain, element-by-element float32 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from heraldps.errors import InvalidArgument
from heraldps.optim import SGD, AdaGrad, Adam, Optimizer, optimizer_from_proto

f32 = np.float32


def reference_step(
    opt: Optimizer, value: list[float], state: list[float], grad: list[float]
) -> None:
    """One row, one element at a time, float32 scalars in the documented order; L2 first:
    the gradient is ``grad + l2 * value`` with the value before the step."""
    dim = len(value)
    l2 = f32(opt.l2)
    grad = [f32(g) + l2 * f32(w) if opt.l2 else g for g, w in zip(grad, value, strict=True)]
    if isinstance(opt, SGD):
        for j in range(dim):
            value[j] = f32(value[j]) - f32(opt.lr) * f32(grad[j])
    elif isinstance(opt, AdaGrad):
        for j in range(dim):
            g = f32(grad[j])
            state[j] = f32(state[j]) + g * g
            value[j] = f32(value[j]) - f32(opt.lr) * g / (f32(math.sqrt(state[j])) + f32(opt.eps))
    else:
        b1, b2, one = f32(opt.beta1), f32(opt.beta2), f32(1.0)
        state[2 * dim] = f32(state[2 * dim]) + one
        t = f32(state[2 * dim])
        for j in range(dim):
            g = f32(grad[j])
            m = b1 * f32(state[j]) + (one - b1) * g
            v = b2 * f32(state[dim + j]) + (one - b2) * (g * g)
            state[j], state[dim + j] = m, v
            m_hat = m / (one - f32(b1**t))
            v_hat = v / (one - f32(b2**t))
            value[j] = f32(value[j]) - f32(opt.lr) * m_hat / (f32(math.sqrt(v_hat)) + f32(opt.eps))


OPTIMIZERS = [
    SGD(lr=0.1),
    AdaGrad(lr=0.05, initial_accumulator=0.1, eps=1e-8),
    Adam(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8),
    SGD(lr=0.1, l2=0.05),
    AdaGrad(lr=0.05, initial_accumulator=0.1, eps=1e-8, l2=0.05),
    Adam(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, l2=0.05),
]
STEPPED = [o for o in OPTIMIZERS if not (isinstance(o, SGD) and o.l2 == 0)]  # see below

finite = st.floats(-10, 10, width=32, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_vectorized_update_matches_reference(opt: Optimizer, data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 6))
    dim = data.draw(st.integers(1, 9))
    steps = data.draw(st.integers(1, 4))
    values = data.draw(hnp.arrays(np.float32, (rows, dim), elements=finite))
    state = opt.init_state(rows, dim)
    ref_values = values.astype(np.float32).tolist()
    ref_state = state.tolist()
    for _ in range(steps):
        grads = data.draw(hnp.arrays(np.float32, (rows, dim), elements=finite))
        opt.apply(values, state, grads)
        for r in range(rows):
            reference_step(opt, ref_values[r], ref_state[r], grads[r].tolist())
    np.testing.assert_allclose(values, np.array(ref_values, np.float32), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(state, np.array(ref_state, np.float32), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
def test_block_update_equals_row_by_row_bitwise(opt: Optimizer) -> None:
    """A row's update does not depend on the other rows of the block (worker == PS)."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=(50, 8)).astype(np.float32)
    state = opt.init_state(50, 8)
    grads = rng.normal(size=(50, 8)).astype(np.float32)
    whole_v, whole_s = values.copy(), state.copy()
    opt.apply(whole_v, whole_s, grads)
    for r in range(50):
        v, s = values[r : r + 1].copy(), state[r : r + 1].copy()
        opt.apply(v, s, grads[r : r + 1])
        assert np.array_equal(v, whole_v[r : r + 1])
        assert np.array_equal(s, whole_s[r : r + 1])


def test_state_widths() -> None:
    assert SGD().state_width(16) == 0
    assert AdaGrad().state_width(16) == 16
    assert Adam().state_width(16) == 33
    assert np.all(AdaGrad(initial_accumulator=0.5).init_state(2, 3) == 0.5)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
def test_proto_round_trip(opt: Optimizer) -> None:
    back = optimizer_from_proto(opt.to_proto())
    assert type(back) is type(opt)
    assert optimizer_from_proto(back.to_proto()) == back


@pytest.mark.parametrize(
    "make",
    [
        lambda: SGD(lr=0),
        lambda: SGD(lr=float("nan")),
        lambda: AdaGrad(eps=-1),
        lambda: Adam(beta1=1.0),
        lambda: AdaGrad(initial_accumulator=-0.1),
        lambda: SGD(l2=-0.1),
        lambda: Adam(l2=float("inf")),
    ],
)
def test_bad_hyperparameters_rejected(make: object) -> None:
    with pytest.raises(InvalidArgument):
        make()  # type: ignore[operator]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
def test_one_step_each_is_apply_bitwise(opt: Optimizer) -> None:
    """Pushes without steps, or with 1 everywhere, are exactly the one-step update (s = 0)."""
    rng = np.random.default_rng(1)
    values = rng.normal(size=(20, 8)).astype(np.float32)
    state = opt.init_state(20, 8)
    grads = rng.normal(size=(20, 8)).astype(np.float32)
    expected_v, expected_s = values.copy(), state.copy()
    opt.apply(expected_v, expected_s, grads)
    for steps in (None, np.ones(20, np.int32)):
        v, s = values.copy(), state.copy()
        opt.apply_steps(v, s, grads, steps)
        assert np.array_equal(v, expected_v) and np.array_equal(s, expected_s)


@pytest.mark.parametrize("opt", STEPPED, ids=lambda o: type(o).__name__)
def test_k_steps_are_k_updates_with_the_mean_gradient(opt: Optimizer) -> None:
    """Row i advances as ``steps[i]`` updates with ``grads[i] / steps[i]``, bit for bit,
    whatever the other rows' step counts."""
    rng = np.random.default_rng(2)
    steps = np.array([1, 3, 2, 3, 1, 4], np.int32)
    values = rng.normal(size=(6, 5)).astype(np.float32)
    state = opt.init_state(6, 5)
    opt.apply(values, state, rng.normal(size=(6, 5)).astype(np.float32))  # non-trivial state
    grads = rng.normal(size=(6, 5)).astype(np.float32)
    whole_v, whole_s = values.copy(), state.copy()
    opt.apply_steps(whole_v, whole_s, grads, steps)
    for r, k in enumerate(steps):
        v, s = values[r : r + 1].copy(), state[r : r + 1].copy()
        mean = grads[r : r + 1] / np.float32(k)
        for _ in range(k):
            opt.apply(v, s, mean)
        assert np.array_equal(v, whole_v[r : r + 1]), r
        assert np.array_equal(s, whole_s[r : r + 1]), r
    if isinstance(opt, Adam):  # the bias-correction step count moved by each row's steps
        assert np.array_equal(whole_s[:, -1] - state[:, -1], steps.astype(np.float32))


def test_sgd_takes_the_steps_as_one_step_of_the_sum() -> None:
    """k SGD steps of g / k equal one step of g: SGD needs no step counts."""
    values, grads = np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)
    SGD(lr=0.5).apply_steps(values, np.zeros((2, 0), np.float32), grads, np.array([1, 4], np.int32))
    assert values.tolist() == [[0.0] * 3, [0.0] * 3]


def test_adam_k_steps_keep_its_step_size_where_one_step_of_the_sum_does_not() -> None:
    """The staleness rule's reason: Adam normalizes the gradient's size, so one step of a
    k-step sum moves a row about lr, where k synchronous steps move it about k x lr."""
    opt, k = Adam(lr=0.01), 3
    grads = np.full((1, 4), 0.3, np.float32)
    sync_v, sync_s = np.zeros((1, 4), np.float32), opt.init_state(1, 4)
    for _ in range(k):
        opt.apply(sync_v, sync_s, grads)
    one_v, one_s = np.zeros((1, 4), np.float32), opt.init_state(1, 4)
    opt.apply(one_v, one_s, k * grads)
    steps_v, steps_s = np.zeros((1, 4), np.float32), opt.init_state(1, 4)
    opt.apply_steps(steps_v, steps_s, k * grads, np.array([k], np.int32))
    np.testing.assert_allclose(steps_v, sync_v, rtol=1e-5)
    np.testing.assert_allclose(steps_s, sync_s, rtol=1e-5)
    np.testing.assert_allclose(one_v, sync_v / k, rtol=1e-3)  # a third of the way


@pytest.mark.parametrize("opt", OPTIMIZERS[:3], ids=lambda o: type(o).__name__)
def test_l2_is_the_gradient_of_half_l2_times_the_squared_row(opt: Optimizer) -> None:
    """``l2`` adds ``l2 * value`` to the gradient (FuxiCTR's ``(0.05 / 2) * ||E||^2`` is
    ``l2=0.05``): a step with ``l2`` equals the plain step on ``grad + l2 * value``, bit for
    bit; ``l2=0`` is the plain optimizer."""
    rng = np.random.default_rng(4)
    values = rng.normal(size=(5, 6)).astype(np.float32)
    state = opt.init_state(5, 6)
    grads = rng.normal(size=(5, 6)).astype(np.float32)
    with_l2 = type(opt)(**{**opt.__dict__, "l2": 0.05})
    v, s = values.copy(), state.copy()
    with_l2.apply(v, s, grads)
    plain_v, plain_s = values.copy(), state.copy()
    opt.apply(plain_v, plain_s, grads + np.float32(0.05) * values)
    assert np.array_equal(v, plain_v) and np.array_equal(s, plain_s)
    off = type(opt)(**{**opt.__dict__, "l2": 0.0})
    assert off == opt


def test_sgd_with_l2_takes_each_step() -> None:
    """With L2, k SGD steps of g / k decay the row k times: not one step of g."""
    values, grads = np.ones((1, 2), np.float32), np.zeros((1, 2), np.float32)
    SGD(lr=0.5, l2=0.1).apply_steps(values, np.zeros((1, 0), np.float32), grads, np.array([2]))
    assert values.tolist() == [[np.float32(0.95) * np.float32(0.95)] * 2]
