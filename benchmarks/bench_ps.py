"""Throughput and memory benchmark of one heraldps PS shard, against two baselines.

Run from the repository root::

    python benchmarks/bench_ps.py            # full run (about 2 minutes on 2 cores)
    python benchmarks/bench_ps.py --quick    # short smoke run
    python benchmarks/bench_ps.py --rounds 15

It prints a markdown table and writes every number to
``benchmarks/results/bench_ps.json``. What is measured:

1. Pull of 65,536 distinct existing keys, drawn at random from a table of
   ``--table-rows`` rows (default 1M; dim 64, AdaGrad), through ``PSClient``
   from one shard started with the real CLI (``python -m launcher ps``) in its
   own process: pulls/s, rows/s, MB/s.
2. Baseline (a), the wire ceiling: a minimal generic-handler gRPC server in
   its own process answers a 512 KiB request with a prebuilt ``bytes`` payload
   the size of our Pull response (65,536 * (64 * 4 + 8) bytes), same channel
   options, no decoding on either side (a raw unary echo of the same bytes).
   Target: ours/raw >= 0.6.
3. Baseline (b): ``MGET`` of the same 65,536 rows from a local
   ``redis-server`` (each value: the 256-byte float32 row followed by the
   8-byte int64 version, 264 bytes), decoded into float32 ``[65536, 64]`` and
   int64 ``[65536]`` arrays like our pull. Target: ours/Redis >= 4. Skipped
   if ``redis-server`` or the ``redis`` package is missing (it is a benchmark
   dependency only).
4. Push of 65,536 distinct gradients to iteration t, then commit(t)
   (AdaGrad): iterations/s and rows/s.
5. ``KeyIndex.lookup`` of 65,536 random present keys in an index of 1M keys,
   in process, one core. Target: >= 20M keys/s.
6. Resident bytes per row of 1M rows (dim 64, AdaGrad) in a fresh process,
   rows created by ``StagedStore.pull`` without gRPC, against the ideal
   8 (key) + 8 (version) + 256 (values) + 256 (AdaGrad state) = 528 bytes.
   Target: ratio <= 1.25.

Pulls are timed call by call, the systems alternating: each of ``--pull-rounds``
rounds (default 24) calls every system once, in an order rotated every round,
so drift and noise on a shared machine hit them alike; the table gives the
median, and the spread (quartiles, min..max, and the per-round ratio) is
printed below it. Timing each system in its own phase and keeping the best
round read the same code anywhere from 0.23x to 1.19x the raw ceiling on our
2-core machine. Other rates are medians over rounds (warm-up excluded).
MB is 10**6 bytes of response payload (values + versions).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
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
DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "bench_ps.json"

BATCH = 65_536
DIM = 64
INDEX_KEYS = 1_000_000
MEMORY_ROWS = 1_000_000
TABLE_ROWS = 1_000_000
PULL_ROUNDS = 24
KEY_SETS = 8  # pulls rotate over this many random key sets (no one set stays in cache)
MAX_MESSAGE_BYTES = 64 * 2**20
ROW_PAYLOAD = DIM * 4 + 8  # float32 values + int64 version
RESPONSE_BYTES = BATCH * ROW_PAYLOAD  # 65,536*64*4 + 65,536*8
REQUEST_BYTES = BATCH * 8
IDEAL_ROW_BYTES = 8 + 8 + DIM * 4 + DIM * 4  # key, version, values, AdaGrad accumulator
TABLE = "bench"
RAW_METHOD = "/heraldps.bench.Raw/Pull"

TARGET_RAW_RATIO = 0.6
TARGET_REDIS_RATIO = 4.0
TARGET_LOOKUP_KEYS_PER_S = 20e6
TARGET_MEMORY_RATIO = 1.25


@dataclass(frozen=True)
class Settings:
    rounds: int
    round_seconds: float
    warmup_calls: int
    memory_rows: int
    pull_rounds: int = PULL_ROUNDS
    table_rows: int = TABLE_ROWS
    compare_tree: Path | None = None


@dataclass
class Row:
    """One line of the result table."""

    metric: str
    ours: float | None
    baseline: float | None = None
    baseline_name: str = ""
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None
    unit: str = ""
    note: str = ""


@dataclass
class Results:
    machine: dict[str, Any]
    settings: dict[str, Any]
    measurements: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)


# ----- timing -------------------------------------------------------------------


def timed_round(call: Callable[[], object], min_seconds: float) -> float:
    """Calls per second of ``call`` over one round of at least ``min_seconds``."""
    count = 0
    started = time.perf_counter()
    while True:
        call()
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return count / elapsed


def warm_up(call: Callable[[], object], times: int) -> None:
    for _ in range(times):
        call()


def measure(call: Callable[[], object], settings: Settings) -> list[float]:
    """Per-round call rates of ``call`` after a warm-up."""
    warm_up(call, settings.warmup_calls)
    return [timed_round(call, settings.round_seconds) for _ in range(settings.rounds)]


def measure_alternating(
    calls: dict[str, Callable[[], object]], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Seconds of every call, the systems alternating call by call: round ``r`` calls
    each system once, in an order rotated by ``r``, so no system always runs first
    (right after a pause) or last."""
    names = list(calls)
    for _ in range(warmup):
        for call in calls.values():
            call()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        if r // len(names) % 2:
            order.reverse()
        for name in order:
            started = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def spread(seconds: list[float]) -> str:
    """Median, quartiles and range of call times, in ms."""
    q1, mid, q3 = (float(np.percentile(seconds, q)) * 1e3 for q in (25, 50, 75))
    low, high = min(seconds) * 1e3, max(seconds) * 1e3
    return f"{mid:.1f} ms (quartiles {q1:.1f}..{q3:.1f}, range {low:.1f}..{high:.1f})"


