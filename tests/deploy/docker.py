"""deploy/ on a real Docker engine: the image built from deploy/Dockerfile, and the compose
cluster started with deploy/run-job.sh under a project name of its own.

Only what cannot be had here is replaced, in a compose override written per test
(``ci_override``): Prometheus is Debian's ``prometheus`` binary mounted into a container of
our image (no registry serves ``prom/prometheus``) with deploy/prometheus/prometheus.yml's
scrape jobs unchanged but a 1 s interval, and Grafana is left out (a profile nobody enables).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.compose import DEPLOY, REPO
from tests.deploy.observability import scraping_every
from tests.tools import missing, require_tool

RUN_JOB = DEPLOY / "run-job.sh"
READY = "import urllib.request as u; u.urlopen('http://127.0.0.1:9090/-/ready', timeout=4)"
IMAGE = "heraldps:latest"  # what deploy/docker-compose.yml runs
HINT = (
    "a Docker engine: `bash tools/docker_ready.sh` installs Debian's docker.io, starts dockerd "
    "and makes the base image (CI runs it before the tests)"
)


def engine_or_skip() -> None:
    """Skip (fail under CI) when no Docker engine answers."""
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode
    ):
        missing(f"no Docker engine answers `docker info`: {HINT}")


def compose_command() -> list[str]:
    """``docker compose`` (the plugin) or Debian's ``docker-compose``, as run-job.sh picks."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    path = shutil.which("docker-compose")
    if path is None:
        pytest.fail("neither `docker compose` nor `docker-compose` is installed")
    return [path]


def build_image() -> None:
    """Build deploy/Dockerfile as heraldps:latest FROM the base tools/docker_ready.sh names."""
    ready = subprocess.run(
        ["bash", str(REPO / "tools" / "docker_ready.sh")],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert ready.returncode == 0, ready.stderr
    base = ready.stdout.strip().splitlines()[-1]
    build = subprocess.run(
        ["docker", "build", "-q", "--build-arg", f"PYTHON_IMAGE={base}",
         "-f", str(DEPLOY / "Dockerfile"), "-t", IMAGE, str(REPO)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert build.returncode == 0, f"docker build failed:\n{build.stdout}\n{build.stderr}"


def ci_prometheus_config(workdir: Path) -> Path:
    """A folder with deploy/prometheus/prometheus.yml scraping every second, its rules read
    from the mounted deploy/prometheus."""
    folder = workdir / "prometheus-ci"
    folder.mkdir()
    config = scraping_every("1s", "/etc/prometheus/rules.yml")
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    return folder


def ci_override(workdir: Path, environment: dict[str, dict[str, str]] | None = None) -> Path:
    """A compose file added after deploy/docker-compose.yml: Prometheus from Debian's binary,
    Grafana off, and ``environment`` ({service: {VAR: value}}) merged into services."""
    binary = require_tool("prometheus", "apt-get install prometheus (Debian's package)")
    override: dict[str, Any] = {
        "services": {
            "prometheus": {
                "image": IMAGE,
                "entrypoint": ["/usr/local/bin/prometheus"],
                "command": [
                    "--config.file=/etc/prometheus-ci/prometheus.yml",
                    "--storage.tsdb.path=/tmp/prometheus",
                    "--web.listen-address=0.0.0.0:9090",
                    "--log.level=warn",
                ],
                "volumes": [
                    f"{binary}:/usr/local/bin/prometheus:ro",
                    f"{ci_prometheus_config(workdir)}:/etc/prometheus-ci:ro",
                ],
                "healthcheck": {  # the same readiness check: the image has Python, not wget
                    "test": ["CMD", "python3", "-c", READY],
                },
            },
            "grafana": {"profiles": ["grafana-image"]},  # no registry serves its image
        }
    }
    for service, env in (environment or {}).items():
        override["services"].setdefault(service, {})["environment"] = env
    path = workdir / "docker-compose.ci.yml"
    path.write_text(yaml.safe_dump(override))
    return path


class ComposeProject:
    """One compose project of deploy/docker-compose.yml plus an override, under a name of its
    own; ``down`` removes its containers, network and volumes (:func:`project` calls it)."""

    def __init__(self, override: Path) -> None:
        self.name = f"heraldps-ci-{uuid.uuid4().hex[:8]}"
        self.options = ["-f", str(override), "-p", self.name]
        self.compose = [
            *compose_command(), "-f", str(DEPLOY / "docker-compose.yml"), *self.options
        ]  # fmt: skip

    def run_job(self, *extra: str) -> subprocess.Popen[str]:
        """deploy/run-job.sh for this project, started (its stderr is the report)."""
        return subprocess.Popen(
            ["bash", str(RUN_JOB), *self.options, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def run(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [*self.compose, *args], capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"compose {args}: {done.stderr}"
        return done.stdout

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).strip()

    def logs(self, *services: str) -> str:
        done = subprocess.run(
            [*self.compose, "logs", "--no-color", "--tail", "60", *services],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return done.stdout + done.stderr

    def state(self, service: str) -> dict[str, Any]:
        """``docker inspect``'s State of the service's container."""
        out = subprocess.run(
            ["docker", "inspect", "-f", "{{json .State}}", self.container(service)],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        state: dict[str, Any] = json.loads(out)
        return state

    def volume_files(self, volume: str) -> list[str]:
        """Paths of the files on one of the project's named volumes (read in a throwaway
        container of our image)."""
        done = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "find", "-v", f"{self.name}_{volume}:/v:ro",
             IMAGE, "/v", "-type", "f"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [line.removeprefix("/v/") for line in done.stdout.split()]

    def kernel_cache(self, service: str) -> dict[str, bytes]:
        """The numba cache of the service's container (running or exited), file by file:
        the image's compiled kernels it copied at start, and whatever it compiled since."""
        return _kernel_files(self.container(service), "/tmp/numba-cache")

    def down(self) -> None:
        subprocess.run(
            [*self.compose, "down", "-v", "--remove-orphans", "-t", "5"],
            capture_output=True, timeout=120,
        )  # fmt: skip


def project(override: Path) -> Iterator[ComposeProject]:
    """A project that is always torn down, also when the test fails."""
    compose = ComposeProject(override)
    try:
        yield compose
    finally:
        compose.down()


def image_kernels() -> dict[str, bytes]:
    """The compiled kernels the image carries (``HERALDPS_KERNEL_SEED``), file by file."""
    created = subprocess.run(["docker", "create", IMAGE], capture_output=True, text=True,
                             timeout=60, check=True).stdout.strip()  # fmt: skip
    try:
        return _kernel_files(created, "/opt/heraldps/kernels")
    finally:
        subprocess.run(["docker", "rm", created], capture_output=True, timeout=60)


def _kernel_files(container: str, folder: str) -> dict[str, bytes]:
    """``folder``'s numba files in ``container`` (``docker cp`` reads a stopped one too)."""
    tar = subprocess.run(["docker", "cp", f"{container}:{folder}", "-"], capture_output=True,
                         timeout=60, check=True).stdout  # fmt: skip
    files = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.endswith((".nbi", ".nbc")):
                extracted = archive.extractfile(member)
                assert extracted is not None
                files[member.name.split("/", 1)[1]] = extracted.read()
    return files
