"""Herald's speed-up on an emulated network: samples/s per mode against link rate.

Run from the repository root, as root (network namespaces; see docs/network.md)::

    python benchmarks/bench_network.py             # the full sweep, ~20 min on 2 cores
    python benchmarks/bench_network.py --quick     # 1 epoch, rates 10 and 1000, criteo only
    python benchmarks/bench_network.py --rates 1000 --repeats 3   # CPU-bound end, 3 runs each
    python benchmarks/bench_network.py --shape embeddings --rates 100 --iterations 12
    python benchmarks/bench_network.py --shape clicklog --repeats 3

``--shape small`` (the default) is the sweep below. ``--shape embeddings`` is
the papers' shape, where embeddings dominate: the Criteo layout (26 fields),
dim 64, 4 workers x 1024, read through the streaming path from a generated
file (``benchmarks/gen_criteo.py``, 2M rows, written to ``--data-file``,
default /tmp/netbench/criteo_2m.tsv, if missing); the run trains the first
``--iterations`` global batches (not whole epochs of millions of rows) and
evaluates the next ``--eval-rows`` rows; variants naive, herald and
herald_pipelined. ``--dims`` and ``--hidden`` give more points (embedding dim x
hidden widths), so that the dense all-reduce's share of the bytes changes.
``--shape clicklog`` is the case issue 25 was filed on: a click log of five
categorical fields (``benchmarks/gen_clicklog.py``, 100,000 rows, written to
/tmp/netbench/clicklog.csv if missing, and 10,000 held-out rows), 4 workers x
128, AdaGrad, dim 8, cache 10%, 30 iterations, 2 Mbit/s by default, where the
dense all-reduce outweighs the embeddings; variants naive, herald and
herald_pipelined, the last two also with early write-backs off (``ewb off``),
as before issue 25.

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
held-out logloss; also the whole-run samples/s (first commit to the end, the
final flush included) and its ratio to naive, and the embedding share of the
bytes (embedding rows moved, final flush included, over those plus the dense
all-reduce's bytes). Writes ``benchmarks/results/bench_network.json``, a PNG
(samples/s against link rate, one line per variant, one panel per dataset) and
``..._crossover.png`` (whole-run speed-up over naive against the embedding
share of the bytes, one point per dataset or shape and rate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from heraldps.bundled import bundled_data
from heraldps.data.global_batches import StreamedBatches
from heraldps.job import TrainingJob
from heraldps.modes import EARLY_WRITE_BACK_ALL, PIPELINED_MODE
from launcher.cli.command import look_ahead, prefetch_plans
from launcher.cli.data import first_pass
from launcher.local import ModeResult, run_local
from launcher.plot import headless_pyplot
from scheduler_service.simulate import cache_rows_for

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
RESULTS = Path(__file__).resolve().parent / "results"
RATES = (10.0, 30.0, 100.0, 1000.0)
EMBEDDINGS_DATA = Path("/tmp/netbench/criteo_2m.tsv")
EMBEDDINGS_ROWS = 2_000_000


@dataclass(frozen=True)
class Variant:
    name: str
    mode: str
    staleness: int = 0
    dense_sync: str = "allreduce"
    early_write_back: int = EARLY_WRITE_BACK_ALL  # the scheduler's setting (0: off)
    prefetch_plans: int = 1  # herald_pipelined's --prefetch-plans


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
EMBEDDINGS_VARIANTS = (
    Variant("naive", "naive"),
    Variant("herald", "herald"),
    Variant("herald_pipelined", "herald_pipelined"),
)
EWB_OFF_VARIANTS = (  # as before issue 25: early write-backs off
    Variant("herald ewb off", "herald", early_write_back=0),
    Variant("herald_pipelined ewb off", "herald_pipelined", early_write_back=0),
)
CLICKLOG_VARIANTS = (*EMBEDDINGS_VARIANTS, *EWB_OFF_VARIANTS)
CLICKLOG_DATA = Path("/tmp/netbench/clicklog.csv")
CLICKLOG_FIELDS = ("user", "item", "publisher", "hour", "device")


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
    groups: dict[tuple[int, str, int, int], list[Variant]] = {}
    for v in variants:
        setting = (v.staleness, v.dense_sync, v.early_write_back, v.prefetch_plans)
        groups.setdefault(setting, []).append(v)
    for (staleness, dense_sync, early, prefetch), members in groups.items():
        variant_job = replace(job, staleness=staleness, dense_sync=dense_sync,
                              early_write_back=early, prefetch_plans=prefetch)  # fmt: skip
        k = rotate % len(members)
        modes = [v.mode for v in members[k:] + members[:k]]
        out = run_local(variant_job, modes, 2, train, test, link_mbit=rate)
        for v in members:
            results[v.name] = out[v.mode]
    return results


Case = tuple[str, TrainingJob, Any, Any]  # name, job (cache sized), training data, held-out


def small_cases(quick: bool, epochs: int) -> list[Case]:
    """The bundled sample (and Avazu head9k): 4 x 128, dim 16, cache 10%, ``epochs``."""
    cases: list[Case] = []
    for name, fmt, train_path, test_path in datasets(quick):
        job = TrainingJob(data=str(train_path), format=fmt, workers=4, batch_size_per_worker=128,
                          epochs=epochs, optimizer="adagrad", embedding_dim=16)  # fmt: skip
        train, test = job.read(), job.read(str(test_path))
        cases.append((name, replace(job, cache_rows=cache_rows_for(train, 0.1)), train, test))
    return cases


def ensure_embeddings_data(path: Path, rows: int) -> None:
    """Generate the Criteo-layout file with benchmarks/gen_criteo.py unless it is there."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"generating {rows:,} rows into {path} (benchmarks/gen_criteo.py)", flush=True)
    generator = Path(__file__).resolve().parent / "gen_criteo.py"
    subprocess.run([sys.executable, str(generator), "--rows", str(rows), "--out", str(path)],
                   check=True)  # fmt: skip