def distinct_keys(count: int, seed: int) -> npt.NDArray[np.int64]:
    """``count`` distinct random non-negative int64 keys in random order."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(1, 2**62, size=count + count // 64 + 16, dtype=np.int64))
    if keys.shape[0] < count:
        raise RuntimeError("too many random key collisions; try another seed")
    return rng.permutation(keys)[:count]


# ----- subprocesses ---------------------------------------------------------------


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM ``proc`` and wait; SIGKILL if it does not exit in ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def running(
    command: list[str], log_path: Path, tree: Path = ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process (output to ``log_path``) run from source tree ``tree``, stopped with
    SIGTERM on exit, error or not."""
    env = dict(os.environ, PYTHONPATH=str(tree)) if tree != ROOT else None
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=tree,
            env=env,
        )  # fmt: skip
        try:
            yield proc
        finally:
            stop_process(proc)


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_for_port_file(
    path: Path, proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 120.0
) -> int:
    """The port a child wrote to ``path`` (``'<port> ...'``), once it is complete."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{proc.args!r} exited with {proc.returncode} before writing {path}:\n"
                + log_tail(log_path)
            )
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = path.read_text()
            if text.endswith("\n"):
                return int(text.split()[0])
        time.sleep(0.05)
    raise TimeoutError(f"no port in {path} after {timeout:.0f}s:\n" + log_tail(log_path))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def ps_shard(workdir: Path, tree: Path = ROOT, name: str = "ps") -> Iterator[str]:
    """One PS shard started with the real CLI from source tree ``tree``; yields its address."""
    port_file = workdir / f"{name}.port"
    log_path = workdir / f"{name}.log"
    command = [
        sys.executable, "-m", "launcher", "ps",
        "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
        "--num-shards", "1", "--shard-index", "0",
    ]  # fmt: skip
    with running(command, log_path, tree) as proc:
        port = wait_for_port_file(port_file, proc, log_path)
        yield f"127.0.0.1:{port}"


@contextlib.contextmanager
def raw_grpc_server(workdir: Path) -> Iterator[str]:
    """The minimal bytes-in/bytes-out gRPC server (this file, ``--serve-raw``)."""
    port_file = workdir / "raw.port"
    log_path = workdir / "raw.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--serve-raw", str(port_file)]
    with running(command, log_path) as proc:
        port = wait_for_port_file(port_file, proc, log_path)
        yield f"127.0.0.1:{port}"


# ----- baseline (a): the raw gRPC server process ------------------------------------


def serve_raw(port_file: Path) -> int:
    """Answer every call of ``RAW_METHOD`` with one prebuilt payload until SIGTERM."""
    tune_malloc()
    from heraldps.serving import channel_options

    payload = np.random.default_rng(0).bytes(RESPONSE_BYTES)

    def pull(request: bytes, context: grpc.ServicerContext) -> bytes:
        return payload

    handler = grpc.method_handlers_generic_handler(
        "heraldps.bench.Raw",
        {
            "Pull": grpc.unary_unary_rpc_method_handler(
                pull, request_deserializer=None, response_serializer=None
            )
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16),
        handlers=[handler],
        options=channel_options(MAX_MESSAGE_BYTES),
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    port_file.write_text(f"{port}\n")
    stop.wait()
    server.stop(1.0).wait()
    return 0


def raw_pull_call(channel: grpc.Channel) -> Callable[[], object]:
    """One raw call: 512 KiB of key bytes out, the prebuilt payload back."""
    rpc = channel.unary_unary(RAW_METHOD, request_serializer=None, response_deserializer=None)
    request = distinct_keys(BATCH, seed=1).tobytes()

    def call() -> bytes:
        response: bytes = rpc(request, timeout=60.0)
        if len(response) != RESPONSE_BYTES:
            raise RuntimeError(f"raw server sent {len(response)} bytes, expected {RESPONSE_BYTES}")
        return response

    return call


# ----- baseline (b): Redis ------------------------------------------------------------


def redis_available() -> str | None:
    """Why Redis is skipped, or None if it can run."""
    if shutil.which("redis-server") is None:
        return "redis-server not found (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis package is not installed (pip install redis)"
    return None


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[Any]:
    """A throwaway redis-server on a free local port; yields a connected client."""
    import redis

    port = free_port()
    log_path = workdir / "redis.log"
    command = [
        "redis-server", "--port", str(port), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no", "--dir", str(workdir),
    ]  # fmt: skip
    with running(command, log_path) as proc:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "redis-server did not start:\n" + log_tail(log_path)
                    ) from None
                time.sleep(0.05)
        try:
            yield client
        finally:
            client.close()


def redis_key_names(keys: npt.NDArray[np.int64]) -> list[bytes]:
    return [b"emb:%d" % k for k in keys.tolist()]


def fill_redis(client: Any, names: list[bytes]) -> None:
    """Store one 264-byte value (float32 row + int64 version) under every name."""
    rng = np.random.default_rng(2)
    rows = np.empty((len(names), ROW_PAYLOAD), dtype=np.uint8)
    rows[:, : DIM * 4] = rng.standard_normal((len(names), DIM), dtype=np.float32).view(np.uint8)
    rows[:, DIM * 4 :] = np.ones((len(names), 1), dtype=np.int64).view(np.uint8)
    for start in range(0, len(names), 8192):
        chunk = names[start : start + 8192]
        client.mset({name: rows[start + i].tobytes() for i, name in enumerate(chunk)})


def decode_redis_rows(
    replies: list[bytes | None],
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """MGET replies -> values float32 [n, DIM] and versions int64 [n]."""
    if any(r is None for r in replies):
        raise RuntimeError("MGET returned a missing key")
    raw = np.frombuffer(b"".join(replies), dtype=np.uint8).reshape(len(replies), ROW_PAYLOAD)  # type: ignore[arg-type]
    values = np.ascontiguousarray(raw[:, : DIM * 4]).view(np.float32)
    versions = np.ascontiguousarray(raw[:, DIM * 4 :]).view(np.int64).reshape(-1)
    return values, versions


def redis_pull_call(client: Any, key_sets: list[npt.NDArray[np.int64]]) -> Callable[[], object]:
    name_sets = [redis_key_names(keys) for keys in key_sets]
    fill_redis(client, [name for names in name_sets for name in names])
    next_names = rotating(name_sets)  # type: ignore[arg-type]

    def call() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        values, versions = decode_redis_rows(client.mget(next_names()))
        if values.shape != (BATCH, DIM):
            raise RuntimeError(f"redis rows decoded to {values.shape}")
        return values, versions

    return call


def redis_parser() -> str:
    try:
        import hiredis  # noqa: F401
    except ImportError:
        return "pure-Python RESP parser (hiredis not installed)"
    return "hiredis"


# ----- ours: pull and push+commit ------------------------------------------------------


def rotating(key_sets: list[npt.NDArray[np.int64]]) -> Callable[[], npt.NDArray[np.int64]]:
    """The next key set on every call, round and round."""
    turn = 0

    def next_keys() -> npt.NDArray[np.int64]:
        nonlocal turn
        turn += 1
        return key_sets[turn % len(key_sets)]

    return next_keys


def ours_pull_call(client: Any, key_sets: list[npt.NDArray[np.int64]]) -> Callable[[], object]:
    next_keys = rotating(key_sets)

    def call() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        values, versions = client.pull(TABLE, next_keys())
        if values.shape != (BATCH, DIM):
            raise RuntimeError(f"pull returned {values.shape}")
        return values, versions

    return call


def push_commit_call(client: Any, keys: npt.NDArray[np.int64]) -> Callable[[], object]:
    """One training iteration: push gradients to iteration t, then commit(t)."""
    grads = np.random.default_rng(3).standard_normal((BATCH, DIM), dtype=np.float32) * 1e-3
    iteration = 0

    def call() -> int:
        nonlocal iteration
        client.push_gradients(TABLE, keys, grads, iteration)
        updated: int = client.commit(iteration)
        if updated != BATCH:
            raise RuntimeError(f"commit({iteration}) updated {updated} rows, expected {BATCH}")
        iteration += 1
        return updated

    return call


def create_populated_table(client: Any, keys: npt.NDArray[np.int64]) -> None:
    """The bench table with a row for every key, created by pulls of ``BATCH`` keys."""
    from heraldps.optim import AdaGrad

    client.create_table(TABLE, DIM, AdaGrad(lr=0.01))
    for start in range(0, keys.shape[0], BATCH):
        client.pull(TABLE, keys[start : start + BATCH])  # creates the rows
    if client.describe_table(TABLE).rows != keys.shape[0]:
        raise RuntimeError("pre-populating the table failed")


# ----- key lookup and memory -----------------------------------------------------------------


def bench_lookup(settings: Settings) -> list[float]:
    """Keys/s of ``KeyIndex.lookup`` (65,536 present keys, 1M-key index), per round."""
    from heraldps.keyindex import KeyIndex

    indexed = distinct_keys(INDEX_KEYS, seed=4)
    index = KeyIndex()
    index.insert(indexed)
    queries = np.random.default_rng(5).choice(indexed, size=BATCH, replace=False)
    if (index.lookup(queries) < 0).any():
        raise RuntimeError("KeyIndex lost keys")
    return [rate * BATCH for rate in measure(lambda: index.lookup(queries), settings)]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def malloc_trim() -> bool:
    """Give free heap pages back to the OS (glibc ``malloc_trim(0)``); False off glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0))
    except (OSError, AttributeError):
        return False


