"""Speed and memory of the streaming shuffle against the file-order stream (docs/training.md).

    python benchmarks/gen_criteo.py --rows 2000000 --out /tmp/shuffle/criteo_2m.tsv
    python benchmarks/bench_shuffle.py --data /tmp/shuffle/criteo_2m.tsv --rows 2000000 \\
        --buffers 100000,500000 --repeats 3

Each measurement is one child process that reads one epoch of global batches the way
``heraldps train`` feeds them (no cluster): ``file order`` (``shuffle: false``, what
``StreamedBatches`` yields), ``streaming N`` (``shuffle_buffer_rows: N``, the two-pass
bucket shuffle, spill file in ``--spill-dir``) and ``in memory`` (``shuffle_buffer_rows:
0``: the split read whole, permuted, cut). The modes alternate, ``--repeats`` rounds; it
prints per mode the median wall seconds, rows/s, CPU seconds (all threads), peak RSS of
the child, the ratio of rows/s to file order's and that of CPU seconds (file order's over
the mode's: the figure a busy machine disturbs least).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_epoch(data: str, rows: int, mode: str, batch: int, spill: str) -> dict[str, float]:
    """Read one epoch's global batches in ``mode``; seconds, CPU seconds and rows read."""
    import numpy as np

    from heraldps.data import DataSpec, read_all
    from heraldps.data.global_batches import StreamedBatches, global_batches
    from heraldps.data.shuffle import ShuffledRows, shuffled_batches

    spec = DataSpec(data, format="criteo")
    began, cpu = time.perf_counter(), time.process_time()
    if mode == "file":
        batches = StreamedBatches(spec, rows, batch, None).iter_from(0)
    elif mode == "memory":
        whole = read_all(spec)
        order = np.random.default_rng([0, 1]).permutation(whole.rows).astype(np.int64)
        batches = iter(global_batches(whole.take(order), batch, None))
    else:
        shuffle = ShuffledRows(spec, rows, int(mode), 0, 1, Path(spill))
        batches = shuffled_batches(shuffle, batch)
    done = 0
    checksum = 0
    for b in batches:
        done += b.rows
        checksum ^= int(b.keys[0])  # touch every batch
    return {"seconds": time.perf_counter() - began, "cpu": time.process_time() - cpu,
            "rows": done}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--rows", type=int, required=True, help="rows of --data (first pass)")
    p.add_argument("--buffers", default="100000,500000")
    p.add_argument("--batch", type=int, default=4096, help="global batch rows")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--spill-dir", default="/tmp/shuffle/spill")
    p.add_argument("--in-memory", action="store_true", help="also the in-memory shuffle")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        figures = one_epoch(args.data, args.rows, args.child, args.batch, args.spill_dir)
        figures["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(figures))
        return
    modes = ["file", *args.buffers.split(","), *(["memory"] if args.in_memory else [])]
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, "--data", args.data, "--rows",
                                  str(args.rows), "--batch", str(args.batch), "--spill-dir",
                                  args.spill_dir, "--child", mode],
                                 capture_output=True, text=True, check=True,
                                 cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(r["rows"] / r["seconds"] for r in results["file"])
    base_cpu = statistics.median(r["cpu"] for r in results["file"])
    print(f"{args.data}: {args.rows:,} rows, global batch {args.batch}, {args.repeats} rounds, "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'mode':>18} {'wall s':>8} {'rows/s':>10} {'cpu s':>7} {'RSS MB':>7} "
          f"{'ratio':>6} {'cpu ratio':>9}")  # fmt: skip
    for mode, runs in results.items():
        speed = statistics.median(r["rows"] / r["seconds"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        name = {"file": "file order", "memory": "in memory"}.get(mode, f"streaming {mode}")
        print(f"{name:>18} {statistics.median(r['seconds'] for r in runs):8.2f} {speed:10,.0f} "
              f"{cpu:7.2f} {max(r['rss_mb'] for r in runs):7.0f} {speed / base:6.2f} "
              f"{base_cpu / cpu:9.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
