"""examples/pytorch_adapter.py: PyTorch training with the embedding table on real PS shards.

The adapter's rows on the PS must equal a pure-PyTorch run (an ordinary
embedding tensor, the same initial rows and ``torch.optim.SGD``) within
float32 rounding, and the loss must fall.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from heraldps.bundled import bundled_data
from heraldps.data import DataSpec, read_all
from heraldps.init import Normal
from heraldps.optim import SGD
from tests.conftest import ClusterFactory

if os.environ.get("HERALDPS_REQUIRE_TOOLS") == "1":
    import torch  # CI installs the torch extra: a missing torch fails here
else:
    torch = pytest.importorskip("torch", reason="pip install -e '.[torch]' (CPU PyTorch)")

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "examples" / "pytorch_adapter.py"
LR, EMBEDDING_LR, DIM = 0.2, 1.0, 8


def _load_adapter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pytorch_adapter", ADAPTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference(
    adapter: ModuleType, head: Any, batches: list[Any], initial: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, list[float]]:
    """Pure PyTorch: the whole table as one tensor, SGD on it and on the head."""
    table = torch.nn.Parameter(torch.from_numpy(initial.copy()))
    optimizer = torch.optim.SGD(
        [{"params": head.parameters(), "lr": LR}, {"params": [table], "lr": EMBEDDING_LR}]
    )
    losses = []
    for data in batches:
        batch = adapter.to_batch(data)
        rows = table[torch.from_numpy(np.searchsorted(keys, batch.keys.numpy()))]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head(rows, batch), batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return table.detach().numpy(), losses


def test_adapter_rows_equal_pure_pytorch_sgd_and_loss_falls(cluster: ClusterFactory) -> None:
    adapter = _load_adapter()
    _, ps = cluster(2)
    data = read_all(DataSpec(str(bundled_data()[0])))
    batches = list(data.batches(64, limit=16))
    ps.create_table("emb", DIM, SGD(lr=EMBEDDING_LR), Normal(std=0.01, seed=3))
    torch.manual_seed(0)
    head = adapter.CTRHead(len(data.sparse_columns), len(data.dense_columns), DIM)
    reference_head = copy.deepcopy(head)
    keys = np.unique(np.concatenate([b.keys for b in batches]))
    # The initial rows as the PS creates them (std rounded to float32 on the wire).
    initial = ps.describe_table("emb").spec.initializer.generate(keys, DIM)
    test = read_all(DataSpec(str(bundled_data()[1])))
    held_out_before = adapter.held_out_loss(ps, "emb", head, test)

    losses = adapter.train(ps, "emb", head, batches, LR, first_iteration=0)

    assert ps.committed_iteration() == len(batches) - 1
    values, versions = ps.pull("emb", keys)
    want, want_losses = _reference(adapter, reference_head, batches, initial, keys)
    assert np.abs(values - initial).max() > 1e-3  # the rows did train
    np.testing.assert_allclose(values, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for mine, theirs in zip(head.parameters(), reference_head.parameters(), strict=True):
        np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(), atol=1e-6)
    # One update per iteration a key took part in: the gradient went up once per batch.
    appearances = sum(np.isin(keys, np.unique(b.keys)).astype(np.int64) for b in batches)
    assert np.array_equal(versions, appearances)
    # The loss falls: on held-out rows, and from the first batch to the later ones.
    assert adapter.held_out_loss(ps, "emb", head, test) < held_out_before - 0.05
    assert np.mean(losses[-8:]) < losses[0] - 0.05


def test_adapter_script_trains_against_shards_and_the_loss_falls(cluster: ClusterFactory) -> None:
    servers, ps = cluster(2)
    addresses = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    done = subprocess.run(
        [sys.executable, str(ADAPTER), "--ps", addresses, "--iterations", "30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = dict(re.findall(r"held-out loss (before|after) training (\d\.\d+)", done.stdout))
    before, after = float(found["before"]), float(found["after"])
    assert after < before - 0.05, done.stdout
    assert ps.committed_iteration() == 29
    assert ps.describe_table("torch_emb").rows > 10_000
