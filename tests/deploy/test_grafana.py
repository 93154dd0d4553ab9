"""deploy/grafana/: provisioning files and the dashboard's JSON model.

The dashboard's queries are run against a live cluster in test_prometheus.py; here:
the JSON is what tools/gen_dashboard.py generates, and it is a valid Grafana model
(schema version, unique ids, panels on the 24-column grid without overlaps, every
query on the provisioned datasource).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.deploy.observability import (
    DASHBOARD,
    DASHBOARD_PROVIDERS,
    DATASOURCES,
    ROOT,
    load_yaml,
)

PANEL_TYPES = {"row", "timeseries", "stat", "bargauge", "table", "gauge"}


def test_dashboard_is_generated_by_the_script() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_dashboard.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_datasource_is_the_compose_prometheus_with_a_fixed_uid() -> None:
    config = load_yaml(DATASOURCES)
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert source["uid"] == "heraldps-prometheus"
    assert source["isDefault"] is True


def test_dashboard_provider_loads_files_from_the_documented_mount() -> None:
    config = load_yaml(DASHBOARD_PROVIDERS)
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def _panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in model["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows nest their panels
    return out


def test_dashboard_is_a_valid_grafana_model() -> None:
    model = json.loads(DASHBOARD.read_text())
    uid = load_yaml(DATASOURCES)["datasources"][0]["uid"]
    assert model["uid"] == "heraldps" and model["title"]
    assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
    panels = _panels(model)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        assert panel["type"] in PANEL_TYPES, panel
        pos = panel["gridPos"]
        assert set(pos) == {"h", "w", "x", "y"}
        assert pos["w"] >= 1 and pos["h"] >= 1 and pos["x"] >= 0 and pos["y"] >= 0
        assert pos["x"] + pos["w"] <= 24, f"{panel['title']} is wider than the grid"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid
        assert panel["targets"], f"{panel['title']} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": uid}
            assert target["expr"].strip()


def test_dashboard_has_the_four_sections() -> None:
    model = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in model["panels"] if p["type"] == "row"]
    assert rows == ["Cluster overview", "PS shards", "Scheduler", "Workers"]
    titles = {p["title"] for p in _panels(model)}
    for needed in (
        "Iterations/s",
        "Samples/s",
        "Request latency",
        "Commit time",
        "Assignment locality",
        "Predicted vs actual rows/s",
        "Cache hit ratio",
        "HET staleness",
        "Bytes moved/s",
        "Rows moved vs naive (Table 1, live)",
    ):
        assert needed in titles
