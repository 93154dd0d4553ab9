"""Where ``heraldps simulate``'s memory goes: the first pass, the reader, and one mode's
scheduler (its cache mirror), per distinct key, at any size.

Run from the repository root, on files made by ``benchmarks/gen_criteo.py`` (the names
``bench_data.py`` uses)::

    python benchmarks/bench_simulate_memory.py --rows 1000000 10000000 --data-dir /tmp/criteo

Every measurement is its own child process (peak RSS from ``wait4``), on the TSV, with
``simulate``'s defaults (8 workers x 128 samples, cache 10% of the distinct keys):

- ``first-pass``: ``check`` + ``scan`` with the mini-batch sizes, what ``simulate`` does
  before planning (prints rows and distinct keys for the other children);
- ``read``: the planning passes' read alone, every global batch streamed, no scheduler;
- ``plan-MODE``: that read with one mode's scheduler planning every batch, as ``simulate``
  does one mode group at a time. The child reports the resident bytes of every NumPy array
  the scheduler holds (found by walking its attributes, so the numbers survive a change of
  the mirror's layout), each array's share read from ``/proc/self/smaps`` when it is a
  mapping of its own (huge-page, lazily committed mappings count only what was touched).

Results go to ``benchmarks/results/bench_simulate_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "benchmarks" / "results" / "bench_simulate_memory.json"
WORKERS, PER_WORKER, FRACTION = 8, 128, 0.1
MODES = ("naive", "on_demand", "location_aware", "herald_pipelined")  # one per plan group


# ---------------------------------------------------------------- child side


def _mappings() -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of every mapping of this process."""
    found: list[tuple[int, int, int]] = []
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and ":" not in head[0]:
                start, end = (int(x, 16) for x in head[0].split("-"))
                found.append((start, end, 0))
            elif head and head[0] == "Rss:" and found:
                start, end, _ = found[-1]
                found[-1] = (start, end, int(head[1]) * 1024)
    return found


def _arrays(obj: Any, path: str, seen: set[int], depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(attribute path, ndarray) of every array reachable from ``obj``'s attributes."""
    import numpy as np

    if id(obj) in seen or depth > 4:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        yield path, obj
        return
    if isinstance(obj, dict):
        children: list[tuple[str, Any]] = [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, list | tuple) or type(obj).__name__ == "List":  # numba typed List
        children = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in (
        "scheduler_service",
        "heraldps",
    ):
        children = [(f"{path}.{k}", v) for k, v in vars(obj).items()]
    else:
        return
    for name, child in children:
        yield from _arrays(child, name, seen, depth + 1)


def _resident(scheduler: Any) -> dict[str, int]:
    """Resident bytes per top-level array group (``mirror.index``, ``mirror.queue``...)."""
    maps = _mappings()
    counted: set[int] = set()
    out: dict[str, int] = {}
    for path, array in _arrays(scheduler, "scheduler", set()):
        base = array
        while getattr(base, "base", None) is not None and hasattr(base.base, "__array_interface__"):
            base = base.base
        pointer = base.__array_interface__["data"][0]
        mapping = next((m for m in maps if m[0] <= pointer < m[1]), None)
        own = mapping is not None and base.nbytes <= mapping[1] - mapping[0] < base.nbytes + (
            4 << 20
        )
        key = mapping[0] if own and mapping is not None else pointer
        if key in counted:
            continue
        counted.add(key)
        size = mapping[2] if own and mapping is not None else int(base.nbytes)
        group = ".".join(path.split(".")[:3]).split("[")[0]
        out[group] = out.get(group, 0) + size
    return out


def child(kind: str, path: str, rows: int, distinct: int) -> dict[str, Any]:
    from heraldps.data import DataSpec
    from heraldps.data.global_batches import MiniBatchSizes, StreamedBatches
    from heraldps.data.reader import check, scan

    spec = DataSpec(path, "criteo")
    started = time.perf_counter()
    if kind == "first-pass":
        check(spec)
        profile = scan(spec, on_chunk=MiniBatchSizes(WORKERS, PER_WORKER))
        return {
            "rows": profile.rows,
            "distinct_keys": profile.total_distinct_keys,
            "seconds": time.perf_counter() - started,
        }
    batches = StreamedBatches(spec, rows, WORKERS * PER_WORKER, None)
    if kind == "read":
        count = sum(b.rows for b in batches.iter_from(0))
        return {"rows": count, "seconds": time.perf_counter() - started}
    from scheduler_service.simulate import cache_rows_for, plan_all

    mode = kind.removeprefix("plan-")
    capacity = cache_rows_for(distinct, FRACTION)
    scheduler = plan_all(batches, WORKERS, PER_WORKER, capacity, mode, None, 1, distinct)
    resident = _resident(scheduler)
    return {
        "rows": rows,
        "seconds": time.perf_counter() - started,
        "cache_rows": capacity,
        "resident_mb": {k: v / 2**20 for k, v in sorted(resident.items())},
        "scheduler_mb": sum(resident.values()) / 2**20,
        "bytes_per_distinct_key": sum(resident.values()) / max(distinct, 1),
    }


# --------------------------------------------------------------- parent side


def run(kind: str, path: Path, rows: int, distinct: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, __file__, "--child", kind, str(path), str(rows), str(distinct)]
    load = os.getloadavg()[0]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, cwd=ROOT)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{kind} on {path} failed (exit {os.waitstatus_to_exitcode(status)})")
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    got.update(kind=kind, peak_rss_mb=usage.ru_maxrss / 1024, load=load,
               cpu_s=usage.ru_utime + usage.ru_stime)  # fmt: skip
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--data-dir", type=Path, help="where criteo_ROWS.tsv are (required)")
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, path, rows, distinct = args.child
        print(json.dumps(child(kind, path, int(rows), int(distinct))))
        return 0
    if args.data_dir is None:
        parser.error("--data-dir is required (files made by benchmarks/gen_criteo.py)")
    results: dict[str, Any] = {"load_start": os.getloadavg(), "sizes": {}}
    for rows in args.rows:
        path = args.data_dir / f"criteo_{rows}.tsv"
        first = run("first-pass", path, 0, 0)
        distinct = first["distinct_keys"]
        found = [first, run("read", path, first["rows"], distinct)]
        found += [run(f"plan-{mode}", path, first["rows"], distinct) for mode in args.modes]
        results["sizes"][str(rows)] = found
        print(f"\n{rows:,} rows, {distinct:,} distinct keys")
        print("| child | peak RSS MB | scheduler MB | bytes per distinct key | CPU s | load |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in found:
            mb = f"{r['scheduler_mb']:.0f}" if "scheduler_mb" in r else ""
            per_key = f"{r['bytes_per_distinct_key']:.0f}" if "scheduler_mb" in r else ""
            print(f"| {r['kind']} | {r['peak_rss_mb']:.0f} | {mb} | {per_key} | "
                  f"{r['cpu_s']:.0f} | {r['load']:.1f} |")  # fmt: skip
            if "resident_mb" in r:
                mb_of = [(k, v) for k, v in r["resident_mb"].items() if v >= 1]
                parts = ", ".join(f"{k.split('.', 1)[-1]} {v:.0f}" for k, v in mb_of)
                print(f"|   (MB: {parts}) | | | | | |")
    results["load_end"] = os.getloadavg()
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