def embeddings_cases(args: argparse.Namespace) -> list[Case]:
    """The papers' shape: the first ``--iterations`` global batches of the generated file,
    streamed, one case per (dim, hidden widths); cache 10% of their distinct keys; the next
    ``--eval-rows`` rows held out."""
    ensure_embeddings_data(args.data_file, args.data_rows)
    base = TrainingJob(data=str(args.data_file), format="criteo", workers=4,
                       batch_size_per_worker=args.batch_per_worker, iterations=args.iterations,
                       epochs=1, optimizer="adagrad")  # fmt: skip
    train_rows = args.iterations * base.global_batch
    base = replace(base, max_rows=train_rows)
    profile = first_pass(base.data_spec(), "first pass")
    if profile.rows < train_rows:
        raise SystemExit(f"{args.data_file} has {profile.rows:,} rows, fewer than "
                         f"--iterations x 4 x --batch-per-worker = {train_rows:,}: "
                         "generate more with --data-rows (and delete the file)")  # fmt: skip
    stats = tuple(s.to_dict() for s in profile.dense_stats)
    base = replace(base, dense_stats=stats or None, train_rows=profile.rows,
                   distinct_keys=profile.total_distinct_keys,
                   dense_transforms=base.data_spec().transforms() or None,
                   cache_rows=cache_rows_for(profile.total_distinct_keys, 0.1))  # fmt: skip
    held_out = replace(base.data_spec(str(args.data_file), start_row=train_rows),
                       stop_row=train_rows + args.eval_rows)  # fmt: skip
    cases: list[Case] = []
    for dim in args.dims:
        for hidden in args.hidden:
            job = replace(base, embedding_dim=dim, hidden=hidden)
            train = StreamedBatches(job.data_spec(), profile.rows, job.global_batch,
                                    job.iterations, 1)  # fmt: skip
            name = f"criteo gen, dim {dim}, hidden {','.join(map(str, hidden)) or 'none'}"
            cases.append((name, job, train, held_out))
    return cases


def clicklog_cases(args: argparse.Namespace) -> list[Case]:
    """Issue 25's click log: 100,000 rows of five categorical fields (generated if missing,
    with 10,000 held-out rows beside them), 4 x 128, cache 10%, ``--iterations`` (30)."""
    test_file = CLICKLOG_DATA.with_name("clicklog_test.csv")
    generator = Path(__file__).resolve().parent / "gen_clicklog.py"
    for path, rows, seed in ((CLICKLOG_DATA, 100_000, 0), (test_file, 10_000, 1)):
        if not path.exists():
            subprocess.run([sys.executable, str(generator), "--rows", str(rows), "--seed",
                            str(seed), "--out", str(path)], check=True)  # fmt: skip
    job = TrainingJob(data=str(CLICKLOG_DATA), format="csv", sparse_columns=CLICKLOG_FIELDS,
                      label_column="click", workers=4, batch_size_per_worker=128,
                      iterations=args.iterations or 30, optimizer="adagrad")  # fmt: skip
    train, test = job.read(), job.read(str(test_file))
    job = replace(job, cache_rows=cache_rows_for(train, 0.1))
    return [("clicklog", job, train, test)]


