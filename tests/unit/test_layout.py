"""The import graph runs one way: common <- each service <- launcher/CLI.

``heraldps`` (common) imports no service package and not the launcher; a
service (``ps_server``, ``scheduler_service``, ``worker_client``) imports only
the common package and itself. Checked on the source, so a lazy import inside a
function counts too. And a shard or scheduler process loads neither the
launcher's display libraries nor another service's modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMON = "heraldps"
SERVICES = ("ps_server", "scheduler_service", "worker_client")
LAUNCHER = "launcher"
PACKAGES = (COMMON, *SERVICES, LAUNCHER)


def imported_packages(package: str) -> dict[str, set[str]]:
    """Our top-level packages each module of ``package`` imports (anywhere in the file)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names & set(PACKAGES)
    return found


@pytest.mark.parametrize("package", [COMMON, *SERVICES])
def test_imports_run_one_way(package: str) -> None:
    allowed = {COMMON} if package == COMMON else {COMMON, package}
    wrong = {
        module: sorted(names - allowed)
        for module, names in imported_packages(package).items()
        if names - allowed
    }
    assert not wrong, f"{package} may import only {sorted(allowed)}: {wrong}"


def test_the_issue_grep_finds_nothing() -> None:
    """The check anyone can run (README, "Architecture"; it runs there too)."""
    for importer, imported in (
        (("worker_client", "ps_server"), "scheduler_service"),
        (("scheduler_service", "ps_server"), "worker_client"),
        (("worker_client", "scheduler_service"), "ps_server"),
    ):
        done = subprocess.run(
            ["grep", "-rn", f"^from {imported}\\|^import {imported}", *importer],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.stdout == "", done.stdout


def loaded_after(statements: str, packages: set[str]) -> set[str]:
    """Which of ``packages`` a fresh interpreter has loaded after running ``statements``."""
    code = f"import sys\n{statements}\nprint(' '.join({{m.split('.')[0] for m in sys.modules}}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return set(done.stdout.split()) & packages


def test_a_shard_and_a_scheduler_load_no_display_libraries() -> None:
    """What ``heraldps ps`` and ``heraldps scheduler`` import before they serve: no rich,
    no matplotlib (launcher only), no other service."""
    statements = (
        "from launcher.cli import build_parser\nbuild_parser()\n"
        "import ps_server.server, scheduler_service.server"
    )
    assert loaded_after(statements, {"rich", "matplotlib", "worker_client"}) == set()


def test_a_worker_loads_no_scheduler_and_no_display_library() -> None:
    others = {"rich", "matplotlib", "scheduler_service", "ps_server", "launcher"}
    assert loaded_after("import worker_client.worker", others) == set()
