"""DeepFM's forward/backward against an independent float64 reference, and the metrics."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heraldps.dropout import dropout_mask, uniforms
from heraldps.errors import InvalidArgument
from heraldps.model import DeepFM, Gradients, ModelConfig, scatter_add
from worker_client.evaluation import auc, logloss

F64 = npt.NDArray[np.float64]
TINY = ModelConfig(num_fields=3, num_dense=2, embedding_dim=4, hidden=(5,), seed=1)


# The hidden activations in float64, written independently of heraldps.activations.
ACTIVATIONS_64 = {
    "relu": lambda z: np.maximum(z, 0.0),
    "leaky_relu": lambda z: np.where(z > 0, z, 0.01 * z),
    "tanh": np.tanh,
    "sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z)),
}


def layers64(config: ModelConfig, dense: F64) -> tuple[list[tuple[F64, F64]], int]:
    """``(W, b)`` of every MLP layer read from the documented layout by hand, and the
    offset after them."""
    F, D, Nd = config.num_fields, config.embedding_dim, config.num_dense
    widths = [F * D + Nd, *config.hidden, 1]
    offset, layers = 0, []
    for fan_in, fan_out in itertools.pairwise(widths):
        W = dense[offset : offset + fan_in * fan_out].reshape(fan_in, fan_out)
        offset += fan_in * fan_out
        layers.append((W, dense[offset : offset + fan_out]))
        offset += fan_out
    return layers, offset


def reference_logits(
    config: ModelConfig,
    dense: F64,
    emb: F64,
    field_rows: npt.NDArray[np.int64],
    dense_x: F64,
    masks: list[F64] | None = None,
) -> F64:
    """DeepFM in float64, one sample at a time, unpacking the documented layout by hand.

    The FM term is the explicit pairwise sum over fields, not the square-of-sum
    identity the model uses, so the two are independent. ``masks[l][b]`` multiplies
    sample b's hidden layer l output (dropout).
    """
    act = ACTIVATIONS_64[config.activation]
    F, D, Nd = config.num_fields, config.embedding_dim, config.num_dense
    layers, offset = layers64(config, dense)
    w_lin, bias = dense[offset : offset + Nd], dense[offset + Nd]
    assert offset + Nd + 1 == dense.shape[0]
    out = np.empty(field_rows.shape[0])
    for b in range(field_rows.shape[0]):
        vecs = [emb[r] if r >= 0 else np.zeros(D) for r in field_rows[b]]
        fm = sum(vecs[f] @ vecs[g] for f in range(F) for g in range(f + 1, F))
        h = np.concatenate([*vecs, dense_x[b]])
        for layer, (W, bb) in enumerate(layers[:-1]):
            h = act(h @ W + bb) * (masks[layer][b] if masks else 1.0)
        deep = (h @ layers[-1][0] + layers[-1][1])[0]
        out[b] = fm + deep + w_lin @ dense_x[b] + bias
    return out


def reference_loss(
    config: ModelConfig,
    dense: F64,
    emb: F64,
    batch: Batch,
    scale: float,
    masks: list[F64] | None = None,
) -> float:
    z = reference_logits(
        config, dense, emb, batch.field_rows, batch.dense_x.astype(np.float64), masks
    )
    y = batch.labels.astype(np.float64)
    return float(np.sum(np.logaddexp(0.0, z) - y * z) / scale)


class Batch:
    """A random mini-batch with missing fields and repeated rows."""

    def __init__(
        self, config: ModelConfig, batch: int, rows: int, seed: int, missing: float = 0.2
    ) -> None:
        rng = np.random.default_rng(seed)
        F, Nd = config.num_fields, config.num_dense
        self.emb = rng.normal(0, 0.5, (rows, config.embedding_dim)).astype(np.float32)
        field_rows = rng.integers(0, rows, (batch, F))
        self.field_rows = np.where(rng.random((batch, F)) < missing, -1, field_rows)
        self.dense_x = rng.normal(0, 1, (batch, Nd)).astype(np.float32)
        self.labels = rng.integers(0, 2, batch).astype(np.float32)

    def run(self, model: DeepFM, dense: Any, scale: float, sample_ids: Any = None) -> Gradients:
        return model.forward_backward(
            dense, self.emb, self.field_rows, self.dense_x, self.labels, loss_scale=scale,
            sample_ids=sample_ids,
        )  # fmt: skip


def numeric(param: F64, loss_of: Any, eps: float = 1e-6) -> F64:
    """Central finite differences of ``loss_of()`` in every entry of ``param`` (in place)."""
    grad = np.zeros_like(param)
    for i in np.ndindex(param.shape):
        saved = param[i]
        param[i] = saved + eps
        up = loss_of()
        param[i] = saved - eps
        down = loss_of()
        param[i] = saved
        grad[i] = (up - down) / (2 * eps)
    return grad


def random_dense(model: DeepFM, seed: int) -> npt.NDArray[np.float32]:
    """Initial weights plus noise, so biases and the linear term are not zero."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 0.3, model.dense_size).astype(np.float32)
    return model.init_dense() + noise


