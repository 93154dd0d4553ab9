"""Batch normalization in DeepFM's MLP: gradients, global-batch statistics, running stats.

The reference here is an independent float64 DeepFM with batch normalization written
from the documented dense layout (Linear -> BatchNorm -> activation -> dropout, torch's
BatchNorm1d arithmetic). A global batch split over simulated workers, each a thread
with its share of the samples, sums its statistics through an in-process ``batch_sum``:
it must give the loss and gradients of one process holding the whole batch.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from heraldps.dropout import dropout_mask
from heraldps.model import DeepFM, Gradients, ModelConfig
from tests.unit.test_model import ACTIVATIONS_64, Batch, layers64, numeric, random_dense

F64 = npt.NDArray[np.float64]
BN = ModelConfig(num_fields=3, num_dense=2, embedding_dim=4, hidden=(5, 3), seed=1,
                 batch_norm=True)  # fmt: skip
EPS, MOMENTUM = 1e-5, 0.1


def unpack64(config: ModelConfig, dense: F64) -> tuple[list[tuple[F64, F64]], F64, float, list]:
    """(W, b) per layer, w_lin, bias and (gamma, beta, mean, var) per hidden layer, read
    from the documented layout by hand."""
    Nd = config.num_dense
    layers, offset = layers64(config, dense)
    w_lin, bias = dense[offset : offset + Nd], float(dense[offset + Nd])
    offset += Nd + 1
    norms = []
    for width in config.hidden:
        norms.append([dense[offset + k * width : offset + (k + 1) * width] for k in range(4)])
        offset += 4 * width
    assert offset == dense.shape[0]
    return layers, w_lin, bias, norms


def logits64(
    config: ModelConfig,
    dense: F64,
    emb: F64,
    batch: Batch,
    masks: list[F64] | None = None,
    training: bool = True,
) -> tuple[F64, list[F64]]:
    """Logits of the whole batch in float64, and each hidden layer's pre-BN values ``z``."""
    act = ACTIVATIONS_64[config.activation]
    layers, w_lin, bias, norms = unpack64(config, dense)
    present = batch.field_rows >= 0
    x = np.where(present[:, :, None], emb[np.where(present, batch.field_rows, 0)], 0.0)
    F = config.num_fields
    fm = sum((x[:, f] * x[:, g]).sum(axis=1) for f in range(F) for g in range(f + 1, F))
    dense_x = batch.dense_x.astype(np.float64)
    h = np.concatenate([x.reshape(x.shape[0], -1), dense_x], axis=1)
    zs = []
    for layer, (W, b) in enumerate(layers[:-1]):
        z = h @ W + b
        zs.append(z)
        gamma, beta, running_mean, running_var = norms[layer]
        if training:
            mean, var = z.mean(axis=0), z.var(axis=0)  # biased, as torch normalizes
        else:
            mean, var = running_mean, running_var
        h = act(gamma * (z - mean) / np.sqrt(var + EPS) + beta)
        if masks:
            h = h * masks[layer]
    deep = (h @ layers[-1][0] + layers[-1][1])[:, 0]
    return fm + deep + dense_x @ w_lin + bias, zs


def loss64(config: ModelConfig, dense: F64, emb: F64, batch: Batch, scale: float,
           masks: list[F64] | None = None) -> float:  # fmt: skip
    z, _ = logits64(config, dense, emb, batch, masks)
    y = batch.labels.astype(np.float64)
    return float(np.sum(np.logaddexp(0.0, z) - y * z) / scale)


def trained_dense(model: DeepFM, seed: int) -> npt.NDArray[np.float32]:
    """Random weights, gamma and beta away from 1 and 0, running statistics not the batch's."""
    dense = random_dense(model, seed)
    rng = np.random.default_rng(seed + 100)
    for norm in model.unpack(dense).norms:
        norm.gamma[...] = rng.uniform(0.5, 1.5, norm.gamma.shape)
        norm.running_mean[...] = rng.normal(0, 0.5, norm.gamma.shape)
        norm.running_var[...] = rng.uniform(0.5, 2.0, norm.gamma.shape)
    return dense


SAMPLE_IDS = np.arange(70, 78, dtype=np.int64)  # global indices of a Batch(8)


