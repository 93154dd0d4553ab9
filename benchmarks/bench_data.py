"""Data path speed and memory: pyarrow's raw parse vs our reader vs ``heraldps simulate``.

Run from the repository root::

    python benchmarks/bench_data.py --rows 1000000            # ~2-4 minutes on 2 cores
    python benchmarks/bench_data.py --rows 1000000 10000000 --data-dir /tmp/criteo
    python benchmarks/bench_data.py --only keys               # the key-hashing table only

Files are made by ``benchmarks/gen_criteo.py`` (Criteo Kaggle layout, published
vocabularies, Zipf values, 2% empty cells) into ``--data-dir`` (reused when
there) or a temporary folder. Every measurement runs in its own child process,
so its peak RSS (``ru_maxrss`` of that child, from ``wait4``) is its own:

(a) ``raw``: pyarrow's streaming CSV parse of the TSV (``pyarrow.csv.open_csv``,
    all 40 columns, ``use_threads``), and of the Parquet file by row group;
(b) ``reader``: ``heraldps.data.reader.stream(DataSpec(...))`` consuming every
    chunk (keys, dense transform, labels), from the TSV and from the Parquet file;
(c) ``feed``: what the feeder does per global batch of 4 x 1024 rows, less the RPC
    (``StreamedBatches`` after a first pass, each batch's samples encoded as in
    ``SubmitBatch``): its memory must stay flat over the file;
(d) ``simulate``: ``python -m launcher simulate --data FILE`` wall time and RSS
    (skipped with a note if it fails).

Each child's CPU seconds (all its threads, from ``wait4``) and the load average when it
started are recorded too. ``--repeat N`` runs every measurement of a size N times, in
rounds that alternate their order, and reports medians: on a shared machine one run says
little.

``keys`` times key hashing on one Criteo batch (65,536 rows x 26 columns)
against the hashlib baseline. Targets (issue 22): reader >= 300k rows/s from
TSV and >= 0.4x the raw parse; Parquet faster than TSV; peak RSS of reader
and simulate <= 1 GB at 10M rows and <= 1.2x the 1M figure. JSON goes to
``benchmarks/results/bench_data.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "benchmarks" / "results" / "bench_data.json"
BATCH_ROWS = 65_536
WARMUP_ROWS = 5_000
CRITEO_COLUMNS = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


# ---------------------------------------------------------------- child side


def _child_raw_tsv(path: str) -> int:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    types = {c: (pa.string() if c.startswith("C") else pa.int64()) for c in CRITEO_COLUMNS}
    reader = pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(
            column_names=CRITEO_COLUMNS, use_threads=True, block_size=1 << 22
        ),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )
    return sum(batch.num_rows for batch in reader)


def _child_raw_parquet(path: str) -> int:
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    return sum(b.num_rows for b in file.iter_batches(batch_size=BATCH_ROWS, use_threads=True))


def _child_reader(path: str) -> int:
    from heraldps.data.reader import stream
    from heraldps.data.spec import DataSpec

    return sum(chunk.rows for chunk in stream(DataSpec(source=path, format="criteo"), BATCH_ROWS))


FEED_BATCH = 4096  # 4 workers x 1024


def _child_feed(path: str) -> int:
    """What the feeder does per global batch, less the RPC: cut the batch from the stream
    and encode its samples into the SubmitBatch message."""
    from heraldps.data.global_batches import StreamedBatches
    from heraldps.data.reader import scan
    from heraldps.data.spec import DataSpec
    from heraldps.samples import encode_samples

    spec = DataSpec(source=path, format="criteo")
    rows = scan(spec).rows  # the first pass a feeder's job records as train_rows
    # The first pass holds the distinct-value set (it grows with the vocabulary); the
    # feeding that follows must stay flat: each phase's peak is reported on its own.
    PHASES["first_pass_rss_mb"] = _peak_rss_mb(reset=True)
    sent = 0
    for batch in StreamedBatches(spec, rows, FEED_BATCH, None).iter_from(0):
        sent += len(encode_samples(batch).SerializeToString()) and batch.rows
    PHASES["feeding_rss_mb"] = _peak_rss_mb()
    return sent


PHASES: dict[str, float] = {}  # peak RSS (MB) of each phase of a child that has several


def _peak_rss_mb(reset: bool = False) -> float:
    """This process's peak RSS so far (``VmHWM``); ``reset`` starts a new peak from the
    current RSS (Linux ``clear_refs`` 5), so the next reading covers what follows."""
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    return peak / 1024


CHILDREN = {
    "raw-tsv": _child_raw_tsv,
    "raw-parquet": _child_raw_parquet,
    "reader-tsv": _child_reader,
    "reader-parquet": _child_reader,
    "feed-tsv": _child_feed,
}


def child_main(kind: str, path: str) -> None:
    """Run one measurement; print its rows and seconds as JSON (RSS is read by the parent)."""
    start = time.perf_counter()
    rows = CHILDREN[kind](path)
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - start, **PHASES}))


# --------------------------------------------------------------- parent side


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_child(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run ``argv`` in a child process: its stdout, exit code, wall seconds and peak RSS."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=_env(), cwd=ROOT)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return {
            "code": proc.returncode,
            "wall": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,  # all the child's threads
            "rss_mb": usage.ru_maxrss / 1024,  # Linux: kilobytes
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace")[-2000:],
        }


def measure(kind: str, path: Path, timeout: float) -> dict[str, Any]:
    load = os.getloadavg()[0]
    res = run_child([sys.executable, __file__, "--child", kind, str(path)], timeout)
    if res["code"] != 0:
        last = res["stderr"].strip().splitlines()[-1:] or ["(no output)"]
        return {"kind": kind, "error": f"exit {res['code']}: {last[0]}", "rss_mb": res["rss_mb"]}
    got = json.loads(res["stdout"].strip().splitlines()[-1])
    phases = {k: v for k, v in got.items() if k.endswith("_rss_mb")}
    return {
        "kind": kind,
        "rows": got["rows"],
        "seconds": got["seconds"],
        "rows_per_s": got["rows"] / got["seconds"],
        "cpu_s": res["cpu_s"],
        # A child that reset its peak between phases reports the earlier peaks itself.
        "rss_mb": max([res["rss_mb"], *phases.values()]),
        **phases,
        "load": load,
    }


def measure_simulate(path: Path, rows: int, timeout: float) -> dict[str, Any]:
    load = os.getloadavg()[0]
    argv = [sys.executable, "-m", "launcher", "simulate", "--data", str(path), "--format", "criteo"]
    res = run_child(argv, timeout)
    if res["code"] != 0:
        last = res["stderr"].strip().splitlines()[-1:] or ["(no output)"]
        return {"kind": "simulate", "error": f"exit {res['code']}: {last[0]}"[:300]}
    return {
        "kind": "simulate",
        "rows": rows,
        "seconds": res["wall"],
        "rows_per_s": rows / res["wall"],
        "cpu_s": res["cpu_s"],
        "rss_mb": res["rss_mb"],
        "load": load,
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement's repeats as one row: medians, with the range of rows/s and every
    load average seen (a shared machine's figures move with it)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    speeds = [r["rows_per_s"] for r in ok]
    keys = ["seconds", "cpu_s", "rss_mb", *(k for k in ok[0] if k.endswith("_rss_mb"))]
    row = {key: statistics.median(r[key] for r in ok) for key in keys}
    return {
        "kind": ok[0]["kind"],
        "rows": ok[0]["rows"],
        "rows_per_s": statistics.median(speeds),
        "rows_per_s_range": [min(speeds), max(speeds)],
        **row,
        "repeats": len(ok),
        "loads": [round(r["load"], 2) for r in ok],
        "runs_rows_per_s": [round(x) for x in speeds],  # in the order run, beside ``loads``
    }


def ensure_files(rows: int, folder: Path, seed: int) -> tuple[Path, Path]:
    tsv, parquet = folder / f"criteo_{rows}.tsv", folder / f"criteo_{rows}.parquet"
    if not (tsv.exists() and parquet.exists()):
        print(f"generating {rows:,} rows into {folder} ...", file=sys.stderr, flush=True)
        gen = [sys.executable, str(ROOT / "benchmarks" / "gen_criteo.py"), "--rows", str(rows)]
        gen += ["--out", str(tsv), "--parquet", str(parquet), "--seed", str(seed)]
        subprocess.run(gen, check=True, env=_env())
    return tsv, parquet


# ------------------------------------------------------------ keys benchmark


def keys_table(parquet: Path | None, rounds: int = 5) -> list[dict[str, Any]]:
    """Time key hashing of one Criteo batch (26 string columns) several ways, plus raw rates."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from heraldps.data import keys as keys_module

    if parquet is None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import gen_criteo

        table = gen_criteo.arrow_table(gen_criteo.make_block(0, 0, BATCH_ROWS))
    else:
        first = next(pq.ParquetFile(parquet).iter_batches(batch_size=BATCH_ROWS))
        table = pa.Table.from_batches([first])
    columns = [table.column(f"C{i}").combine_chunks() for i in range(1, 27)]
    rows = len(columns[0])
    distinct = sum(len(pc.unique(c.drop_null())) for c in columns)

    def hashlib_cells(i: int, a: pa.Array) -> None:
        prefix = f"{i}\x1f".encode()
        b"".join(
            hashlib.blake2b(prefix + v.encode(), digest_size=8).digest() for v in a.to_pylist() if v
        )

    def hashlib_distinct(i: int, a: pa.Array) -> None:
        enc = pc.dictionary_encode(a)
        prefix = f"{i}\x1f".encode()
        digests = b"".join(
            hashlib.blake2b(prefix + v.encode(), digest_size=8).digest()
            for v in enc.dictionary.to_pylist()
        )
        np.frombuffer(digests, dtype="<i8")[enc.indices.fill_null(0).to_numpy()]

    variants: dict[str, Callable[[int, Any], object]] = {
        "hashlib, every cell (one Python call each)": hashlib_cells,
        "hashlib, distinct values (Arrow dictionary)": hashlib_distinct,
        "numba kernel, every cell": lambda i, a: keys_module._string_keys(
            keys_module._prefix(i), a
        ),
        "dictionary_encode alone (no hashing)": lambda i, a: pc.dictionary_encode(a),
        "numba kernel, distinct values [column_keys]": keys_module.column_keys,
    }
    # Rounds alternate the variants (each timed once per round) and the table gives
    # medians, so a burst of load on a shared machine hits every variant alike.
    pool = ThreadPoolExecutor(2)
    wall_s: dict[str, list[float]] = {name: [] for name in variants}
    cpu_s: dict[str, list[float]] = {name: [] for name in variants}
    threads_s: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            cpu, wall = time.thread_time(), time.perf_counter()
            for i, a in enumerate(columns):
                fn(i, a)
            cpu_s[name].append(time.thread_time() - cpu)
            wall_s[name].append(time.perf_counter() - wall)
            if not name.startswith("hashlib"):
                wall = time.perf_counter()
                list(pool.map(fn, range(len(columns)), columns))
                threads_s[name].append(time.perf_counter() - wall)
    pool.shutdown()
    out = []
    for name in variants:
        cpu_median = statistics.median(cpu_s[name])
        two = statistics.median(threads_s[name]) if threads_s[name] else float("inf")
        out.append(
            {"variant": name, "ms": statistics.median(wall_s[name]) * 1e3,
             "cpu_ms": cpu_median * 1e3, "ns_per_row": cpu_median / rows * 1e9,
             "cpu_ms_min_max": [min(cpu_s[name]) * 1e3, max(cpu_s[name]) * 1e3],
             "two_threads_ms": two * 1e3}
        )  # fmt: skip
    rng = np.random.default_rng(1)
    short = pa.array(np.char.mod("%08x", rng.integers(0, 2**32, 200_000)).tolist())
    cpu = time.thread_time()
    keys_module._string_keys(keys_module._prefix(12), short)
    rate = len(short) / (time.thread_time() - cpu)
    cpu = time.thread_time()
    for v in short.to_pylist()[:100_000]:
        hashlib.blake2b(b"12\x1f" + v.encode(), digest_size=8).digest()
    hashlib_rate = 100_000 / (time.thread_time() - cpu)
    out.append({"variant": "hashes/s, 11-byte messages", "numba": rate, "hashlib": hashlib_rate})
    out.append({"variant": "batch", "rows": rows, "distinct_values": distinct})
    return out


