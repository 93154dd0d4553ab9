"""What ``heraldps local`` shows and writes: the table per mode, the JSON, the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from worker_client.local import ModeResult


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def summary_table(results: dict[str, ModeResult]) -> Table:
    """One row per mode; ratios against naive when naive ran."""
    reports = {mode: r.report() for mode, r in results.items()}
    base = reports.get("naive")
    table = Table(title="heraldps local: traffic and quality per mode")
    for column in ("mode", "samples/s", "pulled rows", "pushed rows", "of which written back",
                   "final flush",
                   "MiB pulled", "MiB pushed", "pull", "push", "overall", "AUC", "logloss",
                   "PS agrees"):  # fmt: skip
        table.add_column(column, justify="left" if column == "mode" else "right")
    for mode, r in reports.items():
        total = r["pulls"] + r["pushes"]
        ratios = ["-", "-", "-"]
        if base is not None:
            ratios = [
                _ratio(r["pulls"], base["pulls"]),
                _ratio(r["pushes"], base["pushes"]),
                _ratio(total, base["pulls"] + base["pushes"]),
            ]
        table.add_row(
            mode, f"{r['samples_per_second']:,.0f}", f"{r['pulls']:,}", f"{r['pushes']:,}",
            f"{r['write_backs']:,}", f"{r['final_flush']:,}", _mib(r["bytes_pulled"]),
            _mib(r["bytes_pushed"]), *ratios,
            f"{r['auc']:.4f}", f"{r['logloss']:.4f}",
            "yes" if ps_agrees(results[mode]) else "NO",
        )  # fmt: skip
    return table


def ps_agrees(result: ModeResult) -> bool:
    """The shards' counters equal what the workers counted from their own RPCs."""
    t, ps = result.traffic, result.ps_counted
    if result.mode == "het":  # HET's final flush is a gradient push
        return bool(
            ps["pulls"] == t["pulls"]
            and ps["grad_pushes"] == t["grad_pushes"] + t["final_flush"]
            and ps["write_backs"] == t["write_backs"]
            and ps["version_checks"] == t["version_checks"]
        )
    return bool(
        ps["pulls"] == t["pulls"]
        and ps["grad_pushes"] == t["grad_pushes"]
        and ps["write_backs"] == t["write_backs"] + t["final_flush"]
    )


def write_json(results: dict[str, ModeResult], config: dict[str, Any], path: str) -> None:
    out = {"config": config, "modes": {mode: r.report() for mode, r in results.items()}}
    Path(path).write_text(json.dumps(out, indent=2, default=float) + "\n")


def write_plot(results: dict[str, ModeResult], path: str) -> None:
    """Rows moved per iteration and training loss per iteration, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (traffic_ax, loss_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, result in results.items():
        steps = list(range(len(result.per_iteration)))
        moved = [
            row["pulls"] + row["grad_pushes"] + row["write_backs"] for row in result.per_iteration
        ]
        traffic_ax.plot(steps, moved, label=mode)
        loss_ax.plot(steps, [row["loss"] for row in result.per_iteration], label=mode)
    traffic_ax.set(title="embedding rows moved per iteration", xlabel="iteration", ylabel="rows")
    loss_ax.set(title="training loss (global batch mean)", xlabel="iteration", ylabel="logloss")
    for ax in (traffic_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
