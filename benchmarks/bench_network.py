"""Herald's speed-up on an emulated network: samples/s per mode against link rate.

Run from the repository root, as root (network namespaces; see docs/network.md)::

    python benchmarks/bench_network.py             # the full sweep, ~20 min on 2 cores
    python benchmarks/bench_network.py --quick     # 1 epoch, rates 10 and 1000, criteo only
    python benchmarks/bench_network.py --rates 1000 --repeats 3   # CPU-bound end, 3 runs each

Every process of each local cluster (2 PS shards, the scheduler, 4 workers)
runs in its own network namespace behind a token-bucket link of R Mbit/s
each way (``heraldps local --link-mbit R``). For each rate and dataset, every
variant trains the same batches (4 workers x 128, AdaGrad, dim 16, cache 10%
of the training keys per worker, 3 epochs):

- naive, on_demand, herald, herald_pipelined, het (s = 0) and het (s = 2),
  dense parameters all-reduced among the workers (the default);
- naive and herald with the dense parameters through the PS (``dense@ps``),
  to show what the all-reduce buys.

Reported per variant: median samples/s (global batch / median plan-to-plan
time of the slowest worker, first iteration left out), its ratio to naive at
the same rate and on the same data (same run), the network's share of an
iteration (time in RPCs), payload bytes per worker link and per PS link
(both directions, from the host side of each veth), the busiest link's
utilization (its busier direction's bytes / (rate x training time)), and
held-out logloss. Writes ``benchmarks/results/bench_network.json`` and a PNG
(samples/s against link rate, one line per variant, one panel per dataset).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from heraldps.bundled import bundled_data
from heraldps.job import TrainingJob
from launcher.local import ModeResult, run_local
from scheduler_service.simulate import cache_rows_for

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
RESULTS = Path(__file__).resolve().parent / "results"
RATES = (10.0, 30.0, 100.0, 1000.0)


@dataclass(frozen=True)
class Variant:
    name: str
    mode: str
    staleness: int = 0
    dense_sync: str = "allreduce"


VARIANTS = (
    Variant("naive", "naive"),
    Variant("on_demand", "on_demand"),
    Variant("herald", "herald"),
    Variant("herald_pipelined", "herald_pipelined"),
    Variant("het s=0", "het"),
    Variant("het s=2", "het", staleness=2),
    Variant("naive dense@ps", "naive", dense_sync="ps"),
    Variant("herald dense@ps", "herald", dense_sync="ps"),
)


def datasets(quick: bool) -> list[tuple[str, str, Path, Path]]:
    train, test = bundled_data()
    out = [("criteo (bundled)", "criteo", train, test)]
    avazu = SHARED / "avazu_head9k"
    if not quick and (avazu / "train.csv").exists():
        out.append(("avazu head9k", "avazu", avazu / "train.csv", avazu / "test.csv"))
    return out


def link_figures(result: ModeResult, rate_mbit: float) -> dict[str, Any]:
    """Mean bytes per worker link and per PS link (in + out), the busiest link (its name and
    utilization: its busier direction's bytes over rate x training time), every link's bytes."""
    links = result.link_bytes
    training = sum(r["period"] for r in result.per_iteration[1:]) or result.seconds

    def mean_total(prefix: str) -> float:
        totals = [v["in"] + v["out"] for k, v in links.items() if k.startswith(prefix)]
        return float(np.mean(totals)) if totals else float("nan")

    busiest_name, busiest = max(
        ((name, max(v["in"], v["out"])) for name, v in links.items()),
        key=lambda item: item[1], default=("", 0),
    )  # fmt: skip
    return {
        "worker_link_bytes": mean_total("worker-"),
        "ps_link_bytes": mean_total("ps-"),
        "busiest_link": busiest_name,
        "busiest_link_utilization": busiest * 8 / (rate_mbit * 1e6 * training),
        "links": links,
    }


def run_rate(
    job: TrainingJob,
    train: Any,
    test: Any,
    rate: float,
    variants: tuple[Variant, ...],
    rotate: int = 0,
) -> dict[str, ModeResult]:
    """Every variant at one link rate: one ``run_local`` per job setting (one network each),
    the modes of each in turn, started ``rotate`` places further along (repeats vary the
    order, so no variant always runs first or last)."""
    results: dict[str, ModeResult] = {}
    groups: dict[tuple[int, str], list[Variant]] = {}
    for v in variants:
        groups.setdefault((v.staleness, v.dense_sync), []).append(v)
    for (staleness, dense_sync), members in groups.items():
        variant_job = replace(job, staleness=staleness, dense_sync=dense_sync)
        k = rotate % len(members)
        modes = [v.mode for v in members[k:] + members[:k]]
        out = run_local(variant_job, modes, 2, train, test, link_mbit=rate)
        for v in members:
            results[v.name] = out[v.mode]
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 epoch, rates 10 and 1000, criteo")
    parser.add_argument("--rates", default=None, help="Mbit/s, comma-separated (10,30,100,1000)")
    parser.add_argument("--epochs", type=int, default=None, help="default 3 (quick: 1)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per variant and rate, in rotated order; samples/s is the "
        "median of their medians (other figures: the first run's)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_network.json")
    args = parser.parse_args()
    rates = RATES if args.rates is None else tuple(float(r) for r in args.rates.split(","))
    if args.quick and args.rates is None:
        rates = (10.0, 1000.0)
    epochs = args.epochs or (1 if args.quick else 3)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for name, fmt, train_path, test_path in datasets(args.quick):
        job = TrainingJob(data=str(train_path), format=fmt, workers=4, batch_size_per_worker=128,
                          epochs=epochs, optimizer="adagrad", embedding_dim=16)  # fmt: skip
        train, test = job.read(), job.read(str(test_path))
        job = replace(job, cache_rows=cache_rows_for(train, 0.1))
        for rate in rates:
            repeats = [run_rate(job, train, test, rate, VARIANTS, rotate=k)
                       for k in range(max(1, args.repeats))]  # fmt: skip
            results = repeats[0]
            speeds = {v.name: [rep[v.name].report()["samples_per_second_median"]
                               for rep in repeats] for v in VARIANTS}  # fmt: skip
            base = float(np.median(speeds["naive"]))
            for variant in VARIANTS:
                r = results[variant.name].report()
                speed = float(np.median(speeds[variant.name]))
                rows.append({
                    "data": name, "link_mbit": rate, "variant": variant.name,
                    "samples_per_second": speed, "samples_per_second_runs": speeds[variant.name],
                    "vs_naive": speed / base if base else float("nan"),
                    "network_share": r["network_share"],
                    "phases_median": r["phases_median"],
                    "rows_moved": r["moved_with_flush"], "bytes_moved": r["bytes_moved_with_flush"],
                    "dense_bytes": r["dense_bytes"], "logloss": r["logloss"], "auc": r["auc"],
                    **link_figures(results[variant.name], rate),
                })  # fmt: skip
                print_row(rows[-1])
            write(args.output, rows, epochs, rates, args.repeats, started)  # partial survives
    print_table(rows)
    write(args.output, rows, epochs, rates, args.repeats, started)
    plot(rows, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")
    return 0


def write(
    path: Path,
    rows: list[dict[str, Any]],
    epochs: int,
    rates: tuple[float, ...],
    repeats: int,
    started: float,
) -> None:
    machine = {"python": platform.python_version(), "numpy": np.__version__,
               "processor": platform.processor(), "cpus": os.cpu_count(),
               "minutes": (time.perf_counter() - started) / 60}  # fmt: skip
    config = {"workers": 4, "batch_size_per_worker": 128, "optimizer": "adagrad",
              "embedding_dim": 16, "shards": 2, "cache_fraction": 0.1, "epochs": epochs,
              "rates_mbit": list(rates), "repeats": repeats}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "config": config, "results": rows},
                               indent=2) + "\n")  # fmt: skip


def print_row(r: dict[str, Any]) -> None:
    print(f"  {r['data']} @ {r['link_mbit']:g} Mbit/s  {r['variant']:<18} "
          f"{r['samples_per_second']:8,.0f} samples/s  x{r['vs_naive']:.2f}  "
          f"net {100 * r['network_share']:.0f}%", flush=True)  # fmt: skip


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| data | Mbit/s | variant | samples/s | vs naive | net % | KiB/worker link | "
          "KiB/PS link | busiest link | logloss |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['data']} | {r['link_mbit']:g} | {r['variant']} | "
            f"{r['samples_per_second']:,.0f} | {r['vs_naive']:.2f} | "
            f"{100 * r['network_share']:.0f} | {r['worker_link_bytes'] / 1024:,.0f} | "
            f"{r['ps_link_bytes'] / 1024:,.0f} | {100 * r['busiest_link_utilization']:.0f}% | "
            f"{r['logloss']:.4f} |"
        )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = sorted({r["data"] for r in rows})
    fig, axes = plt.subplots(1, len(data), figsize=(7 * len(data), 4.8), squeeze=False)
    for ax, name in zip(axes[0], data, strict=True):
        for variant in VARIANTS:
            points = sorted((r["link_mbit"], r["samples_per_second"]) for r in rows
                            if r["data"] == name and r["variant"] == variant.name)  # fmt: skip
            if points:
                style = "--" if variant.dense_sync == "ps" else "-"
                ax.plot(*zip(*points, strict=True), style, marker="o", label=variant.name)
        ax.set(xscale="log", title=f"{name}: samples/s vs link rate", xlabel="Mbit/s per link",
               ylabel="samples/s (median)")  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
