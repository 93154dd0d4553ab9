"""deploy/docker-compose.yml: valid for docker-compose and the Compose schema, and true to
the repository: mounted files exist, every HERALDPS_* variable is a flag of that role,
every command parses with our CLI, and the job, ports and dependencies agree."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from heraldps.job import TrainingJob
from launcher.cli import build_parser
from launcher.cli.env_parser import ENV_PREFIX, flag_actions, subcommands
from scheduler_service.simulate import cache_rows_for
from tests.deploy.compose import (
    COMPOSE_FILE,
    DEPLOY,
    REPO,
    depends,
    heraldps_services,
    load_compose,
    mounts,
)
from tests.deploy.observability import scrape_targets
from tests.tools import require_tool

COMPOSE = load_compose()
SERVICES = heraldps_services(COMPOSE)
SERVERS = {"ps": 7001, "scheduler": 7100}  # role -> its port inside the network
ONE_SHOT = ("worker", "feed")


def role(name: str) -> str:
    command: list[str] = SERVICES[name]["command"]
    return command[0]


def env(name: str) -> dict[str, str]:
    return {k: str(v) for k, v in SERVICES[name].get("environment", {}).items()}


def docker_compose() -> str:
    return require_tool("docker-compose", "apt-get install docker-compose (Debian, v1.29)")


def compose_schema() -> dict[str, Any]:
    """compose_spec.json as shipped inside the docker-compose installation."""
    script = Path(docker_compose()).read_text().splitlines()[0]
    assert script.startswith("#!"), "docker-compose is expected to be a Python script"
    python = script[2:].split()
    code = "import compose.config, os; print(os.path.dirname(compose.config.__file__))"
    where = subprocess.run(
        [*python, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    schema: dict[str, Any] = json.loads((Path(where) / "compose_spec.json").read_text())
    return schema


def test_docker_compose_accepts_the_file() -> None:
    result = subprocess.run(
        [docker_compose(), "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no warnings (unset variables, deprecated keys)


def test_the_file_and_its_normalized_form_follow_the_compose_schema() -> None:
    validator = jsonschema.Draft201909Validator(compose_schema())
    assert [e.message for e in validator.iter_errors(COMPOSE)] == []
    normalized = subprocess.run(
        [docker_compose(), "-f", str(COMPOSE_FILE), "config"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert [e.message for e in validator.iter_errors(yaml.safe_load(normalized))] == []
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["ps-0"]["helthcheck"] = broken["services"]["ps-0"].pop("healthcheck")
    assert not validator.is_valid(broken), "the schema check must be able to fail"


def test_services_are_the_agreed_ones() -> None:
    assert set(COMPOSE["services"]) == {
        "ps-0", "ps-1", "scheduler", "worker-0", "worker-1", "feed", "prometheus", "grafana",
    }  # fmt: skip
    assert {n: role(n) for n in SERVICES} == {
        "ps-0": "ps", "ps-1": "ps", "scheduler": "scheduler",
        "worker-0": "worker", "worker-1": "worker", "feed": "feed",
    }  # fmt: skip
    assert (env("ps-0")["HERALDPS_STORE"], env("ps-1")["HERALDPS_STORE"]) == ("staged", "cached")


@pytest.mark.parametrize("name", sorted(COMPOSE["services"]))
def test_mounted_files_exist(name: str) -> None:
    for source, _ in mounts(COMPOSE["services"][name]):
        if not source.startswith("."):
            assert source in COMPOSE["volumes"], f"{name}: undeclared named volume {source}"
            continue
        path = (DEPLOY / source).resolve()
        assert path.is_relative_to(REPO), f"{name}: {source} is outside the repository"
        assert path.is_file() or (path.is_dir() and any(path.iterdir())), (
            f"{name} mounts {source}, which is missing from the repository"
        )


def test_workers_mount_the_job_and_no_data() -> None:
    """Samples travel with the plans: only the feed reads the data (here bundled in the
    image); a worker container mounts the job file alone."""
    for name in ("worker-0", "worker-1"):
        assert [t for _, t in mounts(SERVICES[name])] == ["/etc/heraldps/job.json"], name


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_variable_is_a_flag_of_the_role(name: str) -> None:
    parser = build_parser()
    known = {n for n, _ in flag_actions(parser)}  # top-level flags (--log-level)
    known |= {n for n, _ in flag_actions(subcommands(parser)[role(name)])}
    used = {k for k in env(name) if k.startswith(ENV_PREFIX)}
    assert used - known == set(), f"{name} ({role(name)}) has no flag for these"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_command_parses_with_its_environment(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in env(name).items():
        monkeypatch.setenv(key, value)
    args = build_parser().parse_args(SERVICES[name]["command"])
    assert args.command == role(name)
    assert args.metrics_port == 9100, "every heraldps process serves /metrics on 9100"
    if role(name) in SERVERS:
        assert (args.host, args.port) == ("0.0.0.0", SERVERS[role(name)])


def test_addresses_ports_and_healthchecks_agree() -> None:
    shards = sorted(
        (n for n in SERVICES if role(n) == "ps"), key=lambda n: env(n)["HERALDPS_SHARD_INDEX"]
    )
    assert [int(env(n)["HERALDPS_SHARD_INDEX"]) for n in shards] == list(range(len(shards)))
    assert {env(n)["HERALDPS_NUM_SHARDS"] for n in shards} == {str(len(shards))}
    ps_list = ",".join(f"{n}:{SERVERS['ps']}" for n in shards)
    for name in SERVICES:
        if role(name) in ("scheduler", *ONE_SHOT):
            assert env(name)["HERALDPS_PS"] == ps_list, name
        if role(name) in ONE_SHOT:
            assert env(name)["HERALDPS_SCHEDULER"] == f"scheduler:{SERVERS['scheduler']}"
    for name in SERVICES:
        check = SERVICES[name]["healthcheck"]
        if role(name) in SERVERS:
            port = SERVERS[role(name)]
            assert check["test"][:3] == ["CMD", "heraldps", "health"]
            assert check["test"][-1] == f"127.0.0.1:{port}"
            assert any(p.endswith(f":{port}") for p in SERVICES[name].get("ports", []))
        else:
            assert check == {"disable": True}, f"{name} serves no gRPC health"


def test_the_job_matches_the_scheduler_and_the_workers() -> None:
    """One worker service per worker id of deploy/job.json; the scheduler's --workers and
    --cache-rows are the job's (cache rows: 10% of the sample's distinct keys)."""
    job_mounts = {
        target: (DEPLOY / source).resolve()
        for name in SERVICES for source, target in mounts(SERVICES[name])
        if source.startswith(".")
    }  # fmt: skip
    paths = {env(n)["HERALDPS_JOB"] for n in SERVICES if role(n) in ONE_SHOT}
    assert len(paths) == 1
    (path,) = paths
    job_file = job_mounts[path]
    assert job_file == DEPLOY / "job.json"
    job = TrainingJob.load(job_file)
    assert int(env("scheduler")["HERALDPS_WORKERS"]) == job.workers
    assert int(env("scheduler")["HERALDPS_CACHE_ROWS"]) == job.cache_rows
    assert job.cache_rows == cache_rows_for(job.read(), 0.1)
    ids = sorted(int(env(n)["HERALDPS_WORKER_ID"]) for n in SERVICES if role(n) == "worker")
    assert ids == list(range(job.workers))


def test_dependencies_and_restarts() -> None:
    for spec in COMPOSE["services"].values():
        for dependency, condition in depends(spec).items():
            target = COMPOSE["services"][dependency]
            if condition == "service_healthy":
                assert "test" in target.get("healthcheck", {}), f"{dependency} has no healthcheck"
    for name in SERVICES:
        needed = {n for n in SERVICES if role(n) == "ps"} | (
            {"scheduler"} if role(name) in ONE_SHOT else set()
        )
        if role(name) != "ps":
            assert {
                d for d, c in depends(SERVICES[name]).items() if c == "service_healthy"
            } == needed
        # Training is a batch job: nothing restarts behind the run's back (see the file).
        assert SERVICES[name]["restart"] == "no"
        assert SERVICES[name]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    # The Cached shard's LMDB folders live on its named volume, in a folder of their own, so
    # snapshots saved elsewhere on the volume never land in the --data-dir.
    cached = Path(env("ps-1")["HERALDPS_DATA_DIR"])
    (volume,) = [s for s, t in mounts(SERVICES["ps-1"]) if cached.is_relative_to(t)]
    assert volume in COMPOSE["volumes"] and cached.name == "lmdb"


def test_prometheus_scrapes_every_heraldps_process() -> None:
    """deploy/prometheus/prometheus.yml (the obs part's file) targets the services' /metrics."""
    targets = scrape_targets()
    for target in targets:
        host, port = target.rsplit(":", 1)
        assert host in SERVICES and env(host)["HERALDPS_METRICS_PORT"] == port, target
    assert {f"{n}:9100" for n in SERVICES} == targets
    assert any(
        t.endswith(":/etc/prometheus:ro") for t in COMPOSE["services"]["prometheus"]["volumes"]
    )


def test_grafana_finds_its_dashboards_and_prometheus() -> None:
    """The provisioning files (the obs part's) point where compose mounts things."""
    grafana = COMPOSE["services"]["grafana"]
    targets = dict((s.removeprefix("./"), t) for s, t in mounts(grafana))
    providers = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "heraldps.yml").read_text()
    )["providers"]
    assert {p["options"]["path"] for p in providers} == {targets["grafana/dashboards"]}
    assert targets["grafana/provisioning"] == "/etc/grafana/provisioning"
    sources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    assert [s["url"] for s in sources] == ["http://prometheus:9090"]
    assert "127.0.0.1:9090:9090" in COMPOSE["services"]["prometheus"]["ports"]