def hidden_widths(text: str) -> list[tuple[int, ...]]:
    """``--hidden 64,32/1024,1024``: one MLP per ``/``-separated item."""
    return [tuple(int(w) for w in item.split(",") if w) for item in text.split("/")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("small", "embeddings", "clicklog"), default="small",
                        help="small: bundled sample and Avazu head9k, dim 16, 4 x 128 (default); "
                        "embeddings: generated Criteo, dim 64, 4 x 1024, streamed")  # fmt: skip
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
    parser.add_argument("--look-ahead", type=look_ahead, default=1, metavar="K",
                        help="every variant's scheduler sees this many batches beyond the plan "
                        "it releases, 1 (the default) to 32")  # fmt: skip
    parser.add_argument("--prefetch-plans", type=prefetch_plans, default=1, metavar="P",
                        help="above 1: also herald_pipelined with --prefetch-plans P "
                        "(plans t+1 .. t+P flow while t trains)")  # fmt: skip
    parser.add_argument("--output", type=Path, default=None,
                        help="default benchmarks/results/bench_network.json "
                        "(embeddings: bench_network_embeddings.json)")  # fmt: skip
    group = parser.add_argument_group("--shape embeddings")
    group.add_argument(
        "--data-file",
        type=Path,
        default=EMBEDDINGS_DATA,
        help=f"Criteo-layout TSV, generated if missing (default {EMBEDDINGS_DATA})",
    )
    group.add_argument(
        "--data-rows",
        type=int,
        default=EMBEDDINGS_ROWS,
        help="rows to generate when --data-file is missing (default 2,000,000)",
    )
    group.add_argument(
        "--iterations", type=int, default=None,
        help="global batches trained per run (default 12; clicklog 30)",
    )  # fmt: skip
    group.add_argument("--batch-per-worker", type=int, default=1024, help="default 1024")
    group.add_argument(
        "--with-ewb-off",
        action="store_true",
        help="also herald and herald_pipelined with early write-backs off",
    )
    group.add_argument("--dims", default="64", help="embedding dims, comma-separated (64)")
    group.add_argument(
        "--hidden", default="64,32", help="MLP widths; several MLPs separated by / (default 64,32)"
    )
    group.add_argument(
        "--eval-rows",
        type=int,
        default=20_000,
        help="held-out rows after the training rows (default 20,000)",
    )
    parser.add_argument("--replot", type=Path, nargs="+", default=None, metavar="JSON",
                        help="run nothing: draw the crossover plot of these results together "
                        "(next to --output)")  # fmt: skip
    args = parser.parse_args()
    if args.replot:
        return replot(args.replot, args.output or RESULTS / "bench_network.json")
    embeddings = args.shape == "embeddings"
    clicklog = args.shape == "clicklog"
    if embeddings and args.iterations is None:
        args.iterations = 12
    args.dims = [int(d) for d in args.dims.split(",")]
    args.hidden = hidden_widths(args.hidden)
    default_name = f"bench_network_{args.shape}.json" if args.shape != "small" else (
        "bench_network.json")  # fmt: skip
    output: Path = args.output or RESULTS / default_name
    rates = RATES if args.rates is None else tuple(float(r) for r in args.rates.split(","))
    if args.quick and args.rates is None:
        rates = (10.0, 1000.0)
    if clicklog and args.rates is None:
        rates = (2.0,)
    epochs = args.epochs or (1 if args.quick else 3)
    variants = EMBEDDINGS_VARIANTS if embeddings else CLICKLOG_VARIANTS if clicklog else VARIANTS
    if embeddings and args.with_ewb_off:
        variants = (*EMBEDDINGS_VARIANTS, *EWB_OFF_VARIANTS)
    if embeddings:
        cases = embeddings_cases(args)
    elif clicklog:
        cases = clicklog_cases(args)
    else:
        cases = small_cases(args.quick, epochs)
    if args.prefetch_plans > 1:
        p = args.prefetch_plans
        variants = (*variants, Variant(f"herald_pipelined P={p}", PIPELINED_MODE, prefetch_plans=p))
    cases = [(name, replace(job, look_ahead=args.look_ahead), train, test)
             for name, job, train, test in cases]  # fmt: skip
    config = run_config(args, cases, epochs, rates)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for name, job, train, test in cases:
        for rate in rates:
            repeats = [run_rate(job, train, test, rate, variants, rotate=k)
                       for k in range(max(1, args.repeats))]  # fmt: skip
            rows += rate_rows(name, rate, variants, repeats)
            write(output, rows, config, started)  # partial survives
    print(f"look-ahead {args.look_ahead} (batches each scheduler sees beyond its plan)")
    print_table(rows)
    write(output, rows, config, started)
    plot(rows, output.with_suffix(".png"))
    crossover = output.with_name(output.stem + "_crossover.png")
    plot_crossover(rows, crossover)
    print(f"wrote {output}, {output.with_suffix('.png')} and {crossover}")
    return 0


