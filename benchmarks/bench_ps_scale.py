"""One PS shard at tens of millions of rows: memory per row, pull and commit rows/s.

Run from the repository root (one size at a time needs about 180 bytes per row
of free memory for a Staged shard: 9 GB at 50M rows)::

    python benchmarks/bench_ps_scale.py                          # 1M and 10M rows
    python benchmarks/bench_ps_scale.py --rows 1000000 10000000 50000000
    python benchmarks/bench_ps_scale.py --store cached --rows 1000000 50000000
    python benchmarks/bench_ps_scale.py --expected-rows          # tables sized up front
    python benchmarks/bench_ps_scale.py --rows 1000000 50000000 --dim 64 --optimizer sgd

For each size N, a fresh shard is started with the real CLI (``python -m
launcher ps``) in its own process, with one table (``--dim``, default 16;
``--optimizer``, default AdaGrad) after a tiny warm-up table. N rows are
created (Staged: the client pulls 524,288 new keys at a time; Cached: by
default written into the shard's LMDB in key order before it starts,
``bulk_fill_cached``, or with ``--cached-fill commits`` pushed and committed
through the shard), then, with every row present:

- resident bytes per row (Staged, and Cached filled by commits): the shard's RSS
  after filling minus before, over N, against the ideal (dim 16 AdaGrad: 144
  bytes = values 64 + state 64 + version 8 + key 8); its peak RSS (``VmHWM``)
  the same way shows what growing cost;
- pull: 65,536 distinct keys drawn at random from all N rows (a new draw for
  every call), through ``PSClient``, alternating call by call with a raw gRPC echo of the same
  bytes (a prebuilt answer of 65,536 x (dim x 4 + 8) bytes, as in
  ``bench_ps.py``): median rows/s of each and their ratio;
- commit: push of 65,536 random present keys' gradients to iteration t, then
  commit(t): median rows/s;
- Cached only: the LMDB files' size on disk per row, after the commits.

Keys are ``splitmix64(i)`` for i < N (distinct, spread like hashed features),
so the client holds no key list. Rates are medians over ``--rounds`` rounds
(default 24); the table also gives each rate over the same shard's at the
smallest N of the run. Results go to ``benchmarks/results/bench_ps_scale.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from heraldps.runtime import tune_malloc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_ps import (  # noqa: E402  (after the path: run as a script)
    cpu_model,
    exit_on_sigterm,
    measure_alternating,
    running,
    spread,
    wait_for_port_file,
)

DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "bench_ps_scale.json"
BATCH = 65_536
FILL_BATCH = 524_288
BULK_FILL_BATCH = 1_048_576
WARMUP_ROUNDS = 3
TABLE = "scale"
ECHO_METHOD = "/heraldps.bench.Echo/Pull"
MAX_MESSAGE_MB = 64
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def keys_of(counters: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``splitmix64(i)`` of each counter: distinct keys for distinct counters."""
    with np.errstate(over="ignore"):
        z = counters.astype(np.uint64) * GOLDEN + GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z.view(np.int64)


def random_present(rows: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``BATCH`` distinct keys drawn at random from the ``rows`` present ones."""
    counters = np.unique(rng.integers(0, rows, BATCH + BATCH // 4))
    return keys_of(rng.permutation(counters)[:BATCH])


# ----- processes ----------------------------------------------------------------------


def rss(pid: int) -> tuple[int, int]:
    """(resident, peak resident) bytes of process ``pid``."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def huge_pages(pid: int, least: int = 64 * 2**20) -> tuple[int, int]:
    """(resident bytes, of which on transparent huge pages) of process ``pid``'s mappings of
    ``least`` bytes or more: the table's records and index (``/proc/<pid>/smaps``)."""
    resident = huge = 0
    size = 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "Size":
            size = int(value.split()[0]) * 1024
        elif name == "Rss" and size >= least:
            resident += int(value.split()[0]) * 1024
        elif name == "AnonHugePages" and size >= least:
            huge += int(value.split()[0]) * 1024
    return resident, huge


@contextlib.contextmanager
def shard(
    workdir: Path, store: str, expected_rows: int, prepare: Callable[[Path], None] | None = None
) -> Iterator[tuple[str, int]]:
    """A fresh PS shard started with the CLI; yields (address, pid). ``prepare``: called
    with a Cached shard's (emptied) data directory before the shard starts."""
    port_file = workdir / "ps.port"
    port_file.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "launcher", "ps", "--host", "127.0.0.1", "--port", "0",
        "--port-file", str(port_file), "--store", store, "--expected-rows", str(expected_rows),
        "--max-message-mb", str(MAX_MESSAGE_MB),
    ]  # fmt: skip
    if store == "cached":
        data = workdir / "lmdb"
        shutil.rmtree(data, ignore_errors=True)
        if prepare is not None:
            prepare(data)
        command += ["--data-dir", str(data), "--cache-gb", "1", "--durability", "periodic"]
    log = workdir / "ps.log"
    with running(command, log) as proc:
        yield f"127.0.0.1:{wait_for_port_file(port_file, proc, log)}", proc.pid


