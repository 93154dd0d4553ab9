"""What ``heraldps local`` shows and writes: the table per mode and the JSON report.

The default table fits 100 columns (mode, speed, the network's share of an
iteration, rows moved with the final flush, their ratio to naive, MiB, sample
MiB, AUC, logloss); ``--wide`` adds
every count and the ratios without the flush; ``--json`` has all of it per
iteration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from heraldps.modes import mode_named
from launcher.local import ModeResult


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base else "-"


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def summary_table(results: dict[str, ModeResult]) -> Table:
    """One row per mode: what moved (final flush included), how fast, how good."""
    reports = {mode: r.report() for mode, r in results.items()}
    base = reports.get("naive")
    table = Table(title="heraldps local: traffic and quality per mode")
    for column in ("mode", "samples/s", "net %", "rows moved", "vs naive", "MiB", "sample MiB",
                   "AUC", "logloss"):  # fmt: skip
        if column == "mode":  # never cut a mode's name: headers wrap instead
            table.add_column(column, no_wrap=True, min_width=max(map(len, reports), default=4))
        else:
            table.add_column(column, justify="right")
    for mode, r in reports.items():
        vs_naive = _ratio(r["moved_with_flush"], base["moved_with_flush"]) if base else "-"
        table.add_row(
            mode, f"{r['samples_per_second']:,.0f}", f"{100 * r['network_share']:.0f}",
            f"{r['moved_with_flush']:,}", vs_naive, _mib(r["bytes_moved_with_flush"]),
            _mib(r["sample_bytes"]), f"{r['auc']:.4f}", f"{r['logloss']:.4f}",
        )  # fmt: skip
    return table


SUMMARY_KEY = (
    "net % = median share of a worker's iteration spent in RPCs; rows moved = pulls + "
    "gradient pushes + write-backs + final flush (MiB: their payload); sample MiB = samples "
    "sent with the plans"
)


def wide_table(results: dict[str, ModeResult]) -> Table:
    """``--wide``: every count, and the ratios to naive with and without the final flush."""
    reports = {mode: r.report() for mode, r in results.items()}
    base = reports.get("naive")
    table = Table(title="heraldps local: traffic and quality per mode (wide)")
    for column in ("mode", "samples/s", "pulled rows", "pushed rows", "of which written back",
                   "final flush", "MiB pulled", "MiB pushed", "MiB flush", "sample MiB", "pull",
                   "push", "overall", "overall incl. flush", "AUC", "logloss",
                   "PS agrees"):  # fmt: skip
        table.add_column(column, justify="left" if column == "mode" else "right")
    for mode, r in reports.items():
        ratios = ["-"] * 4
        if base is not None:
            ratios = [
                _ratio(r["pulls"], base["pulls"]),
                _ratio(r["pushes"], base["pushes"]),
                _ratio(r["moved"], base["moved"]),
                _ratio(r["moved_with_flush"], base["moved_with_flush"]),
            ]
        table.add_row(
            mode, f"{r['samples_per_second']:,.0f}", f"{r['pulls']:,}", f"{r['pushes']:,}",
            f"{r['write_backs']:,}", f"{r['final_flush']:,}", _mib(r["bytes_pulled"]),
            _mib(r["bytes_pushed"]), _mib(r["bytes_final_flush"]), _mib(r["sample_bytes"]),
            *ratios, f"{r['auc']:.4f}", f"{r['logloss']:.4f}",
            "yes" if ps_agrees(results[mode]) else "NO",
        )  # fmt: skip
    return table


def agreement_line(results: dict[str, ModeResult]) -> str:
    """One line: do the shards' own counters equal what the workers counted?"""
    disagree = [mode for mode, result in results.items() if not ps_agrees(result)]
    if not disagree:
        return "PS agrees: the shards' counters equal the workers' counts in every mode"
    return f"PS DISAGREES in {', '.join(disagree)}: see --json (ps_counted) and the logs"


def ps_agrees(result: ModeResult) -> bool:
    """The shards' counters equal what the workers counted from their own RPCs."""
    t, ps = result.traffic, result.ps_counted
    if mode_named(result.mode).het:  # HET's final flush is a gradient push
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
