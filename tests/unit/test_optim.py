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
    """One row, one element at a time, float32 scalars in the documented order."""
    dim = len(value)
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
]

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
    ],
)
def test_bad_hyperparameters_rejected(make: object) -> None:
    with pytest.raises(InvalidArgument):
        make()  # type: ignore[operator]