def serve_echo(port_file: Path, dim: int) -> int:
    """Answer every call with one prebuilt payload the size of the pull's answer."""
    tune_malloc()
    from heraldps.serving import channel_options

    payload = np.random.default_rng(0).bytes(response_bytes(dim))
    handler = grpc.method_handlers_generic_handler(
        "heraldps.bench.Echo",
        {"Pull": grpc.unary_unary_rpc_method_handler(lambda request, context: payload)},
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16),
        handlers=[handler],
        options=channel_options(MAX_MESSAGE_MB * 2**20),
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    port_file.write_text(f"{port}\n")
    stop.wait()
    server.stop(1.0).wait()
    return 0


@contextlib.contextmanager
def echo_server(workdir: Path, dim: int) -> Iterator[str]:
    port_file = workdir / "echo.port"
    port_file.unlink(missing_ok=True)
    log = workdir / "echo.log"
    here = str(Path(__file__).resolve())
    command = [sys.executable, here, "--serve-echo", str(port_file), "--dim", str(dim)]
    with running(command, log) as proc:
        yield f"127.0.0.1:{wait_for_port_file(port_file, proc, log)}"


# ----- one size -------------------------------------------------------------------------


@dataclass
class SizeResult:
    rows: int
    store: str
    dim: int
    optimizer: str
    expected_rows: int
    fill_seconds: float
    rss_before: int
    rss_after: int
    peak_rss: int
    bytes_per_row: float
    peak_bytes_per_row: float
    accounted_bytes_per_row: float
    pull_seconds: list[float]
    echo_seconds: list[float]
    commit_seconds: list[float]
    disk_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ideal(self) -> int:
        return ideal_row_bytes(self.dim, self.optimizer)

    @property
    def pull_rows_per_s(self) -> float:
        return BATCH / statistics.median(self.pull_seconds)

    @property
    def echo_rows_per_s(self) -> float:
        return BATCH / statistics.median(self.echo_seconds)

    @property
    def commit_rows_per_s(self) -> float:
        return BATCH / statistics.median(self.commit_seconds)


def ideal_row_bytes(dim: int, optimizer: str) -> int:
    """Values, optimizer state (AdaGrad: one accumulator per value), version, key."""
    return 4 * dim * (2 if optimizer == "adagrad" else 1) + 8 + 8


def response_bytes(dim: int) -> int:
    """A pull's answer: values and versions of ``BATCH`` rows."""
    return BATCH * (4 * dim + 8)


def warm_up(client: Any, optimizer: Any, dim: int) -> None:
    """Load the shard's compiled kernels with a tiny table before the baseline RSS."""
    client.create_table("warmup", dim, optimizer)
    keys = np.arange(4096, dtype=np.int64)
    client.pull("warmup", keys)
    client.push_gradients("warmup", keys, np.ones((4096, dim), np.float32), iteration=0)
    client.commit(0)
    client.pull("warmup", keys)


def bulk_fill_cached(data_dir: Path, rows: int, dim: int, optimizer: Any) -> float:
    """Write rows ``0..rows-1`` straight into a Cached shard's LMDB, before the shard
    starts, in key order: what a table of the same spec holds after a pull of every key
    (version 0, never changed, initial values and state). Returns seconds.

    Filling 50M rows by push and commit runs at about 50k rows/s (each commit rewrites
    random B-tree pages): over 15 minutes. In key order LMDB writes its pages one after
    another, so pages end nearly full (about 24 rows of dim 16 with AdaGrad per 4 KiB
    page, against about 17 after random inserts): the file is smaller than one a
    training run grows, which slightly favours reads."""
    from heraldps.spec import TableSpec
    from ps_server.cached_store import CachedStore

    started = time.perf_counter()
    spec = TableSpec(TABLE, dim, optimizer=optimizer)
    store = CachedStore(data_dir, durability="periodic")
    try:
        table, _ = store.create_table(spec)
        ordered = np.sort(keys_of(np.arange(rows, dtype=np.int64)).view(np.uint64)).view(np.int64)
        for start in range(0, rows, BULK_FILL_BATCH):
            keys = ordered[start : start + BULK_FILL_BATCH]
            n = keys.shape[0]
            with store.env.begin(write=True) as txn:
                table.disk.put(
                    txn, keys, np.zeros(n, np.int64), np.full(n, -1, np.int64),
                    spec.initializer.generate(keys, dim), optimizer.init_state(n, dim),
                )  # fmt: skip
            if start and start % (10 * BULK_FILL_BATCH) == 0:
                print(f"  {start:,} rows ({time.perf_counter() - started:.0f}s)", file=sys.stderr)
    finally:
        store.close()
    return time.perf_counter() - started