def replot(paths: list[Path], output: Path) -> int:
    """The crossover plot of several runs' results together, each row tagged with its file."""
    rows = [{**r, "run": path.name} for path in paths
            for r in json.loads(path.read_text())["results"]]  # fmt: skip
    crossover = output.with_name(output.stem + "_crossover.png")
    plot_crossover(rows, crossover)
    print(f"wrote {crossover}")
    return 0


def rate_rows(
    name: str, rate: float, variants: tuple[Variant, ...], repeats: list[dict[str, ModeResult]]
) -> list[dict[str, Any]]:
    """One row per variant at one rate: medians over the repeats of the median-iteration and
    whole-run samples/s, each with its ratio to naive's; the other figures from the first run."""
    reports = [{v.name: rep[v.name].report() for v in variants} for rep in repeats]
    speeds = {v.name: [rep[v.name]["samples_per_second_median"] for rep in reports]
              for v in variants}  # fmt: skip
    whole = {v.name: [rep[v.name]["samples_per_second"] for rep in reports] for v in variants}
    base, whole_base = float(np.median(speeds["naive"])), float(np.median(whole["naive"]))
    rows = []
    for variant in variants:
        r = reports[0][variant.name]
        speed, whole_speed = (
            float(np.median(speeds[variant.name])),
            float(np.median(whole[variant.name])),
        )
        embedding_bytes = r["bytes_moved_with_flush"]
        rows.append({
            "data": name, "link_mbit": rate, "variant": variant.name,
            "samples_per_second": speed, "samples_per_second_runs": speeds[variant.name],
            "vs_naive": speed / base if base else float("nan"),
            "samples_per_second_whole": whole_speed,
            "samples_per_second_whole_runs": whole[variant.name],
            "whole_vs_naive": whole_speed / whole_base if whole_base else float("nan"),
            "network_share": r["network_share"],
            "phases_median": r["phases_median"],
            "rows_moved": r["moved_with_flush"], "bytes_moved": embedding_bytes,
            "dense_bytes": r["dense_bytes"],
            "embedding_share": embedding_share(embedding_bytes, r["dense_bytes"]),
            "final_flush_rows": r["final_flush"], "logloss": r["logloss"], "auc": r["auc"],
            **flush_seconds(r["per_iteration"]),
            **link_figures(repeats[0][variant.name], rate),
        })  # fmt: skip
        print_row(rows[-1])
    return rows


def flush_seconds(per_iteration: list[dict[str, Any]]) -> dict[str, float]:
    """The last iteration's time (the slowest worker's, final flush included), the median
    iteration's, and the final flush's time: the difference, clipped at 0."""
    periods = [row["period"] for row in per_iteration]
    median = float(np.median(periods[1:-1] or periods))
    last = float(periods[-1]) if periods else 0.0
    return {"last_iteration_s": last, "median_iteration_s": median,
            "final_flush_s": max(0.0, last - median)}  # fmt: skip


def embedding_share(embedding_bytes: float, dense_bytes: float) -> float:
    """Embedding rows' share of the bytes a run moves (rows vs the dense all-reduce)."""
    total = embedding_bytes + dense_bytes
    return embedding_bytes / total if total else float("nan")