@pytest.mark.parametrize(
    "config",
    [BN, replace(BN, activation="tanh", dropout=0.3), replace(BN, hidden=(4,), num_dense=0)],
    ids=lambda c: f"{c.activation}-{c.hidden}-{c.dropout}",
)
def test_batch_norm_gradients_match_finite_differences(config: ModelConfig) -> None:
    model = DeepFM(config)
    batch = Batch(config, batch=8, rows=5, seed=3)
    dense = trained_dense(model, 3)
    ids = SAMPLE_IDS if config.dropout else None
    masks = None
    if config.dropout:
        masks = [dropout_mask(np, config.dropout, config.seed, layer, SAMPLE_IDS, width)
                 .astype(np.float64) for layer, width in enumerate(config.hidden)]  # fmt: skip
    out = batch.run(model, dense, 10.0, ids)
    assert isinstance(out, Gradients) and out.running is not None
    d64, e64 = dense.astype(np.float64), batch.emb.astype(np.float64)

    def loss() -> float:
        return loss64(config, d64, e64, batch, 10.0, masks)

    assert out.loss_sum / 10.0 == pytest.approx(loss(), rel=1e-5)
    expected = numeric(d64, loss)
    expected[model.running_index] = 0.0  # buffers: no gradient (the loss does not use them)
    np.testing.assert_allclose(out.dense_grad, expected, rtol=2e-3, atol=2e-6)
    assert np.all(out.dense_grad[model.running_index] == 0.0)
    # The bias before a batch norm: the normalization subtracts it, its gradient is 0 exactly.
    assert all(np.all(b == 0.0) for _, b in model.unpack(out.dense_grad).layers[:-1])
    np.testing.assert_allclose(out.emb_grad, numeric(e64, loss), rtol=2e-3, atol=2e-6)


def test_layout_appends_gamma_beta_and_running_statistics() -> None:
    plain, bn = DeepFM(replace(BN, batch_norm=False)), DeepFM(BN)
    assert bn.dense_size == plain.dense_size + 4 * (5 + 3)
    first = bn.init_dense()
    np.testing.assert_array_equal(first[: plain.dense_size], plain.init_dense())
    norms = bn.unpack(first).norms
    assert [n.gamma.shape for n in norms] == [(5,), (3,)]
    for n in norms:
        assert np.all(n.gamma == 1) and np.all(n.beta == 0)
        assert np.all(n.running_mean == 0) and np.all(n.running_var == 1)
    start = plain.dense_size
    expected = np.r_[start + 10 : start + 20, start + 20 + 6 : start + 20 + 12]
    np.testing.assert_array_equal(bn.running_index, expected)
    assert bn.max_reduction == 1 + 2 * 5 and bn.reductions_per_step == 4
    assert plain.running_index.shape == (0,) and plain.max_reduction == 0
    assert plain.reductions_per_step == 0