def compile_seconds() -> tuple[float, float]:
    """Seconds for a fresh process to import keys and hash once with an empty numba cache."""
    with tempfile.TemporaryDirectory() as cache:
        code = (
            "import time; t = time.perf_counter()\n"
            "import pyarrow as pa\n"
            "from heraldps.data.keys import column_keys, feature_key\n"
            "feature_key(0, 'a'); column_keys(0, pa.array(['a'] * 100))\n"
            "column_keys(0, pa.array(['a'], pa.large_string())); column_keys(0, pa.array([1]))\n"
            "print(time.perf_counter() - t)\n"
        )
        env = _env() | {"NUMBA_CACHE_DIR": cache}
        cold = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        return float(cold.stdout.strip() or "nan"), float(warm.stdout.strip() or "nan")


def print_keys(table: list[dict[str, Any]], compile_times: tuple[float, float]) -> None:
    batch = next(r for r in table if r["variant"] == "batch")
    print(
        f"\nKey hashing, one Criteo batch: {batch['rows']:,} rows x 26 string columns, "
        f"{batch['distinct_values']:,} distinct (column, value) pairs"
    )
    print("Medians of alternating rounds (CPU time of the calling thread; min-max in brackets).")
    print("| variant | wall ms/batch | CPU ms/batch | CPU ns/row | 2 threads wall ms |")
    print("|---|---:|---:|---:|---:|")
    for r in table:
        if "ms" in r:
            two = "" if r["two_threads_ms"] == float("inf") else f"{r['two_threads_ms']:.1f}"
            low, high = r["cpu_ms_min_max"]
            cpu = f"{r['cpu_ms']:.1f} [{low:.0f}-{high:.0f}]"
            cells = f"{r['ms']:.1f} | {cpu} | {r['ns_per_row']:.0f} | {two}"
            print(f"| {r['variant']} | {cells} |")
    rates = next(r for r in table if r["variant"].startswith("hashes/s"))
    print(
        f"hashes/s (11-byte messages, CPU time): numba {rates['numba']:,.0f}, "
        f"hashlib {rates['hashlib']:,.0f} (one Python call each)"
    )
    print(
        f"numba compile, fresh cache: {compile_times[0]:.1f} s (process start to first keys); "
        f"cached: {compile_times[1]:.1f} s"
    )


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--data-dir", type=Path, help="where to find or make the files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["raw", "reader", "feed", "simulate", "keys"],
        default=["raw", "reader", "feed", "simulate", "keys"],
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every measurement of a size this many times, in rounds that alternate their "
        "order, and report medians (ranges in the JSON): for a shared machine",
    )
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(*args.child)
        return 0

    temp = None
    folder = args.data_dir
    if folder is None:
        temp = tempfile.TemporaryDirectory(prefix="bench_data-")
        folder = Path(temp.name)
    folder.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": load},
        "sizes": {},
    }
    print(
        f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)"
    )
    try:
        parquet_for_keys = None
        if "reader" in args.only:  # compile (and cache) numba kernels outside the timings
            warm_tsv, warm_parquet = ensure_files(WARMUP_ROWS, folder, args.seed)
            for kind, path in (("reader-tsv", warm_tsv), ("reader-parquet", warm_parquet)):
                measure(kind, path, args.timeout)
        for rows in args.rows:
            if not set(args.only) & {"raw", "reader", "feed", "simulate"}:
                break
            tsv, parquet = ensure_files(rows, folder, args.seed)
            parquet_for_keys = parquet
            found: list[dict[str, Any]] = []
            plan = []
            if "raw" in args.only:
                plan += [("raw-tsv", tsv), ("raw-parquet", parquet)]
            if "reader" in args.only:
                plan += [("reader-tsv", tsv), ("reader-parquet", parquet)]
            if "feed" in args.only:
                plan += [("feed-tsv", tsv)]
            if "simulate" in args.only:
                plan += [("simulate", tsv)]
            runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind, _ in plan}
            for round_ in range(args.repeat):
                for kind, path in plan if round_ % 2 == 0 else plan[::-1]:
                    print(f"  {rows:,} rows: {kind} ...", file=sys.stderr, flush=True)
                    runs[kind].append(
                        measure_simulate(path, rows, args.timeout)
                        if kind == "simulate"
                        else measure(kind, path, args.timeout)
                    )
            found = [medians(r) for r in runs.values()]
            results["sizes"][str(rows)] = found
            print_size(rows, found, tsv.stat().st_size)
        print_targets(results["sizes"])
        if "keys" in args.only:
            table = keys_table(parquet_for_keys)
            compiled = compile_seconds()
            results["keys"] = table
            results["compile_seconds"] = {"cold": compiled[0], "cached": compiled[1]}
            print_keys(table, compiled)
    finally:
        if temp is not None:
            temp.cleanup()
    results["machine"]["load_end"] = os.getloadavg()
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


