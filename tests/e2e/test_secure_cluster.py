"""A whole cluster of real processes over mutual TLS with role tokens, configured through
``HERALDPS_*`` variables: one shard, the scheduler, two workers (dense all-reduce between
them, over TLS too) and the feed; the run commits every iteration."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from heraldps.client import PSClient
from heraldps.job import TrainingJob
from heraldps.security import ClientSecurity
from heraldps.tls import TlsFiles
from tests.certs import make_pki
from tests.processes import heraldps, port, start, stop_all

ITERATIONS = 4
JOB = TrainingJob(
    data="bundled:criteo_head8k", workers=2, batch_size_per_worker=32, iterations=ITERATIONS,
    embedding_dim=4, hidden=(8,), cache_rows=2000, dense_sync="allreduce",
)  # fmt: skip


def test_cluster_trains_over_mutual_tls_with_tokens(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    admin, worker = tmp_path / "admin.token", tmp_path / "worker.token"
    admin.write_text("a" * 40)
    worker.write_text("w" * 40)
    job = tmp_path / "job.json"
    job.write_text(JOB.to_json())
    base = {
        **os.environ,
        "HERALDPS_TLS_CERT": pki.server_cert,  # its serverAuth+clientAuth cert, both ways
        "HERALDPS_TLS_KEY": pki.server_key,
        "HERALDPS_TLS_CA": pki.ca,
        "HERALDPS_ADMIN_TOKEN_FILE": str(admin),
        "HERALDPS_WORKER_TOKEN_FILE": str(worker),
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ps_proc = start(
            "ps",
            ["ps", "--port", "0", "--port-file", str(tmp_path / "ps.port"),
             "--snapshot-root", str(tmp_path / "snaps")],
            tmp_path, base,
        )  # fmt: skip
        procs.append(ps_proc)
        ps = f"127.0.0.1:{port(tmp_path / 'ps.port', ps_proc, tmp_path, 'ps')}"
        scheduler_proc = start(
            "scheduler",
            ["scheduler", "--workers", "2", "--cache-rows", "2000", "--ps", ps, "--port", "0",
             "--port-file", str(tmp_path / "scheduler.port")],
            tmp_path, {**base, "HERALDPS_TOKEN_FILE": str(admin)},
        )  # fmt: skip
        procs.append(scheduler_proc)
        bound = port(tmp_path / "scheduler.port", scheduler_proc, tmp_path, "scheduler")
        scheduler = f"127.0.0.1:{bound}"
        # `heraldps health` over mutual TLS, from the same variables (as an exec probe would).
        health = subprocess.run(heraldps("health", scheduler), env=base, capture_output=True,
                                text=True, timeout=60)  # fmt: skip
        assert health.returncode == 0, health.stderr
        worker_env = {**base, "HERALDPS_TOKEN_FILE": str(worker)}
        workers = []
        for w in range(2):
            args = ["worker", "--job", str(job), "--worker-id", str(w), "--scheduler",
                    scheduler, "--ps", ps, "--timeout-seconds", "60"]  # fmt: skip
            workers.append(start(f"worker{w}", args, tmp_path, worker_env))
        procs.extend(workers)
        feed = subprocess.run(
            heraldps("feed", "--job", str(job), "--scheduler", scheduler, "--ps", ps,
                     "--timeout-seconds", "60"),
            env={**base, "HERALDPS_TOKEN_FILE": str(admin)}, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert feed.returncode == 0, feed.stderr
        for w, proc in enumerate(workers):
            assert proc.wait(timeout=60) == 0, (tmp_path / f"worker{w}.log").read_text()
        tls = TlsFiles(pki.client_cert, pki.client_key, pki.ca)
        with PSClient([ps], security=ClientSecurity(tls, str(admin))) as client:
            assert client.committed_iteration() == ITERATIONS - 1
            assert client.save("final") > 0
        assert (tmp_path / "snaps" / "final").is_dir()
    finally:
        stop_all(procs)
