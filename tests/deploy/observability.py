"""The PromQL in deploy/: every query of the Grafana dashboard and of the Prometheus rules."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES = PROMETHEUS_DIR / "rules.yml"
RULES_TEST = PROMETHEUS_DIR / "tests" / "rules_test.yml"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "heraldps.json"
DATASOURCES = GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = GRAFANA_DIR / "provisioning" / "dashboards" / "heraldps.yml"

# Grafana's built-in variables, as concrete values for Prometheus' HTTP API. The test
# scrapes every second, so one minute always spans enough samples for rate().
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}


@dataclass(frozen=True)
class Expression:
    where: str  # e.g. "dashboard panel 'Samples/s' A" or "rule HeraldPSShardDown"
    promql: str
    alert: bool = False


def prometheus_api(base_url: str, path: str, **params: str) -> Any:
    """``data`` of one call of Prometheus' HTTP API (``/api/v1/<path>``); a failed call
    raises AssertionError with Prometheus' error."""
    url = f"{base_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
    except urllib.error.HTTPError as err:
        body = json.loads(err.read())
    if body["status"] != "success":
        raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def scrape_targets() -> set[str]:
    """Every target of deploy/prometheus/prometheus.yml, as written (``ps-0:9100``, ...)."""
    return {
        target
        for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]
        for group in job.get("static_configs", [])
        for target in group["targets"]
    }


def scraping_every(interval: str, rule_file: str) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml scraping and evaluating every ``interval`` (a test's
    run lasts seconds) with its rules read from ``rule_file``; scrape jobs as they are."""
    config: dict[str, Any] = load_yaml(PROMETHEUS_CONFIG)
    config["global"].update(
        scrape_interval=interval, scrape_timeout=interval, evaluation_interval=interval
    )
    config["rule_files"] = [rule_file]
    return config


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def dashboard_expressions() -> list[Expression]:
    """Every target of every panel, Grafana variables replaced by concrete values."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            if "$" in expr:
                raise AssertionError(f"panel {panel['title']!r}: unknown variable in {expr!r}")
            out.append(Expression(f"dashboard panel {panel['title']!r} {target['refId']}", expr))
    return out


def rule_expressions() -> list[Expression]:
    out = []
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            out.append(Expression(f"rule {name}", rule["expr"].strip(), "alert" in rule))
    return out


_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)")


def comparisons_as_bool(promql: str) -> str:
    """``a > 0.9`` -> ``a > bool 0.9``: every series the comparison looks at, valued 0 or 1.

    An alert's expression returns nothing while all is well; with ``bool`` it returns
    one series per compared series, which shows that the metrics and labels it names
    exist. Label matchers (inside ``{}``) and strings are left alone.
    """
    out, depth, quote, i = [], 0, "", 0
    while i < len(promql):
        c = promql[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(promql[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif c == "{":
            depth += 1
            out.append(c)
        elif c == "}":
            depth -= 1
            out.append(c)
        elif depth == 0 and (m := _COMPARISON.match(promql, i)):
            i += len(m.group(1))
            out.append(m.group(1) + (" bool" if promql[i : i + 1].isspace() else " bool "))
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def runbook_anchors() -> dict[str, str]:
    """Alert name -> the anchor its ``runbook`` annotation points at."""
    out = {}
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                out[rule["alert"]] = rule["annotations"]["runbook"]
    return out


def markdown_anchors(text: str) -> set[str]:
    """GitHub's anchors of the headings of a Markdown text."""
    anchors = set()
    for line in text.splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            title = m.group(1).strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            anchors.add(title.replace(" ", "-"))
    return anchors