def fill(client: Any, rows: int, store: str, dim: int, optimizer: Any) -> float:
    """Create rows ``0..rows-1``; returns seconds. Cached: commit them, so LMDB holds them."""
    client.create_table(TABLE, dim, optimizer)
    started = time.perf_counter()
    batch = FILL_BATCH if store == "staged" else FILL_BATCH // 2
    grads = np.full((batch, dim), 1e-3, dtype=np.float32)
    first = client.committed_iteration() + 1
    for it, start in enumerate(range(0, rows, batch)):
        keys = keys_of(np.arange(start, min(start + batch, rows), dtype=np.int64))
        if store == "staged":
            client.pull(TABLE, keys)
        else:
            client.push_gradients(TABLE, keys, grads[: keys.shape[0]], iteration=first + it)
            client.commit(first + it)
        if start and start % (10 * batch) == 0:
            print(f"  {start:,} rows ({time.perf_counter() - started:.0f}s)", file=sys.stderr)
    seconds = time.perf_counter() - started
    got = client.describe_table(TABLE).rows
    if got != rows:
        raise RuntimeError(f"the shard holds {got} rows after filling, expected {rows}")
    return seconds


def measure_size(
    rows: int, args: argparse.Namespace, expected_rows: int, workdir: Path
) -> SizeResult:
    from heraldps.client import PSClient
    from heraldps.optim import SGD, AdaGrad
    from heraldps.serving import channel_options

    store, rounds, dim = args.store, args.rounds, args.dim
    optimizer = AdaGrad(lr=0.01) if args.optimizer == "adagrad" else SGD(lr=0.01)
    rng = np.random.default_rng(rows)
    bulk = store == "cached" and args.cached_fill == "bulk"
    bulk_seconds = [0.0]

    def prepare(data: Path) -> None:
        bulk_seconds[0] = bulk_fill_cached(data, rows, dim, optimizer)

    with contextlib.ExitStack() as stack:
        address, pid = stack.enter_context(
            shard(workdir, store, expected_rows, prepare if bulk else None)
        )
        echo = stack.enter_context(echo_server(workdir, dim))
        client = stack.enter_context(PSClient([address], max_message_mb=MAX_MESSAGE_MB))
        client.wait_ready()
        warm_up(client, optimizer, dim)
        time.sleep(3)  # the shard trims freed call buffers once calls stop (heraldps.malloc)
        before, _ = rss(pid)
        if bulk:
            client.create_table(TABLE, dim, optimizer)  # a no-op: the same spec exists
            if client.describe_table(TABLE).rows != rows:
                raise RuntimeError(f"the bulk-filled shard does not hold {rows} rows")
            seconds = bulk_seconds[0]
        else:
            seconds = fill(client, rows, store, dim, optimizer)
        time.sleep(3)
        after, peak = rss(pid)
        big_resident, big_huge = huge_pages(pid)
        accounted = client.describe_table(TABLE).bytes
        channel = stack.enter_context(
            grpc.insecure_channel(echo, options=channel_options(MAX_MESSAGE_MB * 2**20))
        )
        echo_call = channel.unary_unary(ECHO_METHOD)
        # A fresh draw for every pull: a Cached shard's cache then holds what it would
        # for random keys (a few sets in turn would all sit in its cache after one round).
        key_sets = [random_present(rows, rng) for _ in range(rounds + WARMUP_ROUNDS)]
        requests = [k.tobytes() for k in key_sets]
        turn = [0]

        def pull() -> None:
            turn[0] += 1
            values, _ = client.pull(TABLE, key_sets[turn[0] % len(key_sets)])
            assert values.shape == (BATCH, dim)

        def echo_pull() -> None:
            answer = echo_call(requests[turn[0] % len(requests)], timeout=60)
            assert len(answer) == response_bytes(dim)

        timed = measure_alternating({"pull": pull, "echo": echo_pull}, rounds, WARMUP_ROUNDS)
        grads = rng.standard_normal((BATCH, dim), dtype=np.float32) * 1e-3
        base = client.committed_iteration() + 1
        commits = []
        for r in range(rounds + 2):
            keys = random_present(rows, rng)
            started = time.perf_counter()
            client.push_gradients(TABLE, keys, grads, iteration=base + r)
            client.commit(base + r)
            commits.append(time.perf_counter() - started)
        disk = None
        if store == "cached":
            disk = sum(f.stat().st_size for f in (workdir / "lmdb").rglob("*") if f.is_file())
        if bulk:  # the rows never passed through the shard's memory: nothing to compare
            before = after = peak = 0
    return SizeResult(
        rows, store, dim, args.optimizer, expected_rows, seconds, before, after, peak,
        (after - before) / rows, (peak - before) / rows, accounted / rows,
        timed["pull"], timed["echo"], commits[2:], disk,
        {"big_mappings_resident": big_resident, "big_mappings_huge_pages": big_huge},
    )  # fmt: skip


