"""``heraldps simulate``: Herald's Table 1 for a data file, from the real scheduler core."""

from __future__ import annotations

import argparse

from heraldps.modes import MAX_WORKERS
from launcher.cli.command import Command, at_least, fraction, names
from launcher.cli.data import add_data_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    p.add_argument("--workers", type=at_least(1, MAX_WORKERS), default=8, help="workers N")
    p.add_argument(
        "--batch-size-per-worker", type=at_least(1), default=128, help="samples per worker"
    )
    p.add_argument(
        "--cache-fraction",
        type=fraction,
        default=0.1,
        help="cache rows per worker = floor(fraction x distinct keys in the file), 0 < f <= 1",
    )
    p.add_argument("--iterations", type=at_least(1), default=None, help="at most this many batches")
    p.add_argument("--json", default=None, help="write the counts here")


def run(args: argparse.Namespace) -> int:
    from heraldps.datasets import read_dataset
    from heraldps.errors import CacheTooSmall
    from launcher.preflight import cache_error, check_cache, check_columns
    from scheduler_service.simulate import (
        SimulationConfig,
        early_line,
        simulate,
        table,
        write_json,
    )

    columns = names(args.sparse_columns)
    check_columns(args.data, args.format, columns)
    dataset = read_dataset(args.data, args.format, sparse_columns=columns)
    config = SimulationConfig(
        args.data, args.format, args.workers, args.batch_size_per_worker,
        args.cache_fraction, args.iterations,
    )  # fmt: skip
    capacity = config.cache_rows(dataset)
    check_cache(dataset, args.workers, args.batch_size_per_worker, capacity, args.iterations, ())
    try:
        result = simulate(dataset, config)
    except CacheTooSmall as exc:
        where = " with location-aware assignment"
        raise cache_error(dataset, exc.needed, capacity, where) from None
    c = result["config"]
    print(
        f"{c['rows']:,} rows, {c['distinct_keys']:,} distinct keys, {c['workers']} workers x "
        f"{c['batch_size_per_worker']} samples, cache {c['cache_rows']:,} rows per worker, "
        f"{result['modes']['naive']['iterations']} iterations"
    )
    print(table(result))
    early = early_line(result)
    if early is not None:
        print(early)
    if args.json:
        write_json(result, args.json)
    return 0


COMMAND = Command(
    name="simulate",
    help="count Herald's pulls and pushes per mode on a data file (Table 1), no cluster",
    description="Run the scheduler core over a data file in every mode and print Herald's "
    "Table 1: rows pulled and pushed per mode, and their ratios to naive.",
    add_arguments=add_arguments,
    run=run,
)
