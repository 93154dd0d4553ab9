"""Pull latency under many concurrent clients: the bounded server against an unbounded one.

Run from the repository root::

    python benchmarks/bench_load.py              # about 90 s on 2 cores
    python benchmarks/bench_load.py --seconds 4  # shorter
    python benchmarks/bench_load.py --clients 1,16,64,256
    python benchmarks/bench_load.py --clients 64 --client-processes 1 --keys 8000 \
        --servers bounded --before REV --out /tmp/load.json   # other client shapes

Two shards started with the real CLI (``python -m launcher ps``), each in its
own process, serve one table (dim 64, SGD, 100,000 rows). For each number of
clients N, N client threads spread over 8 client processes, each thread with
its own ``PSClient`` (its own channels), pull 2,000 random keys in a loop for
``--seconds``; a pull's latency is the caller's, retries and backoff included.

Two servers, measured in the same run, in turn:

- ``bounded``: the defaults (``--threads 16``, ``--max-concurrent-rpcs`` 0 =
  64): calls beyond 64 at once are answered RESOURCE_EXHAUSTED (OVERLOADED) at
  once and PSClient retries them after a backoff;
- ``unbounded`` (the baseline): ``--max-concurrent-rpcs 100000``: every call is
  admitted and waits in line for one of the 16 threads, as all calls did before
  the bound existed;
- ``before`` (with ``--before REV``): the shard of an older commit, e.g. the one
  before admission control, unpacked with ``git archive`` into a temporary
  directory and run from there with its own defaults.

It prints a markdown table (p50/p95/p99 per N, errors, calls refused and
retried) and the ratio p99/p50 at 64 clients against the target of 10x, and
writes every number to ``benchmarks/results/bench_load.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "bench_load.json"
ROWS, DIM, KEYS_PER_PULL, CLIENT_PROCESSES = 100_000, 64, 2_000, 8
TARGET_RATIO = 10.0
SERVERS = {"unbounded": ["--max-concurrent-rpcs", "100000"], "bounded": []}


@contextlib.contextmanager
def shards(
    count: int, flags: list[str], workdir: Path, source: Path = ROOT
) -> Iterator[list[tuple[str, int, int]]]:
    """``count`` shards of the real CLI (the code in ``source``); yields (address,
    metrics port, pid) of each."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(count):
            port_file = workdir / f"port-{index}"
            port_file.unlink(missing_ok=True)
            log = (workdir / f"shard-{index}.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "launcher", "ps", "--host", "127.0.0.1", "--port", "0",
                 "--metrics-port", "0", "--port-file", str(port_file),
                 "--shard-index", str(index), "--num-shards", str(count), *flags],
                cwd=source, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT,
            ))  # fmt: skip
        found = []
        for index, proc in enumerate(procs):
            port_file = workdir / f"port-{index}"
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().endswith("\n")):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"shard {index} did not start; see {workdir}")
                time.sleep(0.05)
            port, metrics = port_file.read_text().split()
            found.append((f"127.0.0.1:{port}", int(metrics), proc.pid))
        yield found
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def unpack(rev: str, into: Path) -> Path:
    """The tree of commit ``rev`` in ``into`` (``git archive``)."""
    into.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def refused(metrics_ports: list[int]) -> int:
    """Calls the shards answered OVERLOADED (each one retried by its client)."""
    total = 0.0
    for port in metrics_ports:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        for match in re.finditer(
            rb'^heraldps_rpc_rejected_total\{why="overloaded"\} (\S+)$', text, re.MULTILINE
        ):
            total += float(match.group(1))
    return int(total)


