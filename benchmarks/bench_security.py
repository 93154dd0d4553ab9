"""What TLS, mutual TLS and role tokens cost a pull, against plaintext in the same run.

Run from the repository root::

    python benchmarks/bench_security.py           # about 30 s on 2 cores
    python benchmarks/bench_security.py --quick

One in-process Staged-PS shard on 127.0.0.1 and one ``PSClient`` per
configuration (certificates and tokens from ``deploy/tls/make-certs.sh`` in a
temporary directory; needs ``openssl``). Each configuration pulls a table of
dim 16 sequentially: ``--pulls`` times 1 key (the per-RPC cost: handshake
excluded, interceptor and record layer included) and as many times 4,096 keys
(256 KiB answers: the bulk cost). Reported: median and p99 microseconds per
pull and the median's ratio to plaintext. JSON goes to
``benchmarks/results/bench_security.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from heraldps.client import PSClient
from heraldps.optim import SGD
from heraldps.security import ClientSecurity, ServerSecurity
from heraldps.tls import TlsFiles
from ps_server.server import PSConfig, PSServer

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "bench_security.json"


def configurations(d: Path) -> dict[str, tuple[ServerSecurity, ClientSecurity]]:
    cert, key, ca = str(d / "heraldps.crt"), str(d / "heraldps.key"), str(d / "ca.crt")
    admin, worker = str(d / "admin.token"), str(d / "worker.token")
    return {
        "plaintext": (ServerSecurity(), ClientSecurity()),
        "tokens": (ServerSecurity(admin_token_file=admin, worker_token_file=worker),
                   ClientSecurity(token_file=worker)),
        "tls": (ServerSecurity(TlsFiles(cert, key)), ClientSecurity(TlsFiles(ca=ca))),
        "mtls": (ServerSecurity(TlsFiles(cert, key, ca)), ClientSecurity(TlsFiles(cert, key, ca))),
        "mtls+tokens": (ServerSecurity(TlsFiles(cert, key, ca), admin, worker),
                        ClientSecurity(TlsFiles(cert, key, ca), worker)),
    }  # fmt: skip


def timed_pulls(ps: PSClient, keys: np.ndarray, count: int) -> list[float]:
    out = []
    for _ in range(count):
        began = time.perf_counter()
        ps.pull("emb", keys)
        out.append(time.perf_counter() - began)
    return out


def measure(name: str, server_security: ServerSecurity, client_security: ClientSecurity,
            admin_token: str, pulls: int) -> dict[str, Any]:  # fmt: skip
    server = PSServer(PSConfig(port=0, grace_seconds=0, security=server_security))
    server.start()
    address = [f"127.0.0.1:{server.port}"]
    try:
        admin = ClientSecurity(client_security.tls, token=admin_token)
        with PSClient(address, security=admin) as setup:
            setup.create_table("emb", dim=16, optimizer=SGD(lr=0.1))
        row: dict[str, Any] = {"config": name}
        with PSClient(address, security=client_security) as ps:
            ps.wait_ready()
            for label, keys in (("1_key", np.array([7])), ("4096_keys", np.arange(4096))):
                timed_pulls(ps, keys, max(10, pulls // 10))  # warm-up, rows created
                seconds = np.array(timed_pulls(ps, keys, pulls)) * 1e6
                row[f"{label}_median_us"] = float(np.median(seconds))
                row[f"{label}_p99_us"] = float(np.percentile(seconds, 99))
        return row
    finally:
        server.stop(grace=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pulls", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="200 pulls per measurement")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    pulls = 200 if args.quick else args.pulls
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        subprocess.run(["bash", str(ROOT / "deploy" / "tls" / "make-certs.sh"), tmp],
                       check=True, capture_output=True)  # fmt: skip
        admin_token = (d / "admin.token").read_text().strip()
        rows = [measure(n, s, c, admin_token, pulls) for n, (s, c) in configurations(d).items()]
    base = rows[0]
    print("| config | 1 key median us | p99 us | vs plaintext | 4096 keys median us | p99 us "
          "| vs plaintext |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        r["1_key_ratio"] = r["1_key_median_us"] / base["1_key_median_us"]
        r["4096_keys_ratio"] = r["4096_keys_median_us"] / base["4096_keys_median_us"]
        print(f"| {r['config']} | {r['1_key_median_us']:.0f} | {r['1_key_p99_us']:.0f} | "
              f"{r['1_key_ratio']:.2f} | {r['4096_keys_median_us']:.0f} | "
              f"{r['4096_keys_p99_us']:.0f} | {r['4096_keys_ratio']:.2f} |")  # fmt: skip
    machine = {"python": platform.python_version(), "processor": platform.processor(),
               "grpcio": grpc.__version__, "pulls": pulls}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"machine": machine, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