# ----- report ---------------------------------------------------------------------------


def markdown(results: list[SizeResult], load: str) -> str:
    first = results[0]
    lines = [
        f"| rows | store | RSS bytes/row (peak) | vs ideal {first.ideal} | pull rows/s | vs "
        f"{first.rows:,} | echo rows/s | pull/echo | commit rows/s | vs {first.rows:,} "
        "| fill s | disk bytes/row |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        disk = f"{r.disk_bytes / r.rows:.0f}" if r.disk_bytes is not None else "-"
        memory, ratio = "-", "-"
        if r.rss_after:
            memory = f"{r.bytes_per_row:.0f} ({r.peak_bytes_per_row:.0f})"
            ratio = f"{r.bytes_per_row / r.ideal:.2f}"
        lines.append(
            f"| {r.rows:,} | {r.store}{' sized' if r.expected_rows else ''} "
            f"| {memory} | {ratio} "
            f"| {r.pull_rows_per_s / 1e6:.2f}M | {r.pull_rows_per_s / first.pull_rows_per_s:.2f} "
            f"| {r.echo_rows_per_s / 1e6:.2f}M "
            f"| {statistics.median(r.echo_seconds) / statistics.median(r.pull_seconds):.2f} "
            f"| {r.commit_rows_per_s / 1e6:.2f}M "
            f"| {r.commit_rows_per_s / first.commit_rows_per_s:.2f} | {r.fill_seconds:.0f} "
            f"| {disk} |"
        )
    lines += ["", "Call times (median, quartiles, range):"]
    for r in results:
        lines += [
            f"- {r.rows:,} rows: pull {spread(r.pull_seconds)}; echo {spread(r.echo_seconds)}; "
            f"push + commit {spread(r.commit_seconds)}"
        ]
    lines += ["", "The shard's mappings of 64 MiB or more (table records, index) after filling:"]
    for r in results:
        resident = r.extra.get("big_mappings_resident", 0)
        huge = r.extra.get("big_mappings_huge_pages", 0)
        share = f" ({huge / resident:.0%} on huge pages)" if resident else ""
        lines.append(f"- {r.rows:,} rows: {resident / 2**20:,.0f} MiB resident{share}")
    lines += [
        "",
        f"Table: dim {first.dim}, {first.optimizer}; ideal row {first.ideal} bytes (values, "
        "state, version 8, key 8). Peak: the shard's VmHWM while filling.",
        f"Machine: {cpu_model()}, {os.cpu_count()} CPUs; load before the run: {load}.",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[1_000_000, 10_000_000],
        help="table sizes, each in a fresh shard (default 1M 10M)",
    )  # fmt: skip
    parser.add_argument("--store", choices=("staged", "cached"), default="staged")
    parser.add_argument(
        "--cached-fill", choices=("bulk", "commits"), default="bulk",
        help="how a Cached shard gets its rows: bulk (written into its LMDB in key order "
        "before it starts; default) or commits (push + commit through the shard: about "
        "50k rows/s)",
    )  # fmt: skip
    parser.add_argument(
        "--expected-rows", action="store_true",
        help="start each shard with --expected-rows N (sized up front, no growth)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=24, help="timed rounds (default 24)")
    parser.add_argument("--dim", type=int, default=16, help="row width (default 16)")
    parser.add_argument(
        "--optimizer", choices=("adagrad", "sgd"), default="adagrad",
        help="adagrad (a state row as wide as the value; default) or sgd (no state)",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON result file")
    parser.add_argument("--serve-echo", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if any(n < BATCH for n in args.rows):
        parser.error(f"--rows must each be >= {BATCH:,} (one pull's keys)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_echo is not None:
        return serve_echo(args.serve_echo, args.dim)
    tune_malloc()
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    load = Path("/proc/loadavg").read_text().split()[:3]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_ps_scale.") as workdir:
        for rows in args.rows:
            print(f"{args.store} shard, {rows:,} rows ...", file=sys.stderr)
            expected = rows if args.expected_rows else 0
            results.append(measure_size(rows, args, expected, Path(workdir)))
    text = markdown(results, " ".join(load))
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"load": load, "results": [asdict(r) for r in results]}, indent=2) + "\n"
    )
    print(f"\nWrote {args.output}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