def print_size(rows: int, found: list[dict[str, Any]], tsv_bytes: int) -> None:
    raw = next((r for r in found if r["kind"] == "raw-tsv" and "rows_per_s" in r), None)
    print(f"\n{rows:,} rows ({tsv_bytes / 1e6:.0f} MB TSV)")
    print("| measurement | rows/s | seconds | CPU s | x raw TSV parse | peak RSS MB | load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in found:
        if "error" in r:
            print(f"| {r['kind']} | skipped: {r['error']} | | | | | |")
            continue
        ratio = f"{r['rows_per_s'] / raw['rows_per_s']:.2f}" if raw else ""
        loads = "-".join(f"{x:.1f}" for x in (min(r["loads"]), max(r["loads"])))
        cells = (
            f"{r['rows_per_s']:,.0f} | {r['seconds']:.1f} | {r['cpu_s']:.1f} | {ratio} | "
            f"{r['rss_mb']:.0f} | {loads}"
        )
        print(f"| {r['kind']} | {cells} |")
    for r in found:
        if "first_pass_rss_mb" in r:
            print(f"({r['kind']}: peak RSS {r['first_pass_rss_mb']:.0f} MB in the first pass, "
                  f"{r['feeding_rss_mb']:.0f} MB while feeding)")  # fmt: skip


def print_targets(sizes: dict[str, list[dict[str, Any]]]) -> None:
    """Check the issue's targets on what was measured (a line each: met, missed or not measured)."""
    if not sizes:
        return
    get = {(rows, r["kind"]): r for rows, found in sizes.items() for r in found if "error" not in r}
    print("\nTargets (issue 22)")
    for rows in sizes:
        raw, tsv, pq_ = (get.get((rows, k)) for k in ("raw-tsv", "reader-tsv", "reader-parquet"))
        if tsv:
            speed = tsv["rows_per_s"]
            print(f"- {int(rows):,} rows: reader TSV {speed:,.0f} rows/s >= 300k: "
                  f"{'met' if speed >= 300_000 else 'MISSED'}")  # fmt: skip
            if raw:
                ratio = speed / raw["rows_per_s"]
                print(f"  reader TSV / raw parse = {ratio:.2f} >= 0.4: "
                      f"{'met' if ratio >= 0.4 else 'MISSED'}")  # fmt: skip
            if pq_:
                faster = pq_["rows_per_s"] > speed
                print(f"  Parquet {pq_['rows_per_s']:,.0f} rows/s faster than TSV: "
                      f"{'met' if faster else 'MISSED'}")  # fmt: skip
        for kind in ("reader-tsv", "reader-parquet", "feed-tsv", "simulate"):
            r = get.get((rows, kind))
            if r and int(rows) >= 10_000_000:
                ok = r["rss_mb"] <= 1024
                print(
                    f"  {kind} peak RSS {r['rss_mb']:.0f} MB <= 1 GB: {'met' if ok else 'MISSED'}"
                )
    small, big = "1000000", "10000000"
    for kind in ("reader-tsv", "reader-parquet", "feed-tsv", "simulate"):
        a, b = get.get((small, kind)), get.get((big, kind))
        if a and b:
            ratio = b["rss_mb"] / a["rss_mb"]
            print(
                f"- {kind} RSS 10M / 1M = {ratio:.2f} <= 1.2: {'met' if ratio <= 1.2 else 'MISSED'}"
            )
            if "feeding_rss_mb" in a and "feeding_rss_mb" in b:
                ratio = b["feeding_rss_mb"] / a["feeding_rss_mb"]
                print(f"  {kind} while feeding (after the first pass): 10M / 1M = {ratio:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
