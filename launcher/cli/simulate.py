"""``heraldps simulate``: Herald's Table 1 for a data file, from the real scheduler core."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from heraldps.modes import MAX_WORKERS
from launcher.cli.command import (
    Command,
    add_early_write_back_argument,
    add_look_ahead_argument,
    at_least,
    fraction,
    names,
)
from launcher.cli.data import add_data_arguments

if TYPE_CHECKING:
    from heraldps.data import DataProfile


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
    add_early_write_back_argument(p)
    add_look_ahead_argument(p, several=True)
    p.add_argument("--json", default=None, help="write the counts here")


def run(args: argparse.Namespace) -> int:
    from heraldps.data.global_batches import MiniBatchSizes, StreamedBatches
    from heraldps.errors import CacheTooSmall
    from launcher.cli.data import first_pass, spec_of
    from launcher.preflight import cache_error, check_cache, check_columns
    from scheduler_service.scheduler import MODES
    from scheduler_service.simulate import (
        SimulationConfig,
        early_line,
        plan_groups,
        runs,
        simulate,
        table,
        write_json,
    )

    columns = names(args.sparse_columns)
    check_columns(args.data, args.format, columns)
    spec = spec_of(args)
    # One first pass: every row checked, the distinct keys counted and each mini-batch's
    # distinct keys measured (the cache check), so no pass of its own before planning.
    sizes = MiniBatchSizes(args.workers, args.batch_size_per_worker)
    profile = first_pass(spec, on_chunk=sizes)
    config = SimulationConfig(
        args.data, args.format, args.workers, args.batch_size_per_worker,
        args.cache_fraction, args.iterations, args.early_write_back, args.look_ahead,
    )  # fmt: skip
    batches = StreamedBatches(spec, profile.rows, args.workers * args.batch_size_per_worker,
                              args.iterations)  # fmt: skip
    capacity = config.cache_rows(profile.total_distinct_keys)
    check_cache(batches, args.workers, args.batch_size_per_worker, capacity, args.iterations, (),
                distinct_keys=profile.total_distinct_keys, sizes=sizes)  # fmt: skip
    reads = len(plan_groups(list(MODES))) * len(config.look_ahead)
    planned: list[str] = []  # the groups (and look-aheads) read so far, in order
    started = last = time.monotonic()

    def progress(modes: str, done: int, total: int) -> None:
        nonlocal last
        if modes not in planned:
            planned.append(modes)
        now = time.monotonic()
        if now - last >= 5 or (done == total and now - started >= 5):
            last = now
            read = planned.index(modes) + 1
            print(f"planning {modes.replace('/', ' and ')} (read {read} of {reads} of the "
                  f"data): batch {done:,} of {total:,}", file=sys.stderr, flush=True)  # fmt: skip

    try:
        result = simulate(batches, config, profile.total_distinct_keys, progress)
    except CacheTooSmall as exc:
        where = " with location-aware assignment"
        raise cache_error(profile.total_distinct_keys, exc.needed, capacity, where) from None
    result["fields"] = field_counts(profile)
    c = result["config"]
    print(
        f"{c['rows']:,} rows, {c['distinct_keys']:,} distinct keys, {c['workers']} workers x "
        f"{c['batch_size_per_worker']} samples, cache {c['cache_rows']:,} rows per worker, "
        f"{runs(result)[0]['modes']['naive']['iterations']} iterations"
    )
    print(collision_line(result["fields"]))
    print(table(result))
    early = early_line(result)
    if early is not None:
        print(early)
    if args.json:
        write_json(result, args.json)
    return 0


def field_counts(profile: DataProfile) -> list[dict[str, object]]:
    """Per sparse column: distinct values and distinct keys (equal unless keys collide)."""
    counts = zip(profile.fields, profile.distinct_values, profile.distinct_keys, strict=True)
    return [{"column": f, "distinct_values": v, "distinct_keys": k} for f, v, k in counts]


def collision_line(fields: list[dict[str, object]]) -> str:
    """One line: the key hash's collisions, field by field (none expected: 64-bit keys)."""
    collided = [f for f in fields if f["distinct_values"] != f["distinct_keys"]]
    values = sum(int(str(f["distinct_values"])) for f in fields)
    if not collided:
        return f"keys: {values:,} distinct values in {len(fields)} fields, no collisions"
    listed = ", ".join(
        f"{f['column']} ({f['distinct_values']:,} values, {f['distinct_keys']:,} keys)"
        for f in collided
    )
    return f"keys: COLLISIONS in {listed}"


COMMAND = Command(
    name="simulate",
    help="count Herald's pulls and pushes per mode on a data file (Table 1), no cluster",
    description="Run the scheduler core over a data file in every mode and print Herald's "
    "Table 1: rows pulled and pushed per mode, and their ratios to naive.",
    add_arguments=add_arguments,
    run=run,
)