# Two hidden layers, each activation, with and without dropout.
DEEP = [
    replace(TINY, hidden=(5, 3), activation=name, dropout=rate)
    for name in ACTIVATIONS_64
    for rate in (0.0, 0.4)
]
SAMPLE_IDS = np.array([7, 130, 3, 64, 65, 1000], np.int64)  # global indices of Batch(6)


@pytest.mark.parametrize(
    ("seed", "config"),
    [(0, TINY), (1, TINY), (2, TINY)] + [(3, c) for c in DEEP],
    ids=lambda v: f"{v.activation}-{v.hidden}-{v.dropout}" if isinstance(v, ModelConfig) else "",
)
def test_gradients_match_finite_differences_of_a_float64_reference(
    seed: int, config: ModelConfig
) -> None:
    model = DeepFM(config)
    batch = Batch(config, batch=6, rows=5, seed=seed)
    batch.field_rows[0, :] = [2, 2, -1]  # a repeated row inside one sample
    dense = random_dense(model, seed)
    scale = 10.0
    ids = SAMPLE_IDS if config.dropout else None
    masks = None
    if config.dropout:
        masks = [
            dropout_mask(np, config.dropout, config.seed, layer, SAMPLE_IDS, width)
            .astype(np.float64)
            for layer, width in enumerate(config.hidden)
        ]  # fmt: skip
        assert 0 < sum(int((m == 0).sum()) for m in masks) < sum(m.size for m in masks)
    loss_sum, emb_grad, dense_grad, _ = batch.run(model, dense, scale, ids)
    assert emb_grad.dtype == np.float32 and emb_grad.shape == batch.emb.shape
    assert dense_grad.dtype == np.float32 and dense_grad.shape == (model.dense_size,)

    d64, e64 = dense.astype(np.float64), batch.emb.astype(np.float64)
    expected = reference_loss(config, d64, e64, batch, scale, masks)
    assert loss_sum / scale == pytest.approx(expected, 1e-5)

    def loss() -> float:
        return reference_loss(config, d64, e64, batch, scale, masks)

    np.testing.assert_allclose(dense_grad, numeric(d64, loss), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(emb_grad, numeric(e64, loss), rtol=1e-3, atol=1e-6)


def test_predict_matches_the_reference() -> None:
    model = DeepFM(TINY)
    batch = Batch(TINY, batch=9, rows=4, seed=5)
    dense = random_dense(model, 5)
    z = reference_logits(
        TINY, dense.astype(np.float64), batch.emb.astype(np.float64), batch.field_rows,
        batch.dense_x.astype(np.float64),
    )  # fmt: skip
    p = model.predict(dense, batch.emb, batch.field_rows, batch.dense_x)
    assert p.dtype == np.float32 and p.shape == (9,)
    np.testing.assert_allclose(p, 1.0 / (1.0 + np.exp(-z)), rtol=1e-5, atol=1e-7)


def test_missing_fields_behave_as_zero_embeddings_and_get_no_gradient() -> None:
    model = DeepFM(TINY)
    batch = Batch(TINY, batch=8, rows=4, seed=3, missing=0.4)
    batch.field_rows[batch.field_rows == 0] = 1  # row 0 is used by no field at all
    batch.field_rows[0, 1] = -1
    dense = random_dense(model, 3)
    loss, emb_grad, dense_grad, _ = batch.run(model, dense, 8.0)
    assert np.all(emb_grad[0] == 0.0)

    # The same batch with each -1 pointing at an explicit zero row appended at the end;
    # the last real row is non-zero, so a -1 wrapping around to it would show.
    zero = Batch(TINY, batch=8, rows=4, seed=3, missing=0.4)
    zero.emb = np.vstack([batch.emb, np.zeros((1, 4), np.float32)])
    zero.field_rows = np.where(batch.field_rows < 0, 4, batch.field_rows)
    assert np.any(batch.emb[-1] != 0.0)
    loss_z, emb_grad_z, dense_grad_z, _ = zero.run(model, dense, 8.0)
    assert loss == pytest.approx(loss_z, rel=1e-6)
    np.testing.assert_allclose(emb_grad, emb_grad_z[:4], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dense_grad, dense_grad_z, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        model.predict(dense, batch.emb, batch.field_rows, batch.dense_x),
        model.predict(dense, zero.emb, zero.field_rows, zero.dense_x),
        rtol=1e-6,
    )


def test_every_field_missing_and_no_rows() -> None:
    model = DeepFM(TINY)
    field_rows = np.full((3, 3), -1, dtype=np.int64)
    emb = np.zeros((0, 4), np.float32)
    dense_x = np.ones((3, 2), np.float32)
    loss, emb_grad, dense_grad, _ = model.forward_backward(
        model.init_dense(), emb, field_rows, dense_x, np.ones(3, np.float32), loss_scale=3.0
    )
    assert emb_grad.shape == (0, 4) and np.isfinite(loss) and np.all(np.isfinite(dense_grad))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), split=st.integers(1, 15))