def run_config(
    args: argparse.Namespace, cases: list[Case], epochs: int, rates: tuple[float, ...]
) -> dict[str, Any]:
    """What the JSON records about the run's settings."""
    job = cases[0][1]
    config: dict[str, Any] = {
        "shape": args.shape, "workers": job.workers,
        "batch_size_per_worker": job.batch_size_per_worker, "optimizer": job.optimizer,
        "shards": 2, "cache_fraction": 0.1, "rates_mbit": list(rates), "repeats": args.repeats,
        "look_ahead": job.look_ahead,
    }  # fmt: skip
    if args.shape == "embeddings":
        config.update(data_file=str(args.data_file), train_rows=job.train_rows,
                      distinct_keys=job.distinct_keys, cache_rows=job.cache_rows,
                      iterations=job.iterations, eval_rows=args.eval_rows, dims=args.dims,
                      hidden=[list(h) for h in args.hidden])  # fmt: skip
    else:
        config.update(embedding_dim=job.embedding_dim, epochs=epochs, iterations=job.iterations)
    return config


def write(path: Path, rows: list[dict[str, Any]], config: dict[str, Any], started: float) -> None:
    load = os.getloadavg()
    machine = {"python": platform.python_version(), "numpy": np.__version__,
               "processor": platform.processor(), "cpus": os.cpu_count(),
               "minutes": (time.perf_counter() - started) / 60,
               "load_average": [round(x, 2) for x in load]}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "config": config, "results": rows},
                               indent=2) + "\n")  # fmt: skip


def print_row(r: dict[str, Any]) -> None:
    print(f"  {r['data']} @ {r['link_mbit']:g} Mbit/s  {r['variant']:<18} "
          f"{r['samples_per_second']:8,.0f} samples/s  x{r['vs_naive']:.2f}  "
          f"whole run {r['samples_per_second_whole']:8,.0f}  x{r['whole_vs_naive']:.2f}  "
          f"final flush {r['final_flush_rows']:,} rows {r['final_flush_s']:.2f} s  "
          f"net {100 * r['network_share']:.0f}%  "
          f"embeddings {100 * r['embedding_share']:.0f}% of bytes", flush=True)  # fmt: skip


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| data | Mbit/s | variant | samples/s | vs naive | whole run | vs naive | net % | "
        "MiB embeddings / dense | KiB/worker link | KiB/PS link | busiest link | logloss |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['data']} | {r['link_mbit']:g} | {r['variant']} | "
            f"{r['samples_per_second']:,.0f} | {r['vs_naive']:.2f} | "
            f"{r['samples_per_second_whole']:,.0f} | {r['whole_vs_naive']:.2f} | "
            f"{100 * r['network_share']:.0f} | "
            f"{r['bytes_moved'] / 2**20:,.1f} / {r['dense_bytes'] / 2**20:,.1f} | "
            f"{r['worker_link_bytes'] / 1024:,.0f} | "
            f"{r['ps_link_bytes'] / 1024:,.0f} | {100 * r['busiest_link_utilization']:.0f}% | "
            f"{r['logloss']:.4f} |"
        )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = headless_pyplot()

    data = sorted({r["data"] for r in rows})
    fig, axes = plt.subplots(1, len(data), figsize=(7 * len(data), 4.8), squeeze=False)
    for ax, name in zip(axes[0], data, strict=True):
        for variant in (*VARIANTS, *EWB_OFF_VARIANTS):
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


def crossover_points(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per variant other than naive (all-reduce variants only, at every rate): its whole-run
    speed-up over naive against naive's embedding share of the bytes in the same (data, rate),
    sorted by share. Naive's share, because it is the traffic Herald has to work with. Rows
    of several runs (``--replot``) carry ``run``: each is paired with its own run's naive."""
    naive = {(r.get("run"), r["data"], r["link_mbit"]): r for r in rows if r["variant"] == "naive"}
    dense_at_ps = {v.name for v in VARIANTS if v.dense_sync == "ps"}
    points: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        base = naive.get((r.get("run"), r["data"], r["link_mbit"]))
        if r["variant"] == "naive" or r["variant"] in dense_at_ps or base is None:
            continue
        label = f"{r['variant']} @ {r['link_mbit']:g} Mbit/s"
        points.setdefault(label, []).append((base["embedding_share"], r["whole_vs_naive"]))
    return {label: sorted(p) for label, p in sorted(points.items())}


def plot_crossover(rows: list[dict[str, Any]], path: Path) -> None:
    """Herald's whole-run speed-up over naive against the embedding share of the bytes."""
    plt = headless_pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.8))
    for label, points in crossover_points(rows).items():
        shares, speedups = zip(*points, strict=True)
        ax.plot([100 * s for s in shares], speedups, marker="o", label=label)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle=":")
    ax.set(title="speed-up over naive vs embedding share of the bytes",
           xlabel="embedding rows' share of the bytes moved (naive), %",
           ylabel="whole-run samples/s / naive's")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
