"""kill -9 of a Cached-PS shard at random moments: every acknowledged commit survives,
no half-applied iteration is ever visible."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from heraldps.client import PSClient
from heraldps.errors import HeraldError
from heraldps.init import Normal
from heraldps.optim import SGD

KEYS = np.arange(-500, 500, dtype=np.int64)
DIM = 4
LR = np.float32(0.5)


def start_shard(data_dir: Path, workdir: Path, round_: int) -> tuple[subprocess.Popen[bytes], str]:
    port_file = workdir / f"round-{round_}.port"
    log = open(workdir / f"round-{round_}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "ps", "--host", "127.0.0.1", "--port", "0",
         "--store", "cached", "--data-dir", str(data_dir), "--cache-gb", "0.00002",
         "--port-file", str(port_file)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None, (workdir / f"round-{round_}.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text().split()[0]}"


def test_kill_9_at_random_moments_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    data_dir = tmp_path / "data"
    expected: np.ndarray | None = None
    versions = np.zeros(KEYS.shape[0], dtype=np.int64)
    acknowledged = -1
    pending: tuple[np.ndarray, np.ndarray] | None = None
    for round_ in range(8):
        proc, address = start_shard(data_dir, tmp_path, round_)
        ps = PSClient([address], retries=0, timeout=10)
        ps.wait_ready()
        ps.create_table("emb", DIM, SGD(lr=float(LR)), Normal(std=0.1, seed=5))
        committed = ps.committed_iteration()
        values, stored_versions = ps.pull("emb", KEYS)
        if expected is None:
            expected = values.copy()  # the initial rows
        # The shard serves exactly the acknowledged commits, plus possibly the one in flight.
        assert committed >= acknowledged
        if committed > acknowledged:
            assert committed == acknowledged + 1 and pending is not None
            expected, versions = pending
            acknowledged = committed
        assert np.array_equal(values, expected), f"round {round_}"
        assert np.array_equal(stored_versions, versions), f"round {round_}"
        killer = threading.Timer(
            rng.uniform(0.3, 1.5), lambda p=proc: p.send_signal(signal.SIGKILL)
        )
        killer.start()
        pending = None
        try:
            t = acknowledged + 1
            while True:
                keys = np.unique(rng.choice(KEYS, 300))
                grads = rng.normal(0, 1, (keys.shape[0], DIM)).astype(np.float32)
                nxt, nxt_versions = expected.copy(), versions.copy()
                at = np.searchsorted(KEYS, keys)
                nxt[at] -= LR * grads
                nxt_versions[at] += 1
                ps.push_gradients("emb", keys, grads, t)
                pending = (nxt, nxt_versions)
                ps.commit(t)
                expected, versions, acknowledged, pending = nxt, nxt_versions, t, None
                t += 1
        except HeraldError:
            pass  # killed mid-request (UNAVAILABLE, or whatever status the cut left)
        finally:
            killer.cancel()
            ps.close()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert acknowledged >= 0, "no commit before the kill: lengthen the round"
    assert os.path.isdir(data_dir)


def test_start_up_errors_are_clear_and_exit_2(tmp_path: Path) -> None:
    def ps(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "launcher", "ps", "--port", "0", *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    done = ps("--store", "cached")
    assert done.returncode == 2 and "needs --data-dir" in done.stderr
    bad = tmp_path / "shard-00000-of-00001"
    bad.mkdir()
    (bad / "data.mdb").write_bytes(b"\x00garbage" * 512)
    done = ps("--store", "cached", "--data-dir", str(tmp_path))
    assert done.returncode == 2 and "cannot open the Cached-PS data directory" in done.stderr
