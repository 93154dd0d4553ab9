"""``heraldps ps``: one parameter-server shard (Staged-PS or Cached-PS)."""

from __future__ import annotations

import argparse

from launcher.cli.command import Command, add_admission_arguments, add_server_arguments
from launcher.cli.security_flags import (
    add_server_security_arguments,
    add_tls_arguments,
    server_security,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_server_arguments(p, port=7001, threads=16)
    add_admission_arguments(
        p, streams=16, streams_help="ExportIncremental (and other) streams open at once; "
        "one more is answered RESOURCE_EXHAUSTED (reason OVERLOADED)",
    )  # fmt: skip
    p.add_argument("--shard-index", type=int, default=0, help="this shard's index, 0..S-1")
    p.add_argument("--num-shards", type=int, default=1, help="number of shards S in the cluster")
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="cap on the shard's memory: tables (a Cached-PS table's whole --cache-gb, "
        "charged at CreateTable), gradient buffers and calls' buffers; a table or request "
        "beyond it fails with RESOURCE_EXHAUSTED",
    )
    p.add_argument(
        "--expected-rows",
        type=int,
        default=0,
        help="staged store: rows each table of this shard is sized for up front (its key "
        "index and row arrays), so it never rehashes or moves while growing to them; "
        "0: grow as keys arrive (docs/ps.md, 'Memory and growth')",
    )
    p.add_argument(
        "--kernel-threads",
        type=int,
        default=0,
        help="threads one big pull or commit shares its compiled loops over (lookups, "
        "gathers, copies); 0: one per core, at most 4; 1: the handler's own thread only "
        "(docs/ps.md, 'Storage')",
    )
    p.add_argument(
        "--store",
        default="staged",
        choices=("staged", "cached"),
        help="staged: tables in host memory; cached: LMDB on disk behind a host cache",
    )
    p.add_argument(
        "--restore",
        default=None,
        help="load this Save snapshot at start (any path: the operator's own flag)",
    )
    p.add_argument(
        "--snapshot-root",
        default=None,
        help="Save and Load paths are taken under this directory, and any other is "
        "PERMISSION_DENIED (none: any path the process may write; for a trusted network)",
    )
    add_tls_arguments(p, client=False)
    add_server_security_arguments(p)
    cached = p.add_argument_group("cached store (--store cached)")
    cached.add_argument(
        "--data-dir", default=None, help="directory of the LMDB files (required with cached)"
    )
    cached.add_argument(
        "--cache-gb",
        type=float,
        default=1.0,
        help="host cache per table, GiB (committed as rows arrive; "
        "--memory-limit-gb counts it whole)",
    )
    cached.add_argument(
        "--target-hit-rate",
        type=float,
        default=1.0,
        help="requests hitting the cache at least this often do not insert their misses",
    )
    cached.add_argument(
        "--max-num-evict",
        type=int,
        default=-1,
        help="freeze the cache after this many evicting requests (-1: never)",
    )
    cached.add_argument(
        "--durability",
        default="sync",
        choices=("sync", "periodic"),
        help="fsync every acknowledged change (sync) or every 5 s (periodic)",
    )
    cached.add_argument(
        "--max-disk-gb",
        type=float,
        default=1024.0,
        help="LMDB map size, GiB; writes beyond it fail with RESOURCE_EXHAUSTED",
    )


def run(args: argparse.Namespace) -> int:
    from ps_server.server import PSConfig, serve

    config = PSConfig(
        host=args.host, port=args.port, shard_index=args.shard_index,
        num_shards=args.num_shards, metrics_port=args.metrics_port,
        max_message_mb=args.max_message_mb, memory_limit_gb=args.memory_limit_gb,
        expected_rows=args.expected_rows, kernel_threads=args.kernel_threads,
        threads=args.threads, grace_seconds=args.grace_seconds, port_file=args.port_file,
        store=args.store, data_dir=args.data_dir, cache_gb=args.cache_gb,
        target_hit_rate=args.target_hit_rate, max_num_evict=args.max_num_evict,
        durability=args.durability, max_disk_gb=args.max_disk_gb, restore=args.restore,
        snapshot_root=args.snapshot_root, security=server_security(args),
        max_concurrent_rpcs=args.max_concurrent_rpcs, max_streams=args.max_streams,
        stream_stall_seconds=args.stream_stall_seconds,
    )  # fmt: skip
    return serve(config)


COMMAND = Command(
    name="ps",
    help="run one parameter-server shard: Staged-PS (host memory) or Cached-PS (LMDB + cache)",
    description="Run one parameter-server shard of a heraldps cluster: tables wholly in host "
    "memory (--store staged) or in LMDB on disk behind a host-memory cache (--store cached).",
    add_arguments=add_arguments,
    run=run,
)
