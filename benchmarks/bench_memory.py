"""A shard's resident memory under big calls and under requests that do not parse.

Run from the repository root::

    python benchmarks/bench_memory.py                    # about a minute on 2 cores
    python benchmarks/bench_memory.py --before 9e3c8d5   # also an older commit's shard

One shard started with the real CLI (``python -m launcher ps``), one table
(dim 8, SGD). Two loads, each on a fresh shard, resident memory (VmRSS) read
from ``/proc`` every 50 ms:

1. ``big calls``: 16 concurrent GetVersions of 8M keys (64 MB request and
   response), twice; RSS at start, peak, and 2.5 s after the last answer.
   Then the same with ``--memory-limit-gb 1``: calls over the budget are
   answered RESOURCE_EXHAUSTED.
2. ``bad requests``: 20,000 Pull requests that do not parse (4 bytes
   ``ff ff ff ff``), one at a time; RSS before and after, and the status code.

With ``--before REV`` the shard of that commit runs the same loads first
(``git archive`` into a temporary directory). Writes
``benchmarks/results/bench_memory.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
from bench_load import ROOT, shards, unpack

from heraldps import wire
from heraldps.client import PSClient
from heraldps.optim import SGD
from heraldps.serving import channel_options
from heraldps.v1 import ps_pb2, ps_pb2_grpc

RESULTS = ROOT / "benchmarks" / "results" / "bench_memory.json"
BIG_KEYS, CONCURRENT, ROUNDS, BAD_REQUESTS = 8_000_000, 16, 2, 20_000


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def big_calls(address: str, pid: int) -> dict[str, object]:
    channel = grpc.insecure_channel(address, options=channel_options(64 * 2**20))
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    keys = wire.encode_keys(np.arange(BIG_KEYS, dtype=np.int64))
    request = ps_pb2.GetVersionsRequest(table="emb", keys=keys)
    start, peak, done = rss_mb(pid), [0.0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.05)

    codes: list[str] = []

    def one() -> None:
        try:
            stub.GetVersions(request, timeout=300)
            codes.append("OK")
        except grpc.RpcError as err:
            codes.append(err.code().name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    for _ in range(ROUNDS):
        calls = [threading.Thread(target=one) for _ in range(CONCURRENT)]
        for c in calls:
            c.start()
        for c in calls:
            c.join()
    time.sleep(2.5)
    done.set()
    watcher.join()
    channel.close()
    return {"start_mb": start, "peak_mb": peak[0], "after_mb": rss_mb(pid),
            "codes": {c: codes.count(c) for c in sorted(set(codes))}}  # fmt: skip


def bad_requests(address: str, pid: int) -> dict[str, object]:
    channel = grpc.insecure_channel(address)
    pull = channel.unary_unary("/heraldps.v1.ParameterServer/Pull")
    before = rss_mb(pid)
    codes: dict[str, int] = {}
    for _ in range(BAD_REQUESTS):
        try:
            pull(b"\xff\xff\xff\xff", timeout=10)
            code = "OK"
        except grpc.RpcError as err:
            code = err.code().name
        codes[code] = codes.get(code, 0) + 1
    time.sleep(1.5)
    channel.close()
    after = rss_mb(pid)
    return {"before_mb": before, "after_mb": after,
            "kb_per_request": (after - before) * 1024 / BAD_REQUESTS, "codes": codes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="also run the shard of this commit")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("now", ROOT)]
        if args.before:
            runs.insert(0, ("before", unpack(args.before, Path(tmp) / "before")))
        for server, source in runs:
            for load, flags in (("big calls", []), ("big calls, --memory-limit-gb 1",
                                ["--memory-limit-gb", "1"]), ("bad requests", [])):  # fmt: skip
                with shards(1, flags, Path(tmp), source) as found:
                    address = found[0][0]
                    with PSClient([address]) as ps:
                        ps.create_table("emb", dim=8, optimizer=SGD())
                    pid = found[0][2]
                    time.sleep(0.5)
                    run = bad_requests if load == "bad requests" else big_calls
                    result = {"server": server, "load": load, **run(address, pid)}
                    results.append(result)
                    print(result, flush=True)
    print()
    print("| server | load | RSS before, MB | peak, MB | after, MB | answers |")
    print("|---|---|---:|---:|---:|---|")
    for r in results:
        start = r.get("start_mb", r.get("before_mb"))
        peak = f"{r['peak_mb']:.0f}" if "peak_mb" in r else ""
        print(f"| {r['server']} | {r['load']} | {start:.0f} | {peak} | {r['after_mb']:.0f} | "
              f"{r['codes']} |")  # fmt: skip
    machine = {"python": platform.python_version(), "numpy": np.__version__,
               "grpcio": grpc.__version__, "cpus": os.cpu_count()}  # fmt: skip
    RESULTS.write_text(json.dumps({"machine": machine, "before": args.before,
                                   "results": results}, indent=2) + "\n")  # fmt: skip
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
