"""benchmarks/torch_deepfm.py: the PyTorch baseline is heraldps's DeepFM and optimizer.

Same logits as heraldps/model.py for the same parameters, the same row update as
heraldps.optim.Adam (L2 on the rows a batch uses, once per unique row), and a short run
on a tiny learnable CSV that learns and stops early."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from heraldps.model import DeepFM, ModelConfig
from heraldps.optim import Adam
from tests.benchmarks import load_benchmark

if os.environ.get("HERALDPS_REQUIRE_TOOLS") == "1":
    import torch  # CI installs the torch extra: a missing torch fails here
else:
    torch = pytest.importorskip("torch", reason="pip install -e '.[torch]' (CPU PyTorch)")


tdf = load_benchmark("torch_deepfm")


def test_logits_equal_heraldps_model_for_the_same_parameters() -> None:
    fields, dense, dim, hidden = 3, 2, 4, (8, 5)
    config = ModelConfig(fields, dense, dim, hidden, seed=3)
    ours = DeepFM(config)
    params = ours.init_dense()
    params += np.random.default_rng(0).normal(0, 0.1, params.shape).astype(np.float32)
    rng = np.random.default_rng(1)
    emb = rng.normal(0, 0.1, (7, dim)).astype(np.float32)
    rows = rng.integers(0, 7, (6, fields))
    dense_x = rng.normal(size=(6, dense)).astype(np.float32)
    cfg = tdf.TorchConfig(embedding_dim=dim, hidden=hidden, dropout=0.0, batch_norm=False)
    model = tdf.TorchDeepFM(7, fields, dense, cfg).eval()
    p = ours.unpack(params)
    linears = [m for m in model.mlp if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        model.embedding.copy_(torch.from_numpy(emb))
        for lin, (W, b) in zip(linears, p.layers, strict=True):
            lin.weight.copy_(torch.from_numpy(W.T.copy()))
            lin.bias.copy_(torch.from_numpy(b.copy()))
        model.linear.copy_(torch.from_numpy(p.w_lin.copy()))
        model.bias.copy_(torch.from_numpy(p.bias.copy()))
        got = torch.sigmoid(model(torch.from_numpy(rows), torch.from_numpy(dense_x))).numpy()
    want = ours.predict(params, emb, rows, dense_x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_init_is_he_uniform_for_relu_and_glorot_for_the_output() -> None:
    cfg = tdf.TorchConfig(embedding_dim=10, hidden=(400, 400), batch_norm=True)
    model = tdf.TorchDeepFM(1000, 10, 0, cfg)
    linears = [m.weight.detach() for m in model.mlp if isinstance(m, torch.nn.Linear)]
    assert float(linears[0].abs().max()) <= np.sqrt(6 / 100)
    assert float(linears[0].abs().max()) > 0.9 * np.sqrt(6 / 100)
    assert float(linears[-1].abs().max()) <= np.sqrt(6 / 401)
    assert abs(float(model.embedding.detach().std()) - 0.01) < 0.001
    kinds = [type(m).__name__ for m in model.mlp]
    assert kinds[:4] == ["Linear", "BatchNorm1d", "ReLU", "Dropout"]


def test_row_adam_updates_only_used_rows_as_heraldps_adam_does() -> None:
    rng = np.random.default_rng(2)
    table = rng.normal(0, 0.1, (6, 3)).astype(np.float32)
    cfg = tdf.TorchConfig(lr=0.01, embedding_l2=0.05, eps=1e-6)
    theirs = tdf.RowAdam(torch.from_numpy(table.copy()), cfg)
    ours = Adam(lr=0.01, eps=1e-6, l2=0.05)
    values, state = table.copy(), ours.init_state(6, 3)
    for step in range(3):
        rows = np.array([0, 2, 5] if step != 1 else [2, 3])
        grads = rng.normal(size=(rows.size, 3)).astype(np.float32)
        theirs.apply(torch.from_numpy(rows), torch.from_numpy(grads))
        sub_values, sub_state = values[rows], state[rows]
        ours.apply(sub_values, sub_state, grads)
        values[rows], state[rows] = sub_values, sub_state
    np.testing.assert_allclose(theirs.table.numpy(), values, rtol=1e-5, atol=1e-6)  # f32
    np.testing.assert_array_equal(theirs.table.numpy()[[1, 4]], table[[1, 4]])  # never used


def test_a_batch_row_used_twice_gets_its_l2_once() -> None:
    cfg = tdf.TorchConfig(embedding_dim=2, hidden=(), dropout=0.0, batch_norm=False,
                          embedding_l2=1.0, lr=0.1)  # fmt: skip
    model = tdf.TorchDeepFM(4, 2, 0, cfg)
    with torch.no_grad():
        model.embedding.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [0.0, 0.0]]))
    seen: dict[str, torch.Tensor] = {}

    class Recorder(tdf.RowAdam):  # type: ignore[misc, name-defined]
        def apply(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
            seen["rows"], seen["grads"] = rows.clone(), grads.clone()

    rows = torch.tensor([[2, 2], [2, 2]])  # row 2 used four times in the batch
    batch = tdf.Split(rows, torch.zeros(2, 0), torch.tensor([1.0, 0.0]))
    opt = torch.optim.Adam([p for n, p in model.named_parameters() if n != "embedding"])
    tdf.train_step(model, Recorder(model.embedding.data, cfg), opt, batch)
    assert seen["rows"].tolist() == [2]
    # The recorder gets the loss gradient only; RowAdam adds l2 * w once to that sum.
    plain = tdf.RowAdam(torch.zeros(1, 2), cfg)
    plain.table[0] = torch.tensor([2.0, 2.0])
    plain.lr = 0.0
    g = seen["grads"][0]
    # With lr 0 nothing moves; the moment holds (1 - beta1) * (g + l2 * w): one l2 term.
    plain.apply(torch.tensor([0]), g[None, :])
    np.testing.assert_allclose(plain.m[0].numpy(), 0.1 * (g + torch.tensor([2.0, 2.0])).numpy(),
                               rtol=1e-6)  # fmt: skip


def _write_split(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 5, n)
    b = rng.integers(0, 4, n)
    x = rng.normal(size=n)
    label = ((a >= 3) ^ (rng.random(n) < 0.1)).astype(int)
    rows = zip(label, a, b, x, strict=True)
    lines = ["label,a,b,x"] + [f"{y},v{i},w{j},{v:.4f}" for y, i, j, v in rows]
    path.write_text("\n".join(lines) + "\n")


def test_a_short_run_learns_and_reports(tmp_path: Path) -> None:
    for name, n, seed in (("train", 800, 0), ("valid", 200, 1), ("test", 200, 2)):
        _write_split(tmp_path / f"{name}.csv", n, seed)
    cfg = tdf.TorchConfig(embedding_dim=4, hidden=(8,), batch_size=64, lr=0.01, max_epochs=4,
                          embedding_l2=0.0)  # fmt: skip
    columns = tdf.Columns("label", ("a", "b"), ("x",))
    lines: list[str] = []
    result = tdf.run(tmp_path, cfg, columns, log=lines.append)
    assert result.test_auc > 0.8
    assert 1 <= result.best_epoch <= result.epochs <= 4
    assert len(result.epochs_log) == result.epochs
    assert result.train_samples_per_s > 0
    assert lines[-1].startswith(f"torch test (epoch {result.best_epoch})")


def test_unseen_values_share_their_fields_row(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("label,a,b\n1,x,p\n0,y,p\n")
    (tmp_path / "u.csv").write_text("label,a,b\n1,z,q\n0,x,p\n")
    columns = tdf.Columns("label", ("a", "b"))
    enc = tdf.fit_encoding(tdf.read_table(tmp_path / "t.csv", columns), columns)
    split = tdf.encode(tdf.read_table(tmp_path / "u.csv", columns), enc)
    # field a: rows 0 (unseen), 1 (x), 2 (y); field b: rows 3 (unseen), 4 (p)
    assert split.rows.tolist() == [[0, 3], [1, 4]]
    assert enc.num_rows == 5


def test_table_adam_moves_rows_the_batch_did_not_use() -> None:
    """The plain-PyTorch variant: after a row's update its moments keep moving it."""
    cfg = tdf.TorchConfig(lr=0.01, embedding_l2=0.0)
    table = torch.ones(3, 2)
    opt = tdf.TableAdam(table, cfg)
    opt.apply(torch.tensor([0]), torch.ones(1, 2))
    after_first = table.clone()
    opt.apply(torch.tensor([1]), torch.ones(1, 2))
    assert not torch.equal(table[0], after_first[0])  # row 0 unused at step 2, still moved
    assert torch.equal(table[2], torch.ones(2))  # never had a gradient: Adam leaves it
