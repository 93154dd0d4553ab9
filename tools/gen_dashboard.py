"""Generate the Grafana dashboard deploy/grafana/dashboards/heraldps.json.

    python tools/gen_dashboard.py          # writes the dashboard
    python tools/gen_dashboard.py --check  # exit 1 if the checked-in file differs

Panels are listed here as (title, queries, unit) and laid out on Grafana's
24-column grid, so adding a panel never means editing coordinates by hand.
tests/deploy/test_grafana.py fails when the checked-in JSON drifts from this
script; tests/deploy/test_prometheus.py runs every query against a live cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "deploy" / "grafana" / "dashboards" / "heraldps.json"
DATASOURCE = {"type": "prometheus", "uid": "heraldps-prometheus"}  # provisioning/datasources
RATE = "$__rate_interval"
PANEL_WIDTH, PANEL_HEIGHT, PER_LINE = 8, 8, 3


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat", "bargauge"
    options: dict[str, Any] = field(default_factory=dict)
    limits: tuple[float, float] | None = None  # axis / gauge (min, max)


def quantiles(metric: str, by: str, legend: str) -> tuple[Query, ...]:
    """p50 and p99 of a histogram, per ``by`` labels."""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{RATE}])))",
            f"p{round(q * 100)} {legend}",
        )
        for q in (0.5, 0.99)
    )


def rate_by(metric: str, by: str, selector: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{selector}[{RATE}]))"


CLUSTER = [
    Panel(
        "Iterations/s",
        "Iterations committed on every PS shard per second (the BSP barrier's pace).",
        (Query(f"sum(rate(heraldps_scheduler_commits_total[{RATE}]))", "iterations/s"),),
        "short",
    ),
    Panel(
        "Samples/s",
        "Samples trained per second, all workers, by mode.",
        (Query(rate_by("heraldps_worker_samples_total", "mode"), "{{mode}}"),),
        "short",
    ),
    Panel(
        "Training loss",
        "Mean loss of each worker's last mini-batch.",
        (Query("avg by (mode) (heraldps_worker_loss)", "{{mode}}"),),
        "short",
    ),
    Panel(
        "Committed iteration",
        "Last iteration the scheduler committed on every shard.",
        (Query("max(heraldps_scheduler_committed_iteration)", "iteration", instant=True),),
        "none",
        "stat",
    ),
    Panel(
        "Since last commit",
        "Seconds since the last commit; HeraldPSIterationStalled fires above 10 minutes "
        "while workers wait.",
        (
            Query(
                "time() - max(heraldps_scheduler_last_commit_timestamp_seconds)",
                "seconds",
                instant=True,
            ),
        ),
        "s",
        "stat",
    ),
    Panel(
        "Targets up",
        "Processes Prometheus can scrape, by job (workers exit when training ends).",
        (Query('sum by (job) (up{job=~"heraldps-.*"})', "{{job}}", instant=True),),
        "none",
        "stat",
    ),
]

PS = [
    Panel(
        "Pulled rows/s",
        "Rows answered by Pull, per shard and table.",
        (
            Query(
                rate_by("heraldps_ps_pull_keys_total", "shard, table"), "shard {{shard}} {{table}}"
            ),
        ),
    ),
    Panel(
        "Pushed gradient rows/s",
        "Gradient rows received by PushGradients, per shard and table.",
        (
            Query(
                rate_by("heraldps_ps_push_keys_total", "shard, table"), "shard {{shard}} {{table}}"
            ),
        ),
    ),
    Panel(
        "Written-back rows/s",
        "Rows stored by WriteBack (Herald's on-demand synchronisation), per shard and table.",
        (
            Query(
                rate_by("heraldps_ps_write_back_keys_total", "shard, table"),
                "shard {{shard}} {{table}}",
            ),
        ),
    ),
    Panel(
        "Request latency",
        "RPC handling time on the shards, p50 and p99, by method.",
        quantiles("heraldps_ps_request_seconds", "method", "{{method}}"),
        "s",
    ),
    Panel(
        "Commit time",
        "Time to apply one Commit, p50 and p99, per shard. HeraldPSCommitLatencyHigh fires when "
        "p99 stays above 2.5 s.",
        quantiles("heraldps_ps_commit_seconds", "shard", "shard {{shard}}"),
        "s",
    ),
    Panel(
        "RPCs/s by code",
        "RPCs handled per second, by method and status code.",
        (Query(rate_by("heraldps_ps_requests_total", "method, code"), "{{method}} {{code}}"),),
        "reqps",
    ),
    Panel(
        "Rows held",
        "Rows each shard holds, per table.",
        (Query("sum by (shard, table) (heraldps_ps_rows)", "shard {{shard}} {{table}}"),),
    ),
    Panel(
        "Bytes held",
        "Bytes each shard's tables hold (rows, index, gradient buffers) and the memory limit "
        "(0: none).",
        (
            Query("sum by (shard) (heraldps_ps_bytes)", "shard {{shard}}"),
            Query("max by (shard) (heraldps_ps_memory_limit_bytes)", "limit shard {{shard}}"),
        ),
        "bytes",
    ),
    Panel(
        "HET clock checks/s",
        "Keys whose clock GetVersions answered (HET's CheckValid), per shard.",
        (Query(rate_by("heraldps_ps_version_check_keys_total", "shard"), "shard {{shard}}"),),
    ),
]

SCHEDULER = [
    Panel(
        "Plan latency",
        "Partition + plan time of one batch (Herald Algorithm 1 and on-demand sync), p50 and p99.",
        quantiles("heraldps_scheduler_plan_seconds", "mode", "{{mode}}"),
        "s",
    ),
    Panel(
        "Workers' wait for plans",
        "From a worker's report to its next plan leaving the scheduler (the barrier), p50 and "
        "p99, per worker.",
        quantiles("heraldps_scheduler_plan_wait_seconds", "worker", "worker {{worker}}"),
        "s",
    ),
    Panel(
        "Assignment locality",
        "Share of samples (with any key cached somewhere) sent to a worker that holds the most "
        "of their keys validly. Location-aware partitioning raises it; sequential is the "
        "baseline.",
        (
            Query(
                f"{rate_by('heraldps_scheduler_local_samples_total', 'mode')} / "
                f"{rate_by('heraldps_scheduler_held_samples_total', 'mode')}",
                "{{mode}}",
            ),
        ),
        "percentunit",
        limits=(0.0, 1.0),
    ),
    Panel(
        "Predicted vs actual rows/s",
        "Rows the plans list (predicted) and rows the workers report moving (actual), by kind. "
        "In Herald modes they are equal.",
        (
            Query(rate_by("heraldps_scheduler_planned_rows_total", "kind"), "planned {{kind}}"),
            Query(
                rate_by(
                    "heraldps_scheduler_reported_rows_total",
                    "kind",
                    '{kind=~"pull|grad_push|write_back"}',
                ),
                "reported {{kind}}",
            ),
        ),
    ),
    Panel(
        "Backlog",
        "Planned iterations not yet committed (the feeder is held back at --max-backlog).",
        (Query("max(heraldps_scheduler_backlog)", "backlog"),),
        "none",
    ),
    Panel(
        "Predicted cache hit ratio",
        "The scheduler mirror's share of each worker's trained rows that were valid in its "
        "cache, last iteration.",
        (Query("max by (worker) (heraldps_scheduler_cache_hit_ratio)", "worker {{worker}}"),),
        "percentunit",
        limits=(0.0, 1.0),
    ),
    Panel(
        "Naive rows/s (baseline)",
        "Rows mode naive would move on the same batches (the scheduler's naive shadow), by kind.",
        (Query(rate_by("heraldps_scheduler_naive_rows_total", "kind"), "naive {{kind}}"),),
    ),
]

WORKERS = [
    Panel(
        "Rows moved vs naive (Table 1, live)",
        "Herald Table 1 on the running job: rows pulled, pushed (gradients + write-backs) and "
        "overall, relative to naive on the same batches (1 = naive; final flush excluded). "
        "From the recording rules over 5 minutes.",
        (
            Query("mode:heraldps_pull_vs_naive:ratio_rate5m", "pull {{mode}}", instant=True),
            Query("mode:heraldps_push_vs_naive:ratio_rate5m", "push {{mode}}", instant=True),
            Query("mode:heraldps_traffic_vs_naive:ratio_rate5m", "overall {{mode}}", instant=True),
        ),
        "percentunit",
        "bargauge",
        {"displayMode": "basic", "orientation": "horizontal"},
        (0.0, 1.5),
    ),
    Panel(
        "Rows moved/s",
        "Embedding rows the workers moved, by mode and kind (version_check: HET clock checks).",
        (Query(rate_by("heraldps_worker_rows_total", "mode, kind"), "{{mode}} {{kind}}"),),
    ),
    Panel(
        "Bytes moved/s",
        "Payload bytes of embedding rows moved (keys, versions, values, optimizer state), by "
        "mode and kind.",
        (Query(rate_by("heraldps_worker_bytes_total", "mode, kind"), "{{mode}} {{kind}}"),),
        "Bps",
    ),
    Panel(
        "Cache hit ratio",
        "Share of each worker's trained rows found usable in its cache (no pull).",
        (
            Query(
                f"{rate_by('heraldps_worker_cache_hits_total', 'worker, mode')} / "
                f"{rate_by('heraldps_worker_cache_lookups_total', 'worker, mode')}",
                "worker {{worker}} {{mode}}",
            ),
        ),
        "percentunit",
        limits=(0.0, 1.0),
    ),
    Panel(
        "Cache occupancy",
        "Rows held and rows dirty (newer than the PS), as a share of each worker's cache.",
        (
            Query(
                "max by (worker) (heraldps_worker_cache_rows) / "
                "max by (worker) (heraldps_worker_cache_capacity_rows)",
                "held worker {{worker}}",
            ),
            Query(
                "max by (worker) (heraldps_worker_cache_dirty_rows) / "
                "max by (worker) (heraldps_worker_cache_capacity_rows)",
                "dirty worker {{worker}}",
            ),
        ),
        "percentunit",
        limits=(0.0, 1.0),
    ),
    Panel(
        "Iteration time",
        "Plan received to report sent, p50 and p99, per worker.",
        quantiles("heraldps_worker_iteration_seconds", "worker", "worker {{worker}}"),
        "s",
    ),
    Panel(
        "Where an iteration goes",
        "Seconds per iteration in each phase, all workers averaged (docs/workers.md, 'Where an "
        "iteration goes'): plan_wait and peer_wait are barriers; pull, dense_pull, push, "
        "write_back, dense_push and report are RPCs, the network's share.",
        (
            Query(
                f"sum by (phase) (rate(heraldps_worker_phase_seconds_sum[{RATE}])) / "
                f"ignoring(phase) group_left sum(rate(heraldps_worker_iterations_total[{RATE}]))",
                "{{phase}}",
            ),
        ),
        "s",
        options={"stacking": "normal"},
    ),
    Panel(
        "HET staleness",
        "Per worker: cached rows found more than s behind the PS (refetched), rows released "
        "after more than s local updates, per second; and the bound s.",
        (
            Query(rate_by("heraldps_worker_stale_rows_total", "worker"), "stale worker {{worker}}"),
            Query(
                rate_by("heraldps_worker_bound_releases_total", "worker"),
                "released worker {{worker}}",
            ),
            Query("max by (worker) (heraldps_worker_staleness_bound)", "s worker {{worker}}"),
        ),
    ),
    Panel(
        "HET stale share",
        "Share of the cached rows each worker checked that were beyond the bound. "
        "HeraldPSStalenessBoundHit fires above 50% for 10 minutes.",
        (
            Query(
                rate_by("heraldps_worker_stale_rows_total", "worker")
                + " / "
                + rate_by("heraldps_worker_rows_total", "worker", '{kind="version_check"}'),
                "worker {{worker}}",
            ),
        ),
        "percentunit",
        limits=(0.0, 1.0),
    ),
    Panel(
        "Last iteration per worker",
        "Last iteration each worker reported: a worker far behind the others is the straggler.",
        (Query("max by (worker) (heraldps_worker_last_iteration)", "worker {{worker}}"),),
        "none",
    ),
]

ROWS = [
    ("Cluster overview", CLUSTER),
    ("PS shards", PS),
    ("Scheduler", SCHEDULER),
    ("Workers", WORKERS),
]


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.limits is not None:
        defaults["min"], defaults["max"] = panel.limits
    if "stacking" in panel.options:  # a stacked time series (parts of one whole)
        defaults["custom"] = {"stacking": {"mode": panel.options["stacking"], "group": "A"},
                              "fillOpacity": 60}  # fmt: skip
    targets = [
        {
            "datasource": DATASOURCE,
            "refId": chr(ord("A") + i),
            "expr": q.expr,
            "legendFormat": q.legend,
            "instant": q.instant,
            "range": not q.instant,
        }
        for i, q in enumerate(panel.queries)
    ]
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": PANEL_HEIGHT, "w": PANEL_WIDTH, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": targets,
    }
    if panel.kind == "timeseries":
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}}
    elif panel.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    else:
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, **panel.options}
    return out


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (schemaVersion 39, Grafana 10.x and 11.x)."""
    panels: list[dict[str, Any]] = []
    y, panel_id = 0, 1
    for title, row in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id, y = panel_id + 1, y + 1
        for i, panel in enumerate(row):
            x = (i % PER_LINE) * PANEL_WIDTH
            line_y = y + (i // PER_LINE) * PANEL_HEIGHT
            panels.append(_panel_json(panel, panel_id, x, line_y))
            panel_id += 1
        y += -(-len(row) // PER_LINE) * PANEL_HEIGHT
    return {
        "uid": "heraldps",
        "title": "heraldps",
        "description": "PS shards, the Herald scheduler and workers of a heraldps cluster "
        "(docs/observability.md).",
        "tags": ["heraldps"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "templating": {"list": []},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date: run python tools/gen_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
