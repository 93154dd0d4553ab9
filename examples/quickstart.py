"""First steps with a heraldps cluster: the README's example, then a short training loop.

Run against shards started with ``heraldps ps`` (``examples/quickstart.sh``
starts two on 127.0.0.1:7001 and :7002, runs this, and stops them):

    python examples/quickstart.py 127.0.0.1:7001 127.0.0.1:7002
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

from heraldps.client import PSClient
from heraldps.init import Normal
from heraldps.optim import SGD, AdaGrad


def main(addresses: list[str]) -> int:
    ps = PSClient(addresses)
    ps.wait_ready(timeout=60)

    # The README example.
    ps.create_table("emb", dim=16, optimizer=SGD(lr=0.1), initializer=Normal(std=0.01, seed=7))
    keys = np.array([3, 1 << 40, 3], dtype=np.int64)
    values, versions = ps.pull("emb", keys)
    ps.push_gradients("emb", keys, np.ones((3, 16), np.float32), iteration=0)
    ps.commit(iteration=0)
    after, versions = ps.pull("emb", keys)
    print("key 3 moved by", float((after[0] - values[0]).mean()), "(expected -0.2)")
    print("key 1<<40 moved by", float((after[1] - values[1]).mean()), "(expected -0.1)")
    print("versions after one commit:", versions.tolist())

    # A short synchronous training loop on a second table: a logistic-regression
    # toy with one embedding per feature id, AdaGrad on the PS.
    ps.create_table("ids", dim=8, optimizer=AdaGrad(lr=0.1), initializer=Normal(std=0.1, seed=1))
    rng = np.random.default_rng(0)
    truth = rng.normal(size=(5000, 8)).astype(np.float32)
    direction = rng.normal(size=8).astype(np.float32)
    for iteration in range(1, 51):
        batch = rng.integers(0, 5000, 1024)
        rows, _ = ps.pull("ids", batch)
        labels = (truth[batch] @ direction > 0).astype(np.float32)
        logits = rows @ direction
        probs = 1 / (1 + np.exp(-logits))
        grads = ((probs - labels)[:, None] * direction[None, :]) / len(batch)
        ps.push_gradients("ids", batch, grads.astype(np.float32), iteration=iteration)
        ps.commit(iteration)
        if iteration % 10 == 0:
            loss = -np.mean(labels * np.log(probs + 1e-7) + (1 - labels) * np.log(1 - probs + 1e-7))
            print(f"iteration {iteration:3d}  logloss {loss:.4f}")

    for name, stats in ps.list_tables().items():
        print(f"table {name}: dim {stats.spec.dim}, {stats.rows} rows, {stats.bytes} bytes")
    with tempfile.TemporaryDirectory() as tmp:
        print("saved", ps.save(f"{tmp}/snapshot"), "rows to a snapshot")
    changed = ps.export_incremental(since_iteration=40)["ids"]
    print(f"rows changed by iterations 41..50: {len(changed.keys)}")
    ps.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["127.0.0.1:7001", "127.0.0.1:7002"]))
