"""The ``heraldps`` command line.

Every flag can also be set through an environment variable named
``HERALDPS_<FLAG>`` (upper case, dashes as underscores: ``--max-message-mb``
is ``HERALDPS_MAX_MESSAGE_MB``); a flag on the command line wins. See
``heraldps.env_parser`` for the rules.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from heraldps import __version__
from heraldps.env_parser import EnvArgumentParser, mention_env
from heraldps.runtime import tune_malloc


def _addresses(text: str) -> tuple[str, ...]:
    """``--ps A,B,...`` as a tuple of addresses, in shard order (empty entries dropped)."""
    return tuple(a for a in text.split(",") if a)


def _add_ps_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ps",
        help="run one parameter-server shard (Staged-PS: tables in host memory)",
        description="Run one parameter-server shard of a heraldps cluster.",
    )
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=7001, help="gRPC port; 0 picks a free one")
    p.add_argument("--shard-index", type=int, default=0, help="this shard's index, 0..S-1")
    p.add_argument("--num-shards", type=int, default=1, help="number of shards S in the cluster")
    p.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0: free)"
    )
    p.add_argument(
        "--max-message-mb",
        type=int,
        default=64,
        help="largest gRPC message accepted or sent, MiB (default: %(default)s)",
    )
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="cap on table memory; requests beyond it fail with RESOURCE_EXHAUSTED",
    )
    p.add_argument("--threads", type=int, default=16, help="RPC handler threads")
    p.add_argument(
        "--grace-seconds",
        type=float,
        default=10.0,
        help="on SIGTERM, time given to in-flight RPCs (default: %(default)s)",
    )
    p.add_argument(
        "--port-file", default=None, help="write '<port> <metrics port>' here when ready"
    )
    cached = p.add_argument_group("cached store (--store cached)")
    p.add_argument(
        "--store",
        default="staged",
        choices=("staged", "cached"),
        help="staged: tables in host memory; cached: LMDB on disk behind a host cache",
    )
    cached.add_argument("--data-dir", default=None, help="directory of the LMDB files")
    cached.add_argument("--cache-gb", type=float, default=1.0, help="host cache per table, GiB")
    cached.add_argument(
        "--target-hit-rate",
        type=float,
        default=1.0,
        help="requests hitting at least this often do not insert their misses",
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
        help="LMDB map size; writes beyond it fail with RESOURCE_EXHAUSTED",
    )
    p.add_argument("--restore", default=None, help="load this Save snapshot at start")
    p.set_defaults(run=_run_ps)


def _run_ps(args: argparse.Namespace) -> int:
    from heraldps.errors import HeraldError
    from ps_server.server import PSConfig, serve

    try:
        config = PSConfig(
            host=args.host,
            port=args.port,
            shard_index=args.shard_index,
            num_shards=args.num_shards,
            metrics_port=args.metrics_port,
            max_message_mb=args.max_message_mb,
            memory_limit_gb=args.memory_limit_gb,
            threads=args.threads,
            grace_seconds=args.grace_seconds,
            port_file=args.port_file,
            store=args.store,
            data_dir=args.data_dir,
            cache_gb=args.cache_gb,
            target_hit_rate=args.target_hit_rate,
            max_num_evict=args.max_num_evict,
            durability=args.durability,
            max_disk_gb=args.max_disk_gb,
            restore=args.restore,
        )
        return serve(config)
    except (ValueError, OSError, HeraldError) as exc:
        print(f"heraldps ps: {exc}", file=sys.stderr)
        return 2


def _add_scheduler_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "scheduler",
        help="run the Herald scheduler service",
        description="Run the Herald scheduler: plans per worker, BSP barrier, PS commits.",
    )
    p.add_argument("--workers", type=int, required=True, help="number of workers N (<= 64)")
    p.add_argument("--cache-rows", type=int, required=True, help="rows per worker cache")
    p.add_argument(
        "--mode",
        default="herald",
        help="naive, on_demand, location_aware, herald, or het (samples only: worker caches "
        "decide by clocks; the scheduler is the BSP barrier)",
    )
    p.add_argument("--table", default="emb", help="embedding table the plans refer to")
    p.add_argument("--ps", default="", help="comma-separated PS shard addresses, in shard order")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=7100, help="gRPC port; 0 picks a free one")
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--max-backlog", type=int, default=4, help="planned, uncommitted iterations")
    p.add_argument("--max-message-mb", type=int, default=64)
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--grace-seconds", type=float, default=10.0)
    p.add_argument("--port-file", default=None)
    p.add_argument(
        "--no-shadow-naive",
        action="store_true",
        help="do not plan each batch a second time in naive mode for the vs-naive metrics "
        "(saves about half the planning CPU; heraldps_scheduler_naive_rows_total disappears)",
    )
    p.set_defaults(run=_run_scheduler)


def _run_scheduler(args: argparse.Namespace) -> int:
    from heraldps.errors import HeraldError
    from scheduler_service.server import SchedulerConfig, serve

    try:
        config = SchedulerConfig(
            workers=args.workers, cache_rows=args.cache_rows, mode=args.mode, table=args.table,
            ps=_addresses(args.ps), host=args.host, port=args.port,
            metrics_port=args.metrics_port, max_backlog=args.max_backlog,
            max_message_mb=args.max_message_mb, threads=args.threads,
            grace_seconds=args.grace_seconds, port_file=args.port_file,
            shadow_naive=not args.no_shadow_naive,
        )  # fmt: skip
        return serve(config)
    except (ValueError, HeraldError) as exc:
        print(f"heraldps scheduler: {exc}", file=sys.stderr)
        return 2


def _add_simulate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="count Herald's pulls and pushes per mode on a dataset (Table 1)",
        description="Run the scheduler core over a dataset in every mode and print Table 1.",
    )
    p.add_argument("--data", required=True, help="data file")
    p.add_argument("--format", default="criteo", choices=("criteo", "avazu", "csv"))
    p.add_argument(
        "--sparse-columns", default=None, help="comma-separated categorical columns (csv)"
    )
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch-size-per-worker", type=int, default=128)
    p.add_argument(
        "--cache-fraction",
        type=float,
        default=0.1,
        help="cache rows per worker = floor(fraction x distinct keys in the file)",
    )
    p.add_argument("--iterations", type=int, default=None, help="at most this many batches")
    p.add_argument("--json", default=None, help="write the counts here")
    p.set_defaults(run=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    from heraldps.datasets import read_dataset
    from heraldps.errors import HeraldError
    from scheduler_service.simulate import SimulationConfig, simulate, table, write_json

    columns = args.sparse_columns.split(",") if args.sparse_columns else None
    try:
        dataset = read_dataset(args.data, args.format, sparse_columns=columns)
        config = SimulationConfig(
            args.data, args.format, args.workers, args.batch_size_per_worker,
            args.cache_fraction, args.iterations,
        )  # fmt: skip
        result = simulate(dataset, config)
    except (ValueError, OSError, HeraldError) as exc:
        print(f"heraldps simulate: {exc}", file=sys.stderr)
        return 2
    c = result["config"]
    print(
        f"{c['rows']:,} rows, {c['distinct_keys']:,} distinct keys, {c['workers']} workers x "
        f"{c['batch_size_per_worker']} samples, cache {c['cache_rows']:,} rows per worker, "
        f"{result['modes']['naive']['iterations']} iterations"
    )
    print(table(result))
    if args.json:
        write_json(result, args.json)
    return 0


def _add_worker_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help="run one training worker (follows the scheduler's plans)",
        description="Run one worker: register, execute each plan (or train as HET), report.",
    )
    p.add_argument("--job", required=True, help="job JSON (as heraldps local writes it)")
    p.add_argument("--worker-id", type=int, required=True)
    p.add_argument("--scheduler", required=True, help="scheduler address host:port")
    p.add_argument("--ps", required=True, help="comma-separated PS shard addresses")
    p.add_argument("--report", default=None, help="write per-iteration traffic and loss here")
    p.add_argument("--timeout-seconds", type=float, default=120.0, help="deadline of each RPC")
    p.add_argument(
        "--prefetch", default=None, help="keyset file to load into the PS caches before training"
    )
    p.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus /metrics here (0: free)"
    )
    p.set_defaults(run=_run_worker)


def _run_worker(args: argparse.Namespace) -> int:
    from worker_client.worker import WorkerConfig, run_worker

    config = WorkerConfig(
        job=args.job, worker_id=args.worker_id, scheduler=args.scheduler,
        ps=_addresses(args.ps), report=args.report,
        timeout_seconds=args.timeout_seconds, prefetch=args.prefetch,
        metrics_port=args.metrics_port,
    )  # fmt: skip
    return run_worker(config)


def _add_keyset_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "keyset",
        help="write the keys of a data pass as a HugeCTR keyset file",
        description="Write the distinct keys of a data file (binary native-endian int64, no "
        "header: HugeCTR's keyset format) for Prefetch / heraldps worker --prefetch.",
    )
    p.add_argument("--data", required=True, help="data file of the pass")
    p.add_argument("--format", default="criteo", choices=("criteo", "avazu", "csv"))
    p.add_argument("--sparse-columns", default=None, help="comma-separated (csv)")
    p.add_argument("--out", required=True, help="keyset file to write")
    p.set_defaults(run=_run_keyset)


def _run_keyset(args: argparse.Namespace) -> int:
    from heraldps.client import write_keyset
    from heraldps.datasets import read_dataset
    from heraldps.errors import HeraldError

    columns = args.sparse_columns.split(",") if args.sparse_columns else None
    try:
        dataset = read_dataset(args.data, args.format, sparse_columns=columns)
        count = write_keyset(args.out, dataset.keys)
    except (ValueError, OSError, HeraldError) as exc:
        print(f"heraldps keyset: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count:,} keys to {args.out}")
    return 0


def _add_local_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "local",
        help="train a CTR model on a local cluster (shards, scheduler, workers), mode by mode",
        description="Start PS shards, the scheduler and workers on 127.0.0.1 and train each "
        "mode on the same batches; print traffic and quality per mode.",
    )
    p.add_argument("--data", default=None, help="training file (default: bundled Criteo sample)")
    p.add_argument("--eval-data", default=None, help="held-out file (default: bundled test "
                   "split, or the last --eval-fraction of --data)")  # fmt: skip
    p.add_argument("--eval-fraction", type=float, default=0.1)
    p.add_argument("--format", default="criteo", choices=("criteo", "avazu", "csv"))
    p.add_argument("--sparse-columns", default=None, help="comma-separated (csv)")
    p.add_argument("--label-column", default=None, help="label column (csv)")
    p.add_argument("--dense-columns", default=None, help="comma-separated numeric columns (csv)")
    p.add_argument("--modes", default="naive,on_demand,location_aware,herald,het")
    p.add_argument("--staleness", type=int, default=0, help="HET staleness bound s (het mode)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--batch-size-per-worker", type=int, default=128)
    p.add_argument("--iterations", type=int, default=None, help="at most this many batches")
    p.add_argument("--epochs", type=int, default=4, help="passes over the training data")
    p.add_argument(
        "--cache-fraction",
        type=float,
        default=0.1,
        help="cache rows per worker = floor(fraction x distinct training keys)",
    )
    p.add_argument("--optimizer", default="adagrad", choices=("sgd", "adagrad", "adam"))
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--embedding-dim", type=int, default=8)
    p.add_argument("--policy", default="lru", choices=("lru", "lfu"), help="HET cache policy")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu", "auto"))
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--plot", default=None, help="write traffic and loss curves here (PNG)")
    p.add_argument("--workdir", default=None, help="keep logs and reports here")
    p.add_argument(
        "--store",
        default="staged",
        choices=("staged", "cached"),
        help="PS shards in host memory (staged) or LMDB + host cache (cached)",
    )
    p.add_argument("--cache-gb", type=float, default=1.0, help="cached store: cache per table")
    p.set_defaults(run=_run_local)


def _run_local(args: argparse.Namespace) -> int:
    from heraldps.errors import HeraldError
    from worker_client.local_command import run_local_command

    try:
        return run_local_command(args)
    except (ValueError, OSError, HeraldError) as exc:
        print(f"heraldps local: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("heraldps local: interrupted; every process was stopped", file=sys.stderr)
        return 130


def _add_health_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "health",
        help="ask a heraldps process whether it is SERVING (exit 0) or not (exit 1)",
        description="Check the gRPC health service at ADDR once: exit 0 if it reports "
        "SERVING, 1 otherwise (not reachable, NOT_SERVING, unknown service), with the reason "
        "on stderr. Container healthchecks and probes run this.",
    )
    p.add_argument("address", metavar="ADDR", help="host:port of a PS shard or the scheduler")
    p.add_argument("--service", default="", help="service name to check (default: the server)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    p.set_defaults(run=_run_health)


def _run_health(args: argparse.Namespace) -> int:
    from heraldps.healthcheck import check

    health = check(args.address, args.service, args.timeout)
    print(health.message, file=sys.stdout if health.serving else sys.stderr)
    return 0 if health.serving else 1


def _add_feed_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "feed",
        help="create a job's tables and feed its batches to a running cluster (one-shot)",
        description="Wait for the PS shards and the scheduler, create the job's tables "
        "(idempotent), submit every global batch, Finish, and exit 0 once the scheduler "
        "has committed the last iteration.",
    )
    p.add_argument("--job", required=True, help="job JSON (data may be bundled:criteo_head8k)")
    p.add_argument("--scheduler", required=True, help="scheduler address host:port")
    p.add_argument("--ps", required=True, help="comma-separated PS shard addresses, in order")
    p.add_argument(
        "--timeout-seconds",
        type=float,
        default=300.0,
        help="wait this long for the services, per RPC, and for progress (default: %(default)s)",
    )
    p.add_argument("--metrics-port", type=int, default=None, help="serve /metrics here")
    p.set_defaults(run=_run_feed)


def _run_feed(args: argparse.Namespace) -> int:
    import grpc

    from heraldps.errors import HeraldError
    from worker_client.feed import FeedConfig, run_feed

    config = FeedConfig(
        job=args.job, scheduler=args.scheduler, ps=_addresses(args.ps),
        timeout_seconds=args.timeout_seconds, metrics_port=args.metrics_port,
    )  # fmt: skip
    try:
        run_feed(config)
    except (ValueError, OSError, HeraldError) as exc:
        print(f"heraldps feed: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as err:
        code = err.code().name if hasattr(err, "code") else "error"
        details = err.details() if hasattr(err, "details") else str(err)
        print(f"heraldps feed: an RPC failed: {code} {details}", file=sys.stderr)
        return 1
    print(f"heraldps feed: every iteration of {args.job} committed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = EnvArgumentParser(
        prog="heraldps",
        description="heraldps: a parameter-server cluster for embedding models. Every flag "
        "--some-flag can also come from the environment variable HERALDPS_SOME_FLAG; the "
        "command line wins.",
    )
    parser.add_argument("--version", action="version", version=f"heraldps {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default: %(default)s)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_ps_parser(sub)
    _add_scheduler_parser(sub)
    _add_simulate_parser(sub)
    _add_worker_parser(sub)
    _add_keyset_parser(sub)
    _add_local_parser(sub)
    _add_health_parser(sub)
    _add_feed_parser(sub)
    mention_env(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    tune_malloc()
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