def memory_probe(rows: int) -> dict[str, Any]:
    """Run in a fresh process: resident bytes of ``rows`` rows created by pulls.

    The baseline is taken after ``malloc_trim`` so free heap left by imports
    and key generation is not silently reused by the table (which would
    under-count). The result is RSS as the process holds it (freed
    temporaries of the pulls kept by malloc included, as in a PS process,
    which runs with the same ``tune_malloc`` thresholds); ``live`` is the
    same after another ``malloc_trim``.
    """
    tune_malloc()  # as the PS process does
    from heraldps.optim import AdaGrad
    from heraldps.spec import TableSpec
    from ps_server.store import StagedStore

    spec = TableSpec(TABLE, DIM, optimizer=AdaGrad())
    warm = StagedStore()  # compile/load the numba kernels outside the measurement
    warm.create_table(spec)
    warm.pull(TABLE, np.arange(10, dtype=np.int64))
    del warm
    keys = distinct_keys(rows, seed=6)
    store = StagedStore()
    table, _ = store.create_table(spec)
    gc.collect()
    trimmed = malloc_trim()
    before = rss_bytes()
    for start in range(0, rows, BATCH):
        block = store.pull(TABLE, keys[start : start + BATCH])
        del block
    gc.collect()
    after = rss_bytes()
    malloc_trim()
    after_trim = rss_bytes()
    if table.rows != rows:
        raise RuntimeError(f"table holds {table.rows} rows, expected {rows}")
    return {
        "rows": rows,
        "tune_malloc": True,
        "malloc_trim_before": trimmed,
        "rss_before": before,
        "rss_after": after,
        "rss_after_malloc_trim": after_trim,
        "bytes_per_row": (after - before) / rows,
        "live_bytes_per_row": (after_trim - before) / rows,
        "accounted_bytes_per_row": table.nbytes / rows,
        "row_capacity": table.capacity,
    }