class InProcessSum:
    """``batch_sum`` for ``n`` worker threads: each call waits for the other workers'
    vectors and returns their sum in worker order (every worker gets the same bits)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=30)
        self.slots: list[npt.NDArray[np.float32] | None] = [None] * n
        self.calls = [0] * n

    def for_worker(self, w: int) -> Any:
        def batch_sum(values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            assert values.dtype == np.float32
            self.calls[w] += 1
            self.slots[w] = values.copy()
            self.barrier.wait()
            total = self.slots[0].copy()  # type: ignore[union-attr]
            for other in self.slots[1:]:
                total += other  # type: ignore[operator]
            self.barrier.wait()
            return total

        return batch_sum


def run_split(model: DeepFM, dense: Any, batch: Batch, parts: list[npt.NDArray[np.int64]],
              ids: npt.NDArray[np.int64]) -> list[Gradients]:  # fmt: skip
    """``batch`` trained by ``len(parts)`` worker threads, worker w holding ``parts[w]``."""
    reducer = InProcessSum(len(parts))
    results: list[Any] = [None] * len(parts)

    def work(w: int) -> None:
        rows = parts[w]
        results[w] = model.forward_backward(
            dense, batch.emb, batch.field_rows[rows], batch.dense_x[rows], batch.labels[rows],
            loss_scale=float(batch.labels.shape[0]), sample_ids=ids[rows],
            batch_sum=reducer.for_worker(w),
        )  # fmt: skip

    threads = [threading.Thread(target=work, args=(w,)) for w in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None for r in results), "a worker thread failed"
    assert reducer.calls == [model.reductions_per_step] * len(parts)
    return results


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_a_batch_split_over_workers_trains_as_one_process(workers: int) -> None:
    config = replace(BN, hidden=(6, 4), dropout=0.2)
    model = DeepFM(config)
    batch = Batch(config, batch=24, rows=7, seed=workers)
    dense = trained_dense(model, workers)
    ids = np.arange(240, 264, dtype=np.int64)
    whole = batch.run(model, dense, 24.0, ids)
    order = np.random.default_rng(workers).permutation(24)
    cuts = [0, 5, 5, 24] if workers == 3 else np.linspace(0, 24, workers + 1).astype(int)
    parts = [np.sort(order[a:b]) for a, b in itertools.pairwise(cuts)]  # 3: one gets none
    split = run_split(model, dense, batch, parts, ids)
    assert sum(s.loss_sum for s in split) == pytest.approx(whole.loss_sum, rel=1e-6)
    np.testing.assert_allclose(sum(s.emb_grad for s in split), whole.emb_grad,
                               rtol=1e-4, atol=1e-7)  # fmt: skip
    np.testing.assert_allclose(sum(s.dense_grad for s in split), whole.dense_grad,
                               rtol=1e-4, atol=1e-7)  # fmt: skip
    assert whole.running is not None
    for s in split:
        assert s.running is not None
        # Every worker derives the running statistics from the same reduced sums.
        np.testing.assert_array_equal(s.running.values, split[0].running.values)  # type: ignore[union-attr]
        np.testing.assert_allclose(s.running.values, whole.running.values, rtol=1e-5, atol=1e-7)


def test_predict_uses_the_running_statistics() -> None:
    model = DeepFM(BN)
    batch = Batch(BN, batch=9, rows=4, seed=5)
    dense = trained_dense(model, 5)
    z, _ = logits64(BN, dense.astype(np.float64), batch.emb.astype(np.float64), batch,
                    training=False)  # fmt: skip
    p = model.predict(dense, batch.emb, batch.field_rows, batch.dense_x)
    np.testing.assert_allclose(p, 1.0 / (1.0 + np.exp(-z)), rtol=1e-5, atol=1e-7)
    one = model.predict(dense, batch.emb, batch.field_rows[:1], batch.dense_x[:1])
    assert one[0] == pytest.approx(float(p[0]), rel=1e-6)  # a sample's score: not its batch's


def test_running_statistics_follow_torchs_update() -> None:
    """Over a few SGD steps: running = 0.9 running + 0.1 batch statistic, the variance's
    unbiased (N / (N - 1)); the optimizer never moves them (they are written over it)."""
    model = DeepFM(BN)
    dense = model.init_dense()
    mean = [np.zeros(w) for w in BN.hidden]
    var = [np.ones(w) for w in BN.hidden]
    for step in range(4):
        batch = Batch(BN, batch=16, rows=6, seed=20 + step)
        _, zs = logits64(BN, dense.astype(np.float64), batch.emb.astype(np.float64), batch)
        out = batch.run(model, dense, 16.0)
        for layer, z in enumerate(zs):
            mean[layer] = 0.9 * mean[layer] + 0.1 * z.mean(axis=0)
            var[layer] = 0.9 * var[layer] + 0.1 * z.var(axis=0, ddof=1)
        dense = dense - np.float32(0.5) * out.dense_grad
        assert out.running is not None
        out.running.write_into(dense)
        norms = model.unpack(dense).norms
        for layer, n in enumerate(norms):
            np.testing.assert_allclose(n.running_mean, mean[layer], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(n.running_var, var[layer], rtol=1e-5, atol=1e-6)
    assert not np.allclose(model.unpack(dense).norms[0].gamma, 1.0)  # gamma trains


def test_write_into_the_dense_tables_rows() -> None:
    """The replicas keep the dense vector as the PS table's rows (padded at the end)."""
    model = DeepFM(BN)
    dense = model.init_dense()
    out = Batch(BN, batch=8, rows=5, seed=1).run(model, dense, 8.0)
    assert out.running is not None
    width = 16
    rows = np.zeros((-(-model.dense_size // width), width), np.float32)
    rows.reshape(-1)[: model.dense_size] = dense
    out.running.write_into(rows)
    flat = dense.copy()
    out.running.write_into(flat)
    np.testing.assert_array_equal(rows.reshape(-1)[: model.dense_size], flat)
    assert not np.array_equal(flat, dense)


def test_the_device_path_gives_numpys_bits() -> None:
    from tests import fakecupy

    config = replace(BN, dropout=0.2)
    batch = Batch(config, batch=8, rows=5, seed=9)
    dense = trained_dense(DeepFM(config), 9)
    expected = batch.run(DeepFM(config), dense, 8.0, SAMPLE_IDS)
    sent: list[np.ndarray] = []

    def host_sum(values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        assert isinstance(values, np.ndarray)  # the reducer gets host data
        sent.append(values)
        return values

    got = DeepFM(config, fakecupy).forward_backward(
        *(fakecupy.asarray(a) for a in (dense, batch.emb, batch.field_rows, batch.dense_x,
                                         batch.labels)),
        loss_scale=8.0, sample_ids=fakecupy.asarray(SAMPLE_IDS), batch_sum=host_sum,
    )  # fmt: skip
    assert len(sent) == 4
    assert got.loss_sum == expected.loss_sum
    assert np.array_equal(fakecupy.asnumpy(got.emb_grad), expected.emb_grad)
    assert np.array_equal(fakecupy.asnumpy(got.dense_grad), expected.dense_grad)
    assert got.running is not None and expected.running is not None
    assert np.array_equal(got.running.values, expected.running.values)
    p = DeepFM(config, fakecupy).predict(
        *(fakecupy.asarray(a) for a in (dense, batch.emb, batch.field_rows, batch.dense_x))
    )
    assert np.array_equal(
        fakecupy.asnumpy(p),
        DeepFM(config).predict(dense, batch.emb, batch.field_rows, batch.dense_x),
    )


def test_an_exported_batch_norm_model_scores_with_its_running_statistics(
    tmp_path: Path,
) -> None:
    """The export carries the running statistics in its dense vector and ``Predictor``
    scores with them: the reference's held-out scores, bit for bit."""
    from heraldps.bundled import bundled_data
    from heraldps.data import stream
    from heraldps.job import EMBEDDING_TABLE, TrainingJob
    from heraldps.model_export import ExportedModel, touched, write_model
    from worker_client.minibatch import select
    from worker_client.predictor import EVAL_CHUNK_ROWS, Predictor, rows_of
    from worker_client.reference import ReferenceTrainer

    train, test = (str(p) for p in bundled_data())
    job = TrainingJob(data=train, workers=2, batch_size_per_worker=64, iterations=4,
                      optimizer="adam", embedding_dim=4, hidden=(8,), batch_norm=True)  # fmt: skip
    reference = ReferenceTrainer(job)
    data = job.read()
    reference.train(data)
    keys = np.unique(data.keys)
    values, _, versions = reference.rows_of(keys)
    dense = reference.dense_param.from_rows(reference.dense_rows)
    table = touched(EMBEDDING_TABLE, keys, values, versions, job.make_initializer())
    out = write_model(tmp_path / "m", ExportedModel(job.to_json(), {EMBEDDING_TABLE: table},
                                                    dense, {}))  # fmt: skip
    predictor = Predictor.load(out)
    assert predictor.model.config.batch_norm
    scores, _ = predictor.score_file(test)
    (chunk,) = list(stream(job.data_spec(test), EVAL_CHUNK_ROWS))
    mb = select(chunk)
    # The rows the predictor reads (an unseen key's initial row can differ from the one the
    # reference generated for it in another batch by an ulp; not a batch-norm matter).
    rows = rows_of(predictor.table, mb.keys, "initializer")
    expected = reference.model.predict(dense, rows, mb.field_rows, mb.dense)
    assert np.array_equal(scores, expected)
    fresh = dense.copy()
    fresh[reference.model.running_index] = reference.model.init_dense()[
        reference.model.running_index
    ]
    assert not np.allclose(
        reference.model.predict(fresh, rows, mb.field_rows, mb.dense), expected
    )  # the running statistics matter, and they are the trained ones