def test_gradients_of_split_batches_add_up_to_the_full_batch(seed: int, split: int) -> None:
    model = DeepFM(TINY)
    batch = Batch(TINY, batch=16, rows=6, seed=seed)
    dense = random_dense(model, seed)
    loss, emb_grad, dense_grad, _ = batch.run(model, dense, 16.0)
    parts = []
    for part in (slice(0, split), slice(split, 16)):
        half = Batch(TINY, batch=16, rows=6, seed=seed)
        half.field_rows, half.dense_x = batch.field_rows[part], batch.dense_x[part]
        half.labels = batch.labels[part]
        parts.append(half.run(model, dense, 16.0))
    assert parts[0][0] + parts[1][0] == pytest.approx(loss, rel=1e-6)
    np.testing.assert_allclose(parts[0][1] + parts[1][1], emb_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(parts[0][2] + parts[1][2], dense_grad, rtol=1e-5, atol=1e-7)


def test_fields_sharing_a_row_accumulate() -> None:
    model = DeepFM(TINY)
    batch = Batch(TINY, batch=5, rows=3, seed=7, missing=0.0)
    batch.field_rows[:, 0] = 1
    batch.field_rows[:, 2] = 1  # every sample uses row 1 in two fields, and all samples share it
    dense = random_dense(model, 7)
    loss, emb_grad, _, _ = batch.run(model, dense, 5.0)

    # Field 2 reading an identical copy of row 1 instead: the same function, split gradients.
    copy = Batch(TINY, batch=5, rows=3, seed=7, missing=0.0)
    copy.emb = np.vstack([batch.emb, batch.emb[1:2]])
    copy.field_rows = batch.field_rows.copy()
    copy.field_rows[:, 2] = 3
    loss_c, emb_grad_c, _, _ = copy.run(model, dense, 5.0)
    assert loss == pytest.approx(loss_c, rel=1e-6)
    assert np.any(emb_grad_c[3] != 0.0)
    np.testing.assert_allclose(emb_grad[1], emb_grad_c[1] + emb_grad_c[3], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(emb_grad[[0, 2]], emb_grad_c[[0, 2]], rtol=1e-5, atol=1e-7)


def test_scatter_add_accumulates_repeated_indices() -> None:
    out = np.zeros((3, 2), np.float32)
    scatter_add(np, out, np.array([1, 1, 0, 1]), np.ones((4, 2), np.float32))
    np.testing.assert_array_equal(out, [[1, 1], [3, 3], [0, 0]])


def test_scatter_add_sums_rows_as_add_at_does_bit_for_bit() -> None:
    """NumPy float32 rows take a compiled loop: the same additions in the same order as
    ``np.add.at``, so the embedding gradient (and every exactness test) is unchanged."""
    rng = np.random.default_rng(5)
    index = (rng.zipf(1.5, size=5000) % 300).astype(np.int64)
    values = rng.standard_normal((5000, 10)).astype(np.float32) * np.float32(1e3)
    start = rng.standard_normal((300, 10)).astype(np.float32)
    got, expected = start.copy(), start.copy()
    scatter_add(np, got, index, values)
    np.add.at(expected, index, values)
    np.testing.assert_array_equal(got.view(np.int32), expected.view(np.int32))
    with pytest.raises(IndexError):
        scatter_add(np, got, np.array([0, 300]), np.ones((2, 10), np.float32))


def test_layout_size_and_deterministic_init() -> None:
    config = ModelConfig(num_fields=26, num_dense=13, embedding_dim=8, hidden=(64, 32), seed=4)
    model = DeepFM(config)
    in0 = 26 * 8 + 13
    assert model.dense_size == in0 * 64 + 64 + 64 * 32 + 32 + 32 * 1 + 1 + 13 + 1
    first = model.init_dense()
    assert first.dtype == np.float32 and first.shape == (model.dense_size,)
    np.testing.assert_array_equal(first, DeepFM(config).init_dense())
    assert not np.array_equal(first, DeepFM(ModelConfig(26, 13, seed=5)).init_dense())
    params = model.unpack(first)
    assert [W.shape for W, _ in params.layers] == [(in0, 64), (64, 32), (32, 1)]
    assert all(np.all(b == 0) for _, b in params.layers)
    assert np.all(params.w_lin == 0) and params.bias.shape == (1,)
    assert np.all(np.abs(params.layers[0][0]) <= np.sqrt(6.0 / in0))


def test_no_dense_features_and_no_hidden_layer() -> None:
    config = ModelConfig(num_fields=2, num_dense=0, embedding_dim=3, hidden=())
    model = DeepFM(config)
    assert model.dense_size == 2 * 3 + 1 + 0 + 1
    batch = Batch(config, batch=4, rows=3, seed=2)
    dense = random_dense(model, 2)
    loss, emb_grad, dense_grad, _ = batch.run(model, dense, 4.0)
    ref = reference_loss(config, dense.astype(np.float64), batch.emb.astype(np.float64), batch, 4.0)
    assert loss / 4.0 == pytest.approx(ref, rel=1e-5)
    assert dense_grad.shape == (model.dense_size,) and emb_grad.dtype == np.float32


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_fields": 0, "num_dense": 1},
        {"num_fields": 2, "num_dense": -1},
        {"num_fields": 2, "num_dense": 1, "embedding_dim": 0},
        {"num_fields": 2, "num_dense": 1, "hidden": (8, 0)},
        {"num_fields": 2, "num_dense": 1, "activation": "gelu"},
        {"num_fields": 2, "num_dense": 1, "dropout": 1.0},
        {"num_fields": 2, "num_dense": 1, "dropout": -0.1},
    ],
)
def test_config_rejects_bad_sizes(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        ModelConfig(**kwargs)


def test_bad_shapes_are_rejected() -> None:
    model = DeepFM(TINY)
    batch = Batch(TINY, batch=4, rows=3, seed=0)
    dense = model.init_dense()
    with pytest.raises(InvalidArgument, match="dense_params"):
        batch.run(model, dense[:-1], 4.0)
    with pytest.raises(InvalidArgument, match="loss_scale"):
        batch.run(model, dense, 0.0)
    with pytest.raises(InvalidArgument, match="field_rows"):
        model.predict(dense, batch.emb, batch.field_rows[:, :2], batch.dense_x)


@pytest.mark.parametrize("config", DEEP, ids=lambda c: f"{c.activation}-{c.dropout}")
def test_the_device_path_gives_numpys_bits(config: ModelConfig) -> None:
    """Every activation and dropout through the CuPy-like test double: NumPy's bits, and
    nothing converted to the host implicitly."""
    from tests import fakecupy

    batch = Batch(config, batch=6, rows=5, seed=9)
    dense = random_dense(DeepFM(config), 9)
    expected = batch.run(DeepFM(config), dense, 6.0, SAMPLE_IDS)
    got = DeepFM(config, fakecupy).forward_backward(
        *(fakecupy.asarray(a) for a in (dense, batch.emb, batch.field_rows, batch.dense_x,
                                         batch.labels)),
        loss_scale=6.0, sample_ids=fakecupy.asarray(SAMPLE_IDS),
    )  # fmt: skip
    assert got[0] == expected[0]
    for g, e in zip(got[1:3], expected[1:3], strict=True):
        assert np.array_equal(fakecupy.asnumpy(g), e)


def test_a_samples_dropout_mask_does_not_depend_on_its_batch() -> None:
    """Herald and HET hand a global batch's samples to workers in different groups; a
    sample's mask, and so the sum of the workers' gradients, must not change with that."""
    ids = np.arange(1000, 1024, dtype=np.int64)
    whole = dropout_mask(np, 0.5, 7, 1, ids, 33)
    order = np.random.default_rng(0).permutation(24)
    np.testing.assert_array_equal(dropout_mask(np, 0.5, 7, 1, ids[order], 33), whole[order])
    assert 0.4 < (whole == 0).mean() < 0.6 and set(np.unique(whole)) == {0.0, 2.0}
    for other in (dropout_mask(np, 0.5, 8, 1, ids, 33), dropout_mask(np, 0.5, 7, 0, ids, 33),
                  dropout_mask(np, 0.5, 7, 1, ids + 24, 33)):  # fmt: skip
        assert not np.array_equal(other, whole)  # seed, layer, sample all matter

    config = replace(TINY, hidden=(6, 4), dropout=0.3)
    model = DeepFM(config)
    batch = Batch(config, batch=12, rows=6, seed=4)
    dense = random_dense(model, 4)
    ids = np.arange(240, 252, dtype=np.int64)  # iteration 20 of a global batch of 12
    _, _, whole_grad, _ = batch.run(model, dense, 12.0, ids)
    for part in (np.arange(12) % 2 == 0, np.arange(12) < 3):  # two splits over two workers
        grads = []
        for rows in (part, ~part):
            _, _, g, _ = model.forward_backward(
                dense, batch.emb, batch.field_rows[rows], batch.dense_x[rows],
                batch.labels[rows], loss_scale=12.0, sample_ids=ids[rows],
            )  # fmt: skip
            grads.append(g)
        np.testing.assert_allclose(grads[0] + grads[1], whole_grad, rtol=1e-5, atol=1e-7)
    _, _, undropped, _ = DeepFM(replace(config, dropout=0.0)).forward_backward(
        dense, batch.emb, batch.field_rows, batch.dense_x, batch.labels, loss_scale=12.0
    )
    assert not np.allclose(undropped, whole_grad)  # dropout was on


def test_dropout_needs_the_sample_ids() -> None:
    model = DeepFM(replace(TINY, dropout=0.1))
    batch = Batch(TINY, batch=4, rows=3, seed=0)
    with pytest.raises(InvalidArgument, match="sample_ids"):
        batch.run(model, model.init_dense(), 4.0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [TINY, *DEEP, replace(TINY, hidden=(5, 3), dropout=0.2, batch_norm=True)],
    ids=lambda c: f"{c.activation}-{c.dropout}-{'bn' if c.batch_norm else ''}",
)
def test_cupy_matches_numpy(config: ModelConfig) -> None:
    cupy = pytest.importorskip("cupy")
    from worker_client.device import gpu_available

    if not gpu_available():
        pytest.skip("no CUDA GPU")
    batch = Batch(config, batch=32, rows=7, seed=11)
    dense = random_dense(DeepFM(config), 11)
    ids = np.arange(320, 352, dtype=np.int64)
    expected = batch.run(DeepFM(config), dense, 32.0, ids)
    got = DeepFM(config, cupy).forward_backward(
        cupy.asarray(dense), cupy.asarray(batch.emb), cupy.asarray(batch.field_rows),
        cupy.asarray(batch.dense_x), cupy.asarray(batch.labels), loss_scale=32.0,
        sample_ids=cupy.asarray(ids), batch_sum=lambda v: v,  # batch norm: a host round trip
    )  # fmt: skip
    assert got[0] == pytest.approx(expected[0], rel=1e-5)
    for g, e in zip(got[1:3], expected[1:3], strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(cupy.asnumpy(g), e, rtol=1e-4, atol=1e-6)
    if config.batch_norm:  # the running statistics, and prediction with them
        np.testing.assert_allclose(got.running.values, expected.running.values, rtol=1e-5)
        p = DeepFM(config, cupy).predict(
            *(cupy.asarray(a) for a in (dense, batch.emb, batch.field_rows, batch.dense_x))
        )
        e = DeepFM(config).predict(dense, batch.emb, batch.field_rows, batch.dense_x)
        np.testing.assert_allclose(cupy.asnumpy(p), e, rtol=1e-5, atol=1e-7)


def test_training_learns_a_separable_problem() -> None:
    rng = np.random.default_rng(0)
    F, V = 4, 10  # fields, values per field; row of (field f, value v) is f * V + v

    def sample(n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], Any]:
        rows = rng.integers(0, V, (n, F)) + np.arange(F) * V
        dense_x = rng.normal(0, 1, (n, 2)).astype(np.float32)
        score = truth[rows].sum(axis=1) + dense_x @ np.array([1.0, -1.0])
        return rows, dense_x, (score > 0).astype(np.float32)

    truth = rng.normal(0, 1, F * V)
    config = ModelConfig(num_fields=F, num_dense=2, embedding_dim=4, hidden=(16,), seed=0)
    model = DeepFM(config)
    emb = rng.normal(0, 0.05, (F * V, 4)).astype(np.float32)
    dense = model.init_dense()
    test_rows, test_dense, test_labels = sample(2000)
    before = auc(test_labels, model.predict(dense, emb, test_rows, test_dense))
    lr = np.float32(0.1)
    for _ in range(300):
        rows, dense_x, labels = sample(64)
        _, emb_grad, dense_grad, _ = model.forward_backward(
            dense, emb, rows, dense_x, labels, loss_scale=64.0
        )
        emb -= lr * emb_grad
        dense -= lr * dense_grad
    probabilities = model.predict(dense, emb, test_rows, test_dense)
    assert auc(test_labels, probabilities) > max(0.9, before)
    assert logloss(test_labels, probabilities) < 0.45


# ----- metrics ------------------------------------------------------------------


def brute_force_auc(labels: npt.NDArray[np.float64], scores: npt.NDArray[np.float64]) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return float(wins / (len(pos) * len(neg)))


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 60), levels=st.integers(1, 8))
def test_auc_matches_pairwise_count_with_ties(seed: int, n: int, levels: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n).astype(np.float64)
    labels[:2] = [0, 1]
    scores = rng.integers(0, levels, n) / levels  # few levels: many ties
    assert auc(labels, scores) == pytest.approx(brute_force_auc(labels, scores), abs=1e-12)