def bench_memory(rows: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", str(rows)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ----- the run -------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, Any]:
    redis_version = "not installed"
    if shutil.which("redis-server"):
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
        redis_version = out.stdout.strip()
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "grpcio": grpc.__version__,
        "numba": package_version("numba"),
        "redis_py": package_version("redis"),
        "redis_server": redis_version,
    }


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def bench_network(settings: Settings, workdir: Path, results: Results) -> None:
    """Pull (ours, raw gRPC, Redis) and push+commit, all over local TCP."""
    from heraldps.client import PSClient
    from heraldps.serving import channel_options

    keys = distinct_keys(settings.table_rows, seed=7)
    rng = np.random.default_rng(8)
    key_sets = [rng.choice(keys, BATCH, replace=False) for _ in range(KEY_SETS)]
    skip_redis = redis_available()
    with contextlib.ExitStack() as stack:
        ps_address = stack.enter_context(ps_shard(workdir))
        raw_address = stack.enter_context(raw_grpc_server(workdir))
        client = stack.enter_context(PSClient([ps_address]))
        client.wait_ready()
        create_populated_table(client, keys)
        channel = stack.enter_context(
            grpc.insecure_channel(raw_address, options=channel_options(MAX_MESSAGE_BYTES))
        )
        calls = {"heraldps": ours_pull_call(client, key_sets), "raw_grpc": raw_pull_call(channel)}
        if skip_redis is None:
            redis = stack.enter_context(redis_server(workdir))
            calls["redis"] = redis_pull_call(redis, key_sets)
        if settings.compare_tree is not None:  # the same pull served by another version
            other = stack.enter_context(ps_shard(workdir, settings.compare_tree, "compare"))
            compared = stack.enter_context(PSClient([other]))
            compared.wait_ready()
            create_populated_table(compared, keys)
            calls["compare_tree"] = ours_pull_call(compared, key_sets)
        pulls = measure_alternating(calls, settings.pull_rounds, settings.warmup_calls)
        push = measure(push_commit_call(client, key_sets[0]), settings)
    results.measurements["pull_seconds"] = pulls
    results.measurements["push_commit_per_s"] = push
    results.measurements["redis"] = {
        "skipped": skip_redis,
        "value_layout": "256-byte float32 row + 8-byte int64 version (264 bytes), one key per row",
        "parser": redis_parser() if skip_redis is None else None,
    }
    add_pull_rows(results, pulls, skip_redis)
    add_push_rows(results, push)


