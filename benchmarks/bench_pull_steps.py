"""Where a pull's time goes, step by step, in one process (no gRPC, no second process).

Run from the repository root::

    python benchmarks/bench_pull_steps.py --rows 1000000                   # dim 16, AdaGrad
    python benchmarks/bench_pull_steps.py --rows 1000000 --dim 64 --optimizer sgd
    python benchmarks/bench_pull_steps.py --rows 50000000                  # 9 GB of memory

A Staged table (``ps_server.table.StagedTable``, as a shard holds it) is filled
with N rows (keys ``splitmix64(i)``, as ``bench_ps_scale.py``), then each step of
a pull of 65,536 distinct keys drawn at random from all N rows is timed on its
own, the steps alternating call by call (order rotated every round), medians and
quartiles of ``--rounds`` rounds (default 24). The steps:

- server: ``lookup`` (keys -> rows, the index), ``message`` (allocating the
  serialized answer, ``PullResponseBuffer``), ``gather`` (rows into the
  message), each on one core and split over the cores (``ps_server.parallel``),
  and ``pull_into`` (lookup, gather and their checks, as the handler calls them);
- client: ``decode + place`` (parsing the answer, copying each payload into the
  caller's arrays, as ``PSClient`` does for one shard).

Wall time (``perf_counter``): the split steps run on several threads. On a
loaded machine the medians move; compare steps of the same run only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from heraldps.runtime import tune_malloc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_ps_scale import BATCH, FILL_BATCH, keys_of, random_present  # noqa: E402

DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "bench_pull_steps.json"


@contextlib.contextmanager
def one_part() -> Iterator[None]:
    """Kernels on the calling thread only, as before ``ps_server.parallel``."""
    from ps_server import parallel

    saved, parallel.THREADS = parallel.THREADS, 1
    try:
        yield
    finally:
        parallel.THREADS = saved


def steps(rows: int, dim: int, optimizer: str) -> dict[str, Callable[[int], object]]:
    """The timed steps, each called with the round's key-set number."""
    from heraldps import wire
    from heraldps.client.assemble import place
    from heraldps.optim import SGD, AdaGrad
    from heraldps.spec import TableSpec
    from ps_server.kernels import gather_pull
    from ps_server.memory import MemoryBudget
    from ps_server.pull_response import VALUES, VERSIONS, PullResponseBuffer
    from ps_server.table import StagedTable

    spec = TableSpec("t", dim, optimizer=AdaGrad() if optimizer == "adagrad" else SGD(lr=0.01))
    table = StagedTable(spec, MemoryBudget(), 0)
    started = time.perf_counter()
    for start in range(0, rows, FILL_BATCH):
        table.pull(keys_of(np.arange(start, min(start + FILL_BATCH, rows))), with_state=False)
    print(f"  filled {rows:,} rows in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    rng = np.random.default_rng(rows)
    key_sets = [random_present(rows, rng) for _ in range(8)]
    row_sets = [table._index.lookup(keys) for keys in key_sets]
    answers = []
    for keys in key_sets:
        buffer = PullResponseBuffer(keys.shape[0], dim, 0)
        table.pull_into(keys, buffer.values, buffer.versions, buffer.state)
        answers.append(buffer.message)
    records = table._records.array
    floats = records.view(np.float32)
    values = np.empty((BATCH, dim), dtype=np.float32)
    versions = np.empty(BATCH, dtype=np.int64)

    def lookup(i: int) -> object:
        return table._index.lookup(key_sets[i])

    def lookup_one_core(i: int) -> object:
        with one_part():
            return lookup(i)

    def message(i: int) -> object:
        return PullResponseBuffer(BATCH, dim, 0)

    def gather(i: int) -> object:
        buffer = PullResponseBuffer(BATCH, dim, 0)
        rows_ = row_sets[i]
        from ps_server.parallel import in_parts

        def part(lo: int, hi: int) -> None:
            s = slice(lo, hi)
            gather_pull(records, floats, rows_[s], buffer.values[s], buffer.state[s],
                        buffer.versions[s])  # fmt: skip

        in_parts(BATCH, part)
        return buffer

    def gather_one_core(i: int) -> object:
        with one_part():
            return gather(i)

    def pull_into(i: int) -> object:
        buffer = PullResponseBuffer(BATCH, dim, 0)
        table.pull_into(key_sets[i], buffer.values, buffer.versions, buffer.state)
        return buffer

    def pull_into_one_core(i: int) -> object:
        with one_part():
            return pull_into(i)

    def decode_place(i: int) -> object:
        fields = wire.decode_message(answers[i])
        got = wire.decode_rows(wire.len_field(fields, VALUES), BATCH, dim, "values",
                               check_finite=False)  # fmt: skip
        place(values, slice(0, BATCH), got)
        place(versions, slice(0, BATCH), wire.decode_keys(wire.len_field(fields, VERSIONS)))
        return values

    return {
        "lookup": lookup,
        "lookup, one core": lookup_one_core,
        "message": message,
        "gather": gather,
        "gather, one core": gather_one_core,
        "pull_into": pull_into,
        "pull_into, one core": pull_into_one_core,
        "client decode + place": decode_place,
    }


def measure(calls: dict[str, Callable[[int], object]], rounds: int) -> dict[str, list[float]]:
    names = list(calls)
    for name in names:  # warm up (and compile)
        calls[name](0)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            started = time.perf_counter()
            calls[name](r % 8)
            seconds[name].append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--optimizer", choices=("adagrad", "sgd"), default="adagrad")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.rows < BATCH:
        parser.error(f"--rows must be >= {BATCH:,}")
    tune_malloc()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    seconds = measure(steps(args.rows, args.dim, args.optimizer), args.rounds)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(f"| step ({args.rows:,} rows, dim {args.dim}, {args.optimizer}) | median ms | "
          "quartiles ms |")  # fmt: skip
    print("|---|---:|---:|")
    for name, times in seconds.items():
        q1, q3 = (float(np.percentile(times, q)) * 1e3 for q in (25, 75))
        print(f"| {name} | {statistics.median(times) * 1e3:.2f} | {q1:.2f}-{q3:.2f} |")
    print(f"\nLoad average before {' '.join(load_before)}, after {' '.join(load_after)}.")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "rows": args.rows, "dim": args.dim, "optimizer": args.optimizer,
        "load_before": load_before, "load_after": load_after, "seconds": seconds,
    }, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
