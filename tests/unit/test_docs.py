"""The README a newcomer reads: short, set-up commands as CI runs them, every docs page
linked, every relative link and anchor alive, no command that cannot run in a fresh clone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy.observability import markdown_anchors
from tools.readme_check import bash_blocks, quick_start

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_the_readme_is_short_and_links_every_docs_page() -> None:
    assert len(README.splitlines()) <= 375  # 350 until issue 24 added `heraldps train` and BARS
    assert PAGES, "docs/ is empty"
    for page in PAGES:
        assert f"](docs/{page.name}" in README, f"README does not link docs/{page.name}"


def test_the_set_up_commands_are_the_two_ci_runs() -> None:
    assert quick_start(README) == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install . && heraldps local",
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' "
        "&& .venv/bin/python -m pytest -q -n 2 --dist loadgroup",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    for step in ("quickstart 1", "quickstart 2", "run-others"):
        assert f"tools/readme_check.py {step}" in ci


def test_readme_commands_need_nothing_outside_a_fresh_clone() -> None:
    for line, body in bash_blocks(README):
        for outside in ("../shared", "docker", "kubectl", "--device gpu"):
            assert outside not in body, f"README.md:{line} runs {outside!r}: put it in docs/"


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES, ROOT / "CHANGELOG.md"],
                         ids=lambda p: p.name)  # fmt: skip
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: broken link {target}"
        if anchor and file.suffix == ".md":
            assert anchor in markdown_anchors(file.read_text()), f"{page.name}: no #{anchor}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_docs_page_has_a_table_of_contents(page: Path) -> None:
    text = page.read_text()
    headings = [m for m in re.findall(r"^## (.+)$", FENCE.sub("", text), re.MULTILINE)]
    assert "## Contents" in text, page.name
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    for heading in headings:
        if heading != "Contents":
            assert heading in contents, f"{page.name}: '{heading}' missing from its contents"