def test_auc_edge_cases() -> None:
    assert auc([0, 1], [0.1, 0.9]) == 1.0
    assert auc([0, 1], [0.9, 0.1]) == 0.0
    assert auc([0, 1, 0, 1], [0.5] * 4) == 0.5
    with pytest.raises(InvalidArgument, match="both classes"):
        auc([1, 1, 1], [0.1, 0.2, 0.3])
    with pytest.raises(InvalidArgument, match="same length"):
        auc([0, 1], [0.1])
    with pytest.raises(InvalidArgument, match="NaN"):
        auc([0, 1], [0.1, float("nan")])


def test_logloss_matches_the_formula_with_clipping() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 100).astype(np.float64)
    p = rng.random(100)
    p[:4] = [0.0, 1.0, 0.0, 1.0]
    labels[:4] = [1, 0, 0, 1]
    q = np.clip(p, 1e-7, 1 - 1e-7)
    expected = -np.mean(
        [y * np.log(v) + (1 - y) * np.log(1 - v) for y, v in zip(labels, q, strict=True)]
    )
    assert logloss(labels, p) == pytest.approx(expected, rel=1e-6)
    assert logloss([1, 0], [0.5, 0.5]) == pytest.approx(np.log(2))


def test_the_compiled_dropout_mask_is_the_array_form_bit_for_bit() -> None:
    """NumPy draws masks with a compiled kernel, CuPy with the array form (``uniforms``):
    both must drop the same units with the same scale, whatever the ids, rate and width."""
    ids = np.array([0, 1, 5, 2**40 + 3, 2**62 + 11, 123456789], dtype=np.int64)
    for rate, seed, layer, width in ((0.2, 0, 0, 400), (0.5, 7, 2, 33), (0.9, 2**40, 1, 1)):
        keep = uniforms(np, seed, layer, ids, width) >= np.float32(rate)
        expected = keep.astype(np.float32) * np.float32(1.0 / (1.0 - rate))
        got = dropout_mask(np, rate, seed, layer, ids, width)
        assert got.dtype == np.float32 and got.shape == (ids.size, width)
        np.testing.assert_array_equal(got.view(np.int32), expected.view(np.int32))
    assert dropout_mask(np, 0.5, 0, 0, ids[:0], 4).shape == (0, 4)
