"""deploy/docker-compose.yml read as data, and its heraldps services run as local processes.

There is no Docker engine in CI, so ``ComposeRun`` starts each heraldps service of the
compose file as a real ``heraldps`` subprocess on 127.0.0.1 with exactly the command and
HERALDPS_* environment the file gives it, in ``depends_on`` order, waiting on each
dependency's own healthcheck command. Only what a container network provides is
translated: a service's fixed port becomes an ephemeral one (``HERALDPS_PORT=0`` and a
port file; a worker's all-reduce port too, advertised as 127.0.0.1), ``name:port``
addresses become ``127.0.0.1:<that port>``, and container paths
of mounts become repository files or temporary directories.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.dockerfile import exec_form, instructions

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"


def load_compose(*overrides: Path) -> dict[str, Any]:
    """The compose file, with ``overrides`` (``-f`` files after it) merged as docker compose
    merges them: a service's environment key by key, its volumes by container path."""
    compose: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    for override in overrides:
        for name, extra in yaml.safe_load(override.read_text())["services"].items():
            service = compose["services"][name]
            service["environment"] = service.get("environment", {}) | extra.get("environment", {})
            by_target = {entry.split(":")[1]: entry for entry in service.get("volumes", [])}
            by_target |= {entry.split(":")[1]: entry for entry in extra.get("volumes", [])}
            service["volumes"] = list(by_target.values())
            unmerged = set(extra) - {"environment", "volumes"}
            assert not unmerged, f"{override.name}: {name} sets {unmerged}, not merged here"
    return compose


def heraldps_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run our image (the others are Prometheus and Grafana)."""
    return {
        name: service
        for name, service in compose["services"].items()
        if str(service.get("image", "")).split(":")[0] == "heraldps"
    }


def mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, container path) of each volume entry in short syntax."""
    found = []
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        found.append((source, target))
    return found


def argv(service: dict[str, Any]) -> list[str]:
    """What the service's container runs: its entrypoint (the Dockerfile's ENTRYPOINT unless
    the service sets one) followed by its command."""
    entrypoint = service.get("entrypoint")
    if entrypoint is None:
        dockerfile = REPO / service["build"]["dockerfile"]
        (found,) = [i for i in instructions(dockerfile) if i.keyword == "ENTRYPOINT"]
        entrypoint = exec_form(found.args)
    return [*entrypoint, *service["command"]]


def mounted_file(service: dict[str, Any], path: str) -> Path:
    """The repository file the service bind-mounts at ``path``."""
    (source,) = [s for s, target in mounts(service) if target == path]
    assert source.startswith("."), f"{path} is on the named volume {source}, not a file"
    return DEPLOY / source


def depends(service: dict[str, Any]) -> dict[str, str]:
    """{dependency: condition}."""
    raw = service.get("depends_on", {})
    if isinstance(raw, list):
        return dict.fromkeys(raw, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in raw.items()}


class Service:
    """One service of the compose file as a subprocess."""

    def __init__(self, name: str, spec: dict[str, Any], env: dict[str, str], workdir: Path):
        self.name = name
        self.spec = spec
        self.log_path = workdir / f"{name}.log"
        self.port_file = workdir / f"{name}.port"
        compose_port = spec.get("environment", {}).get("HERALDPS_PORT")
        self.compose_port = int(compose_port) if compose_port else None
        self.port = 0
        if self.compose_port is not None:  # a server: ephemeral ports, announced in a file
            env.update(HERALDPS_PORT="0", HERALDPS_PORT_FILE=str(self.port_file))
            env.update(HERALDPS_HOST="127.0.0.1")
        if "HERALDPS_METRICS_PORT" in env:
            env["HERALDPS_METRICS_PORT"] = "0"
        if "HERALDPS_ADVERTISE_HOST" in env:  # a worker's all-reduce server: on loopback here
            env.update(HERALDPS_ADVERTISE_HOST="127.0.0.1", HERALDPS_COLLECTIVE_PORT="0")
        command = [sys.executable, "-m", "launcher", *spec["command"]]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_port(self, deadline: float) -> None:
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not start:\n{self.log()}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text().split()[0])

    def healthy(self) -> bool:
        """Run the service's own healthcheck command, pointed at its real port."""
        test = self.spec["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1] == "heraldps", test
        argv = [a.replace(f":{self.compose_port}", f":{self.port}") for a in test[2:]]
        command = [sys.executable, "-m", "launcher", *argv]
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                return None
        return self.proc.returncode


class ComposeRun:
    """The heraldps services of the compose file, started as compose would start them."""

    def __init__(self, compose: dict[str, Any], workdir: Path) -> None:
        self.compose = compose
        self.specs = heraldps_services(compose)
        self.workdir = workdir
        self.services: dict[str, Service] = {}
        # Container paths -> local paths: bind mounts from the repo, named volumes in tmp.
        self.paths: dict[str, str] = {}
        for spec in self.specs.values():
            for source, target in mounts(spec):
                if source.startswith("."):
                    self.paths[target] = str((DEPLOY / source).resolve())
                else:
                    volume = workdir / f"volume-{source}"
                    volume.mkdir(exist_ok=True)
                    self.paths[target] = str(volume)

    def local(self, path: str) -> str:
        """The local path of a container path (one under a mount, or the text unchanged)."""
        for target, local in self.paths.items():
            if path == target or path.startswith(target.rstrip("/") + "/"):
                return local + path[len(target) :]
        return path

    def environment(self, spec: dict[str, Any]) -> dict[str, str]:
        """The process environment: no inherited HERALDPS_*, the service's own, translated."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERALDPS_")}
        for key, value in spec.get("environment", {}).items():
            text = str(value)
            for name, service in self.services.items():
                if service.compose_port is not None:
                    text = text.replace(f"{name}:{service.compose_port}", service.address)
            env[key] = self.local(text)
        return env

    def start(self, name: str, deadline: float) -> Service:
        """Start ``name`` once its dependencies meet their conditions."""
        for dependency, condition in depends(self.specs[name]).items():
            if dependency not in self.services:
                self.start(dependency, deadline)
            self.wait(dependency, condition, deadline)
        if name not in self.services:
            spec = self.specs[name]
            service = Service(name, spec, self.environment(spec), self.workdir)
            self.services[name] = service
            if service.compose_port is not None:
                service.wait_port(deadline)
        return self.services[name]

    def wait(self, name: str, condition: str, deadline: float) -> None:
        service = self.services[name]
        while True:
            code = service.proc.poll()
            if condition == "service_started":
                return
            if condition == "service_completed_successfully" and code is not None:
                assert code == 0, f"{name} exited {code}:\n{service.log()}"
                return
            if condition == "service_healthy" and service.healthy():
                return
            if code is not None and condition == "service_healthy":
                raise AssertionError(f"{name} exited {code} before healthy:\n{service.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not {condition} in time:\n{service.log()}")
            time.sleep(0.2)

    def stop(self) -> None:
        for service in reversed(list(self.services.values())):
            service.stop()