def test_checkpoints_are_on_a_volume_every_shard_writes() -> None:
    """The scheduler's checkpoints are Saves: every shard writes its part into the same
    folder, so it lies on one named volume mounted at the same path by the scheduler and
    every shard, under the shards' snapshot root; the scheduler resumes from that folder."""
    scheduler = env("scheduler")
    folder = Path(scheduler["HERALDPS_CHECKPOINT_DIR"])
    assert scheduler["HERALDPS_RESUME_FROM"] == str(folder)
    assert int(scheduler["HERALDPS_CHECKPOINT_EVERY"]) > 0
    volumes = set()
    for name in SERVICES:
        if role(name) in ("ps", "scheduler"):
            (source,) = [s for s, t in mounts(SERVICES[name]) if folder.is_relative_to(t)]
            volumes.add(source)
        if role(name) == "ps":
            assert folder.is_relative_to(env(name)["HERALDPS_SNAPSHOT_ROOT"]), name
    assert len(volumes) == 1 and volumes <= set(COMPOSE["volumes"])


def test_stop_grace_covers_the_drain() -> None:
    """docker stop waits stop_grace_period (10 s unless set) before SIGKILL; a server's drain
    (HERALDPS_GRACE_SECONDS, 10 s unless set) plus closing its store must fit, with the same
    10 s margin the Kubernetes pods keep (tests/deploy/test_k8s.py)."""
    for name in SERVICES:
        if role(name) not in SERVERS:
            continue
        period = SERVICES[name].get("stop_grace_period", "10s")
        assert period.endswith("s") and period[:-1].isdigit(), f"{name}: write it in seconds"
        drain = float(env(name).get("HERALDPS_GRACE_SECONDS", "10"))
        assert int(period[:-1]) >= drain + 10, f"{name}: stop_grace_period {period}, drain {drain}"