def pull_spread(pulls: dict[str, list[float]]) -> list[str]:
    """Lines giving each system's call times and the per-round ratio to raw gRPC."""
    lines = [f"- {name}: {spread(seconds)}" for name, seconds in pulls.items()]
    for name in ("heraldps", "compare_tree"):
        if name not in pulls:
            continue
        per_round = [r / o for r, o in zip(pulls["raw_grpc"], pulls[name], strict=True)]
        ratio = median(pulls["raw_grpc"]) / median(pulls[name])
        lines.append(
            f"- {name}/raw gRPC: ratio of medians {ratio:.2f}; "
            f"per round: median {median(per_round):.2f}, quartiles "
            f"{np.percentile(per_round, 25):.2f}..{np.percentile(per_round, 75):.2f}, "
            f"range {min(per_round):.2f}..{max(per_round):.2f}"
        )
    return lines


def add_pull_rows(results: Results, pulls: dict[str, list[float]], skip_redis: str | None) -> None:
    """Rates from the median call time of each system (alternated calls)."""
    ours = 1 / median(pulls["heraldps"])
    raw = 1 / median(pulls["raw_grpc"])
    rows = results.settings["table_rows"]
    results.rows += [
        Row(
            f"pull 65,536 x 64 of {rows:,} rows (pulls/s) vs raw gRPC echo",
            ours, raw, "raw gRPC, bytes only", ours / raw, f">= {TARGET_RAW_RATIO}",
            ours / raw >= TARGET_RAW_RATIO, "pulls/s",
        ),
        Row("pull rows/s", ours * BATCH, raw * BATCH, "raw gRPC", ours / raw, unit="rows/s"),
        Row(
            "pull MB/s (values + versions)", ours * RESPONSE_BYTES / 1e6,
            raw * RESPONSE_BYTES / 1e6, "raw gRPC", ours / raw, unit="MB/s",
        ),
    ]  # fmt: skip
    if skip_redis is not None:
        results.rows.append(
            Row("pull vs Redis MGET (pulls/s)", ours, note=f"skipped: {skip_redis}")
        )
        return
    redis = 1 / median(pulls["redis"])
    results.rows.append(
        Row(
            "pull 65,536 x 64 (pulls/s) vs Redis MGET", ours, redis, "Redis MGET + decode",
            ours / redis, f">= {TARGET_REDIS_RATIO:g}", ours / redis >= TARGET_REDIS_RATIO,
            "pulls/s",
        )
    )  # fmt: skip