def client_process(
    addresses: list[str], threads: int, keys: int, seconds: float, start_at: float, out: mp.Queue
) -> None:
    """``threads`` clients, each with its own PSClient, pulling until the time is up."""
    from heraldps.client import PSClient

    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads

    def run(i: int) -> None:
        rng = np.random.default_rng(os.getpid() * 1000 + i)
        with PSClient(addresses, timeout=60) as ps:
            ps.pull("emb", np.arange(1))  # connect and learn the width before the clock
            while time.time() < start_at:
                time.sleep(0.001)
            while time.time() < start_at + seconds:
                wanted = rng.integers(0, ROWS, keys)
                began = time.perf_counter()
                try:
                    ps.pull("emb", wanted)
                    latencies[i].append(time.perf_counter() - began)
                except Exception:
                    errors[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put(([x for per in latencies for x in per], sum(errors)))


def measure(
    addresses: list[str], clients: int, keys: int, seconds: float, client_processes: int
) -> tuple[list[float], int]:
    processes = min(client_processes, clients)
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    out: mp.Queue = mp.Queue()
    start_at = time.time() + 3.0 + clients * 0.01  # every client connected first
    procs = [
        mp.Process(target=client_process, args=(addresses, n, keys, seconds, start_at, out))
        for n in per
    ]
    for p in procs:
        p.start()
    latencies: list[float] = []
    errors = 0
    for _ in procs:
        got, failed = out.get(timeout=seconds + 300)
        latencies += got
        errors += failed
    for p in procs:
        p.join()
    return latencies, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,16,64,256")
    parser.add_argument("--seconds", type=float, default=8.0, help="pulling time per point")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--before", default=None, help="also run the shards of this commit")
    parser.add_argument("--client-processes", type=int, default=CLIENT_PROCESSES)
    parser.add_argument("--keys", type=int, default=KEYS_PER_PULL, help="keys per pull")
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help="which of " + ", ".join(SERVERS)
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    from heraldps.client import PSClient
    from heraldps.optim import SGD

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        chosen = args.servers.split(",")
        runs = [(server, flags, ROOT) for server, flags in SERVERS.items() if server in chosen]
        if args.before:
            runs.insert(0, ("before", [], unpack(args.before, Path(tmp) / "before")))
        for server, flags, source in runs:
            with shards(args.shards, flags, Path(tmp), source) as found:
                addresses = [a for a, _, _ in found]
                with PSClient(addresses) as ps:
                    ps.create_table("emb", dim=DIM, optimizer=SGD(lr=0.1))
                    ps.pull("emb", np.arange(ROWS))
                for clients in counts:
                    metrics = [m for _, m, _ in found]
                    before = refused(metrics)
                    latencies, errors = measure(
                        addresses, clients, args.keys, args.seconds, args.client_processes
                    )
                    lat = np.array(latencies) if latencies else np.array([np.nan])
                    p50, p95, p99 = (float(np.percentile(lat, q)) for q in (50, 95, 99))
                    rows.append({
                        "server": server, "clients": clients, "pulls": len(latencies),
                        "pulls_per_s": len(latencies) / args.seconds, "p50_s": p50,
                        "p95_s": p95, "p99_s": p99, "p99_over_p50": p99 / p50,
                        "errors": errors, "refused_and_retried": refused(metrics) - before,
                    })  # fmt: skip
                    r = rows[-1]
                    print(f"{server:9} {clients:4} clients: p50 {p50:.3f} s, p99 {p99:.3f} s, "
                          f"{r['pulls_per_s']:.0f} pulls/s, {errors} errors, "
                          f"{r['refused_and_retried']} refused", flush=True)  # fmt: skip

    print()
    print("| server | clients | pulls/s | p50 s | p95 s | p99 s | p99/p50 | errors "
          "| refused, retried |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['server']} | {r['clients']} | {r['pulls_per_s']:.0f} | {r['p50_s']:.3f} | "
              f"{r['p95_s']:.3f} | {r['p99_s']:.3f} | {r['p99_over_p50']:.1f} | {r['errors']} | "
              f"{r['refused_and_retried']} |")  # fmt: skip
    at64 = {r["server"]: r["p99_over_p50"] for r in rows if r["clients"] == 64}
    for server, ratio in at64.items():
        verdict = "met" if ratio <= TARGET_RATIO else "missed"
        print(f"{server}: p99/p50 at 64 clients = {ratio:.1f} (target <= {TARGET_RATIO:.0f}: "
              f"{verdict})")  # fmt: skip
    machine = {"python": platform.python_version(), "numpy": np.__version__,
               "processor": platform.processor(), "cpus": os.cpu_count()}  # fmt: skip
    config = {"shards": args.shards, "rows": ROWS, "dim": DIM, "keys_per_pull": args.keys,
              "seconds": args.seconds, "client_processes": args.client_processes,
              "servers": SERVERS, "before": args.before}  # fmt: skip
    args.out.write_text(
        json.dumps({"machine": machine, "config": config, "rows": rows}, indent=2) + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
