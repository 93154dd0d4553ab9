"""What a table costs a shard's resident memory, on both stores (docs/cached-ps.md, "Memory").

Run from the repository root (about 2 minutes on 2 cores, under 1 GB)::

    python benchmarks/bench_table_memory.py
    python benchmarks/bench_table_memory.py --before f592665   # also an older shard

One shard of the real CLI (``python -m launcher ps``) per run, resident memory
(VmRSS) read from ``/proc``:

1. ``empty tables``: 1,000 dim-4 AdaGrad tables created one by one on a
   Staged-PS and on a Cached-PS (``--cache-gb 0.05``: 50 GB of caches
   configured); RSS every 100 tables, and the cost per table. An older shard
   (``--before``) that reserved each cache up front is stopped after 5 tables.
2. ``full cache``: one Cached-PS table pulled until its cache is full (800,000
   keys, 50,000 a call); RSS growth against the cache size, after the calls'
   own temporaries were warmed up on another table.
3. ``memory limit``: ``--cache-gb 0.05 --memory-limit-gb 1`` on two shards;
   tables created until one is refused, and each shard's tables then.

Writes ``benchmarks/results/bench_table_memory.json`` and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_load import ROOT, shards, unpack
from bench_memory import rss_mb

from heraldps.client import PSClient
from heraldps.errors import ResourceExhausted
from heraldps.optim import AdaGrad

RESULTS = ROOT / "benchmarks" / "results" / "bench_table_memory.json"
TABLES, STEP, CACHE_GB, BEFORE_TABLES = 1000, 100, "0.05", 5


def store_flags(store: str, workdir: Path) -> list[str]:
    if store == "staged":
        return ["--store", "staged"]
    return ["--store", "cached", "--data-dir", str(workdir / "data"), "--cache-gb", CACHE_GB]


def empty_tables(store: str, workdir: Path, source: Path, limit: int) -> dict[str, object]:
    with shards(1, store_flags(store, workdir), workdir, source) as found:
        address, _, pid = found[0]
        with PSClient([address]) as ps:
            ps.create_table("t0", 4, AdaGrad())  # the first call's one-off costs
            time.sleep(0.5)
            start, curve, started = rss_mb(pid), [], time.perf_counter()
            for i in range(1, limit):
                ps.create_table(f"t{i}", 4, AdaGrad())
                if (i + 1) % STEP == 0 or i + 1 == limit:
                    curve.append((i + 1, round(rss_mb(pid), 1)))
            seconds = time.perf_counter() - started
            time.sleep(0.5)
            end = rss_mb(pid)
    return {"tables": limit, "start_mb": round(start, 1), "end_mb": round(end, 1),
            "kib_per_table": round((end - start) * 1024 / (limit - 1), 1),
            "create_seconds": round(seconds, 1), "curve": curve}  # fmt: skip


def full_cache(workdir: Path) -> dict[str, object]:
    keys = np.arange(50_000, dtype=np.int64)
    with shards(1, store_flags("cached", workdir), workdir) as found:
        address, _, pid = found[0]
        with PSClient([address]) as ps:
            for name in ("warm", "t"):
                ps.create_table(name, 4, AdaGrad())
            for t in range(16):  # kernels loaded, malloc's arenas warm, eviction run
                ps.pull("warm", keys + t * 50_000)
            before = rss_mb(pid)
            for t in range(16):
                ps.pull("t", keys + t * 50_000)
            time.sleep(0.5)
            table = ps.describe_table("t")
            after = rss_mb(pid)
    cache_mb = float(CACHE_GB) * 2**30 / 2**20
    return {"cache_mb": round(cache_mb, 1), "table_bytes_mb": round(table.bytes / 2**20, 1),
            "rows": table.rows, "rss_growth_mb": round(after - before, 1)}  # fmt: skip


def memory_limit(workdir: Path) -> dict[str, object]:
    flags = [*store_flags("cached", workdir), "--memory-limit-gb", "1"]
    with shards(2, flags, workdir) as found:
        addresses = [a for a, _, _ in found]
        refused = ""
        with PSClient(addresses) as ps:
            for i in range(40):
                try:
                    ps.create_table(f"t{i}", 4, AdaGrad())
                except ResourceExhausted as err:
                    refused = f"t{i}: {str(err).splitlines()[0][:160]}"
                    break
        per_shard = []
        for address in addresses:
            with PSClient([address]) as one:
                per_shard.append(len(one.list_tables()))
        peak = max(rss_mb(pid) for _, _, pid in found)
    return {"refused": refused, "tables_per_shard": per_shard, "largest_rss_mb": round(peak, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="also run the shard of this commit")
    args = parser.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("now", ROOT)]
        if args.before:
            runs.insert(0, ("before", unpack(args.before, Path(tmp) / "before")))
        for server, source in runs:
            for store in ("staged", "cached"):
                limit = BEFORE_TABLES if server == "before" and store == "cached" else TABLES
                workdir = Path(tmp) / f"{server}-{store}"
                workdir.mkdir()
                result = empty_tables(store, workdir, source, limit)
                results[f"empty tables, {store}, {server}"] = result
                print(store, server, result, flush=True)
        (Path(tmp) / "full").mkdir()
        results["full cache"] = full_cache(Path(tmp) / "full")
        print(results["full cache"], flush=True)
        (Path(tmp) / "limit").mkdir()
        results["memory limit"] = memory_limit(Path(tmp) / "limit")
        print(results["memory limit"], flush=True)
    print()
    print("| store | server | tables | RSS start, MB | RSS end, MB | per table, KiB |")
    print("|---|---|---:|---:|---:|---:|")
    for name, r in results.items():
        if name.startswith("empty tables") and isinstance(r, dict):
            _, store, server = name.split(", ")
            print(f"| {store} | {server} | {r['tables']} | {r['start_mb']} | {r['end_mb']} | "
                  f"{r['kib_per_table']} |")  # fmt: skip
    machine = {"python": platform.python_version(), "numpy": np.__version__,
               "cpus": os.cpu_count(), "load": os.getloadavg()}  # fmt: skip
    report = {"machine": machine, "before": args.before, "cache_gb": CACHE_GB, "results": results}
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