def add_push_rows(results: Results, push: list[float]) -> None:
    rate = median(push)
    results.rows += [
        Row("push + commit AdaGrad (iterations/s)", rate, unit="iterations/s"),
        Row("push + commit rows/s", rate * BATCH, unit="rows/s"),
    ]


def add_lookup_row(results: Results, lookup: list[float]) -> None:
    rate = median(lookup)
    results.measurements["lookup_keys_per_s"] = lookup
    results.rows.append(
        Row(
            "KeyIndex.lookup 65,536 of 1M keys (keys/s)", rate, target=">= 20M",
            passed=rate >= TARGET_LOOKUP_KEYS_PER_S, unit="keys/s",
        )
    )  # fmt: skip


def add_memory_row(results: Results, memory: dict[str, Any]) -> None:
    results.measurements["memory"] = memory
    for label, key in (
        ("resident", "bytes_per_row"),
        ("resident after malloc_trim", "live_bytes_per_row"),
    ):
        per_row = float(memory[key])
        results.rows.append(
            Row(
                f"{label} bytes/row, {memory['rows']:,} rows dim 64 AdaGrad", per_row,
                IDEAL_ROW_BYTES, "ideal 8+8+256+256", per_row / IDEAL_ROW_BYTES,
                f"<= {TARGET_MEMORY_RATIO}", per_row / IDEAL_ROW_BYTES <= TARGET_MEMORY_RATIO,
                "bytes",
            )
        )  # fmt: skip


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e6:
        return f"{value / 1e6:,.2f}M"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:.3g}"


