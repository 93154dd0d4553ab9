"""deploy/prometheus/: promtool validates the config and rules and runs the alert unit tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.deploy.observability import (
    PROMETHEUS_CONFIG,
    ROOT,
    RULES,
    RULES_TEST,
    comparisons_as_bool,
    load_yaml,
    markdown_anchors,
    runbook_anchors,
)
from tests.tools import require_tool

RUNBOOKS = "docs/observability.md"
PROMTOOL_HINT = "apt-get install prometheus (Debian's package ships promtool)"


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    tool = require_tool("promtool", PROMTOOL_HINT)
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_config_and_its_rule_file() -> None:
    result = promtool("check", "config", PROMETHEUS_CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_promtool_accepts_the_rules() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_unit_tests_pass() -> None:
    result = promtool("test", "rules", RULES_TEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested_firing() -> None:
    """Each alert has a promtool case where it is expected to fire (not only stay silent)."""
    fired = {
        case["alertname"]
        for test in load_yaml(RULES_TEST)["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert set(runbook_anchors()) <= fired, set(runbook_anchors()) - fired


def test_every_alert_explains_itself_and_links_a_runbook_section() -> None:
    docs = (ROOT / RUNBOOKS).read_text()
    anchors = markdown_anchors(docs)
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            notes = rule["annotations"]
            assert notes.get("summary") and notes.get("description"), rule["alert"]
            page, _, anchor = notes["runbook"].partition("#")
            assert page == RUNBOOKS, notes["runbook"]
            assert anchor in anchors, f"{rule['alert']}: no heading for #{anchor} in the docs"
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]


def test_comparisons_as_bool_leaves_matchers_and_strings_alone() -> None:
    assert comparisons_as_bool('up{job="a",x!="b"} == 0') == 'up{job="a",x!="b"} == bool 0'
    assert comparisons_as_bool("a >= 1 and b<2") == "a >= bool 1 and b< bool 2"
    assert comparisons_as_bool('x{l=~"a|>"} > bool 1') == 'x{l=~"a|>"} > bool 1'
    assert comparisons_as_bool("(m > 0) / n != 3") == "(m > bool 0) / n != bool 3"
