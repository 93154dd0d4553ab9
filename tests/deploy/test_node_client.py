"""The Node.js example client (examples/node) against real ``heraldps ps`` shards.

The Node script checks its own pulls against a float32 optimizer written in
JavaScript; this test then reads the same rows with ``PSClient`` and checks
them against ``heraldps.optim`` (the PS's own update functions), the
initializers and the key routing, so a Node client that routed, encoded or
committed wrongly cannot pass by agreeing with itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from heraldps.client import PSClient
from heraldps.init import Initializer, Normal, Uniform
from heraldps.optim import SGD, AdaGrad, Optimizer
from heraldps.sharding import shard_of
from heraldps.spec import TableSpec
from tests.conftest import ClusterFactory
from tests.tools import require_tool

NODE_DIR = Path(__file__).resolve().parents[2] / "examples" / "node"


def _node_ready() -> str:
    """Path of ``node`` with the example's npm packages installed (``npm ci`` if needed)."""
    node = require_tool("node", "install Node.js >= 18 (Debian: apt-get install nodejs npm)")
    if (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        return node
    npm = require_tool("npm", "install npm (Debian: apt-get install npm)")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        message = f"`npm ci` in {NODE_DIR} failed (offline?): {done.stderr.strip()[-600:]}"
        if os.environ.get("HERALDPS_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return node


@contextmanager
def cli_shard(index: int, num_shards: int, workdir: Path) -> Iterator[str]:
    """`heraldps ps --port 0 --port-file` in a subprocess: yields its address, then SIGTERMs it."""
    port_file = workdir / f"shard-{index}.port"
    log_path = workdir / f"shard-{index}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", "ps", "--host", "127.0.0.1", "--port", "0",
             "--shard-index", str(index), "--num-shards", str(num_shards),
             "--metrics-port", "0", "--grace-seconds", "1", "--port-file", str(port_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"shard {index} did not start: {log_path.read_text()}")
                time.sleep(0.05)
            yield f"127.0.0.1:{port_file.read_text().split()[0]}"
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0, log_path.read_text()


def _run_node(node: str, addresses: list[str], report: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node, "demo.mjs", "--ps", ",".join(addresses), "--json", str(report)],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _expected_rows(
    table: dict[str, Any], optimizer: Optimizer, dim: int
) -> dict[int, tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
    """(value, state) of every distinct key after one commit of the pushed gradients."""
    keys = np.array([int(k) for k in table["keys"]], dtype=np.int64)
    grads = np.array(table["grads"], dtype=np.float32)
    distinct, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    summed = np.zeros((distinct.size, dim), dtype=np.float32)
    np.add.at(summed, inverse, grads)  # float32, in push order, as the PS sums a request
    values = np.array(table["before"], dtype=np.float32)[first]
    state = np.array(table["state_before"], dtype=np.float32).reshape(keys.size, -1)[first]
    optimizer.apply(values, state, summed)
    return {int(k): (values[i], state[i]) for i, k in enumerate(distinct)}


def test_node_client_trains_one_iteration_on_two_cli_shards(tmp_path: Path) -> None:
    node = _node_ready()
    report_path = tmp_path / "report.json"
    with ExitStack() as stack:
        addresses = [stack.enter_context(cli_shard(i, 2, tmp_path)) for i in range(2)]
        done = _run_node(node, addresses, report_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "all rows as the optimizer says" in done.stdout
        assert "committed iteration 0 on 2 shard(s)" in done.stdout
        report = json.loads(report_path.read_text())
        assert report["iteration"] == 0

        tables: dict[str, tuple[Optimizer, Initializer, int]] = {
            "node_sgd": (SGD(lr=0.1), Normal(std=0.01, seed=7), 0),
            "node_adagrad": (
                AdaGrad(lr=0.05, initial_accumulator=0.1, eps=1e-8),
                Uniform(low=-0.05, high=0.05, seed=11),
                8,
            ),
        }
        with PSClient(addresses) as ps:
            assert sorted(ps.list_tables()) == sorted(tables)
            assert ps.committed_iteration() == 0
            for name, (optimizer, initializer, state_width) in tables.items():
                stats = ps.describe_table(name)
                # The Node client's spec arrived exactly: dim, initializer, optimizer.
                assert stats.spec == TableSpec(name, 8, initializer, optimizer).canonical()
                assert stats.state_width == state_width
                table = report["tables"][name]
                keys = np.array([int(k) for k in table["keys"]], dtype=np.int64)
                assert table["shards"] == shard_of(keys, 2).tolist()  # Node routes like Python
                assert set(table["shards"]) == {0, 1}
                assert stats.rows == np.unique(keys).size  # every row on exactly one shard
                # What Node decoded before the push is the initializer's row, bit for bit.
                before = np.array(table["before"], dtype=np.float32)
                assert np.array_equal(before, stats.spec.initializer.generate(keys, 8))
                assert table["versions_before"] == ["0"] * keys.size

                values, versions, state = ps.pull_with_state(name, keys)
                expected = _expected_rows(table, stats.spec.optimizer, 8)
                for i, key in enumerate(keys.tolist()):
                    want_value, want_state = expected[key]
                    assert np.array_equal(values[i], want_value), (name, key)
                    assert np.array_equal(state[i], want_state), (name, key)
                assert versions.tolist() == [1] * keys.size
                assert np.array_equal(np.array(table["after"], dtype=np.float32), values)


def test_node_client_exits_nonzero_with_the_servers_error(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    node = _node_ready()
    servers, ps = cluster(1)
    ps.create_table("node_sgd", dim=4, optimizer=SGD(lr=0.1))  # another spec under the same name
    done = _run_node(node, [f"127.0.0.1:{servers[0].port}"], tmp_path / "report.json")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "CreateTable" in done.stderr and "ALREADY_EXISTS" in done.stderr
    assert ps.describe_table("node_sgd").spec.dim == 4


def test_node_routing_equals_python_for_many_keys_and_shard_counts() -> None:
    node = _node_ready()
    keys = np.random.default_rng(5).integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)
    keys[:4] = [0, -1, 2**63 - 1, -(2**63)]
    script = (
        'import { shardOf } from "./heraldps.mjs";'
        'const keys = process.argv[1].split(",").map(BigInt);'
        "for (let s = 1; s <= 9; s++) console.log(keys.map((k) => shardOf(k, s)).join(','));"
    )
    done = subprocess.run(
        [node, "--input-type=module", "-e", script, ",".join(map(str, keys.tolist()))],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 9
    for num_shards, line in enumerate(done.stdout.split(), start=1):
        assert [int(s) for s in line.split(",")] == shard_of(keys, num_shards).tolist()