def markdown(results: Results) -> str:
    lines = [
        "| metric | heraldps | baseline | ratio | target | pass |",
        "|---|---:|---:|---:|---|---|",
    ]
    for row in results.rows:
        baseline = fmt(row.baseline) + (f" ({row.baseline_name})" if row.baseline_name else "")
        if row.note:
            baseline = row.note
        passed = "-" if row.passed is None else ("yes" if row.passed else "**no**")
        ratio = "-" if row.ratio is None else f"{row.ratio:.3g}"
        lines.append(
            f"| {row.metric} | {fmt(row.ours)} | {baseline} | {ratio} | {row.target or '-'} "
            f"| {passed} |"
        )
    m = results.machine
    lines += [
        "",
        f"Machine: {m['cpu_model']}, {m['cpu_count']} CPUs ({m['cpus_usable']} usable); "
        f"Python {m['python']}, NumPy {m['numpy']}, grpcio {m['grpcio']}, numba {m['numba']}, "
        f"redis-py {m['redis_py']}, {m['redis_server'] or 'no redis-server'}.",
        f"Settings: {results.settings}",
    ]
    if "pull_seconds" in results.measurements:
        lines += ["", "Pull call times (alternating calls):"]
        lines += pull_spread(results.measurements["pull_seconds"])
    redis = results.measurements.get("redis", {})
    if redis and not redis.get("skipped"):
        lines.append(f"Redis: each value is the {redis['value_layout']}; {redis['parser']}.")
    return "\n".join(lines)


def write_json(results: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "machine": results.machine,
        "settings": results.settings,
        "table": [asdict(row) for row in results.rows],
        "measurements": results.measurements,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def settings_from(args: argparse.Namespace) -> Settings:
    if args.quick:
        return Settings(args.rounds or 3, 0.3, 2, MEMORY_ROWS, args.pull_rounds or 8,
                        args.table_rows or 200_000, args.compare_tree)  # fmt: skip
    return Settings(
        args.rounds or 10, 1.5, 3, MEMORY_ROWS, args.pull_rounds or PULL_ROUNDS,
        args.table_rows or TABLE_ROWS, args.compare_tree,
    )  # fmt: skip


def run(settings: Settings, output: Path, pull_only: bool = False) -> Results:
    results = Results(
        machine=machine_info(),
        settings={
            **asdict(settings),
            "compare_tree": str(settings.compare_tree or ""),
            "batch": BATCH,
            "dim": DIM,
            "index_keys": INDEX_KEYS,
        },
    )
    if not pull_only:
        print("KeyIndex.lookup ...", file=sys.stderr)
        add_lookup_row(results, bench_lookup(settings))
        print(f"resident memory of {settings.memory_rows:,} rows ...", file=sys.stderr)
        add_memory_row(results, bench_memory(settings.memory_rows))
    print("pull (heraldps / raw gRPC / Redis) and push+commit ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench_ps.") as workdir:
        bench_network(settings, Path(workdir), results)
    # Rows in issue order: pull, push, lookup, memory.
    order = ("pull", "push", "KeyIndex", "resident")
    results.rows.sort(
        key=lambda row: next(i for i, p in enumerate(order) if row.metric.startswith(p))
    )
    write_json(results, output)
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few short rounds (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per measurement")
    parser.add_argument(
        "--pull-rounds",
        type=int,
        default=None,
        help=f"alternating pull rounds (default {PULL_ROUNDS}; 8 with --quick)",
    )
    parser.add_argument(
        "--table-rows",
        type=int,
        default=None,
        help=f"rows in the pulled table (default {TABLE_ROWS:,}; 200,000 with --quick)",
    )
    parser.add_argument(
        "--compare-tree",
        type=Path,
        default=None,
        help="also pull from a shard run from this source tree (e.g. an older commit: "
        "git archive <commit> | tar -x -C DIR), in the same alternation",
    )
    parser.add_argument(
        "--pull-only",
        action="store_true",
        help="only pull (vs raw gRPC and Redis) and push+commit: skip lookup and memory",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON result file")
    parser.add_argument("--serve-raw", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--memory-probe", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag in ("rounds", "pull_rounds"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.table_rows is not None and args.table_rows < BATCH:
        parser.error(f"--table-rows must be >= {BATCH:,} (one pull's keys)")
    return args


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Turn SIGTERM into SystemExit so the child processes are stopped on the way out."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_raw is not None:
        return serve_raw(args.serve_raw)
    if args.memory_probe is not None:
        print(json.dumps(memory_probe(args.memory_probe)))
        return 0
    tune_malloc()
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    started = time.perf_counter()
    results = run(settings_from(args), args.output, args.pull_only)
    print(markdown(results))
    print(f"\nWrote {args.output} ({time.perf_counter() - started:.0f}s).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
