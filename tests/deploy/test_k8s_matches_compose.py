"""The Kubernetes pods run what the compose services run, so the compose run vouches for them.

No Kubernetes cluster can run in CI, but the compose cluster does (issue #15). For every
heraldps service of deploy/docker-compose.yml this test finds the pod that plays its part in
each kustomize build, resolves that container as the kubelet would (ConfigMaps, the downward
API's shard index and worker id, the job file it mounts), and requires the same argv, the
same environment and the same job as the service, except for the differences listed in
ALLOWED with their reasons. A listed difference that no longer differs fails as well, so the
table stays the true list. docs/kubernetes.md ("What vouches for these manifests") explains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from heraldps.job import TrainingJob
from tests.deploy import compose
from tests.deploy.k8s_manifests import (
    COMPLETION_INDEX,
    K8S,
    POD_INDEX,
    POD_IP,
    Build,
    Obj,
    kustomize,
    with_components,
)
from tests.tools import require_tool


@dataclass(frozen=True)
class Variant:
    """A kustomize build (a directory under deploy/k8s plus optional components) and the
    compose files (under deploy/, after docker-compose.yml) it is compared with."""

    build: str
    components: tuple[str, ...] = ()
    compose_files: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return "+".join((self.build, *self.components))


VARIANTS = (
    Variant("base"),
    Variant("base", ("snapshots",)),
    Variant("overlays/dev"),
    Variant("overlays/prod"),
    Variant("overlays/prod", ("snapshots",)),
    Variant("base", ("snapshots", "tls"), ("docker-compose.tls.yml",)),
)


@dataclass(frozen=True)
class Pod:
    """Where a compose service's part is played: a container of a workload, and the
    downward-API values of the pod that is that service (shard i = ordinal i, worker w =
    completion index w)."""

    kind: str
    name: str
    container: str
    fields: tuple[tuple[str, str], ...] = ()


A_POD_IP = "10.0.0.7"
PODS = {
    "ps-0": Pod("StatefulSet", "heraldps-ps", "ps", ((POD_INDEX, "0"),)),
    "ps-1": Pod("StatefulSet", "heraldps-ps", "ps", ((POD_INDEX, "1"),)),
    "scheduler": Pod("Deployment", "heraldps-scheduler", "scheduler"),
    "worker-0": Pod("Job", "heraldps-worker", "worker",
                    ((COMPLETION_INDEX, "0"), (POD_IP, A_POD_IP))),
    "worker-1": Pod("Job", "heraldps-worker", "worker",
                    ((COMPLETION_INDEX, "1"), (POD_IP, A_POD_IP))),
    "feed": Pod("Job", "heraldps-feed", "feed"),
}  # fmt: skip

# A compose service name resolves on the compose network; the same process on Kubernetes is
# reached through its Service's DNS name. Compose values are translated by this table before
# they are compared, so a wrong port or a missing shard still shows.
ADDRESSES = {
    "ps-0:7001": "heraldps-ps-0.heraldps-ps:7001",
    "ps-1:7001": "heraldps-ps-1.heraldps-ps:7001",
    "scheduler:7100": "heraldps-scheduler:7100",
}

# The TLS files and tokens: compose bind-mounts them under /etc/heraldps; a pod mounts each
# Secret on a folder of its own (a Secret volume hides what else is in its folder, and
# /etc/heraldps holds the job), with the key names of `kubectl create secret tls`.
PATHS = {
    "/etc/heraldps/tls/heraldps.crt": "/etc/heraldps-tls/tls.crt",
    "/etc/heraldps/tls/heraldps.key": "/etc/heraldps-tls/tls.key",
    "/etc/heraldps/tls/ca.crt": "/etc/heraldps-tls/ca.crt",
    "/etc/heraldps/tokens/admin.token": "/etc/heraldps-tokens/admin.token",
    "/etc/heraldps/tokens/worker.token": "/etc/heraldps-tokens/worker.token",
}

SHARDS = frozenset({"ps-0", "ps-1"})
WORKERS = frozenset({"worker-0", "worker-1"})
EVERY = frozenset(v.name for v in VARIANTS)
SNAPSHOTS = frozenset(v.name for v in VARIANTS if "snapshots" in v.components)
DEV = frozenset({"overlays/dev"})
PROD = frozenset(v.name for v in VARIANTS if v.build == "overlays/prod")
TLS = frozenset(v.name for v in VARIANTS if "tls" in v.components)
JOB = "job.json:"  # prefix of the job file's fields in the compared settings


@dataclass(frozen=True)
class Allowed:
    """Variables (space-separated; ``job.json:FIELD`` for a job field) in which the pods of
    some builds may differ from some compose services, and why."""

    variants: frozenset[str]
    services: frozenset[str]
    keys: str
    why: str


SCHEDULER = frozenset({"scheduler"})
CHECKPOINTS = (
    "HERALDPS_CHECKPOINT_EVERY HERALDPS_CHECKPOINT_DIR HERALDPS_KEEP_CHECKPOINTS "
    "HERALDPS_RESUME_FROM"
)

# The only ways a pod may differ from its compose service; everything else must be equal.
# fmt: off
ALLOWED = (
    Allowed(EVERY, WORKERS, "HERALDPS_ADVERTISE_HOST",
            "a worker advertises its pod IP (downward API status.podIP), not a service name"),
    Allowed(EVERY, frozenset({"ps-0"}), "HERALDPS_DATA_DIR HERALDPS_CACHE_GB",
            "one pod template serves every shard, so a Staged-PS pod also carries the "
            "Cached-PS settings, which the staged store never reads"),
    Allowed(EVERY - SNAPSHOTS, SHARDS, "HERALDPS_SNAPSHOT_ROOT",
            "no volume every shard shares without components/snapshots: Save lands on the "
            "shard's own volume"),
    Allowed(EVERY - SNAPSHOTS, SCHEDULER, CHECKPOINTS,
            "no shared volume, no checkpoints: every shard writes its part at the same path"),
    Allowed(SNAPSHOTS, SCHEDULER, "HERALDPS_CHECKPOINT_EVERY",
            "compose checkpoints its 28-iteration sample every 20 so CI writes one; a "
            "cluster's long runs every 100 (the cost: docs/failure-and-recovery.md)"),
    Allowed(DEV, SHARDS, "HERALDPS_MEMORY_LIMIT_GB HERALDPS_GRACE_SECONDS",
            "dev's small pods: a 1 GiB limit, a short drain"),
    Allowed(PROD, SHARDS, "HERALDPS_NUM_SHARDS HERALDPS_CACHE_GB HERALDPS_MEMORY_LIMIT_GB "
            "HERALDPS_GRACE_SECONDS HERALDPS_NO_REFLECTION",
            "prod: 4 shards, 8 GiB caches under 32 GiB, a longer LMDB drain, no reflection"),
    Allowed(PROD, SCHEDULER, "HERALDPS_PS HERALDPS_WORKERS HERALDPS_NO_REFLECTION",
            "prod: 4 shards, 4 workers, no reflection"),
    Allowed(PROD, WORKERS | {"feed"}, f"HERALDPS_PS {JOB}workers {JOB}device",
            "prod: 4 shards; its own job.json has 4 GPU workers"),
    Allowed(TLS, SCHEDULER | WORKERS | {"feed"}, "HERALDPS_TLS_SERVER_NAME",
            "pods dial pod IPs, which no certificate names, so clients check the name "
            "'heraldps'; compose dials the service names make-certs.sh puts in it"),
    Allowed(TLS, SHARDS | SCHEDULER, "HERALDPS_NO_REFLECTION",
            "compose's TLS file also turns reflection off; on Kubernetes that is prod's "
            "choice, with or without TLS"),
)
# fmt: on


def allowed_keys(variant: str, service: str) -> set[str]:
    return {
        key
        for entry in ALLOWED
        if variant in entry.variants and service in entry.services
        for key in entry.keys.split()
    }


# --- what a compose service runs --------------------------------------------------------------


def translated(value: str) -> str:
    """A compose value with its service addresses and mounted files as the pods see them
    (ADDRESSES, PATHS)."""
    return PATHS.get(value) or ",".join(ADDRESSES.get(part, part) for part in value.split(","))


def job_settings(job: TrainingJob) -> dict[str, str]:
    return {f"{JOB}{k}": repr(v) for k, v in dataclasses.asdict(job).items()}


def compose_settings(service: dict[str, Any]) -> dict[str, str]:
    """Every variable the service sets, as written, plus the fields of its job."""
    env = {k: str(v) for k, v in service.get("environment", {}).items()}
    if "HERALDPS_JOB" in env:
        env |= job_settings(TrainingJob.load(compose.mounted_file(service, env["HERALDPS_JOB"])))
    return env


# --- what the pod runs ------------------------------------------------------------------------


def pod_container(build: Build, pod: Pod) -> Obj:
    return build.container(pod.kind, pod.name, pod.container)


def pod_settings(build: Build, pod: Pod) -> dict[str, str]:
    """Every variable the kubelet would set in the container plus the fields of its job."""
    env = build.env(pod_container(build, pod), dict(pod.fields))
    if "HERALDPS_JOB" in env:
        text = build.mounted_config(pod.kind, pod.name, pod.container, env["HERALDPS_JOB"])
        env |= job_settings(TrainingJob.from_json(text))
    return env


# --- the comparison ---------------------------------------------------------------------------


def plays(build: Build, service: str, compose_env: dict[str, str]) -> bool:
    """Whether this build has a pod for ``service``: every build has one scheduler, its workers
    and the feed; its shards all run one store, so they play the compose shard of that store."""
    pod = PODS[service]
    if pod.kind != "StatefulSet":
        return True
    shard_env = build.env(pod_container(build, pod), dict(pod.fields))
    return shard_env["HERALDPS_STORE"] == compose_env["HERALDPS_STORE"]


def show(value: str | None) -> str:
    if value is None:
        return "unset"
    if translated(value) != value:
        return f"{value!r} (in a pod: {translated(value)!r})"
    return repr(value)


def mismatches(variant: str, build: Build, services: dict[str, dict[str, Any]]) -> Iterator[str]:
    """One line per difference not in ALLOWED, and per ALLOWED entry that no longer differs."""
    for name, service in services.items():
        pod = PODS[name]
        theirs = compose_settings(service)
        if not plays(build, name, theirs):
            continue
        where = f"{variant}: compose {name} vs {pod.kind} {pod.name}/{pod.container}"
        argv, pod_args = compose.argv(service), build.argv(pod_container(build, pod))
        if argv != pod_args:
            yield f"{where}: argv: compose {argv}, kubernetes {pod_args}"
        ours = pod_settings(build, pod)
        as_pod = {k: translated(v) for k, v in theirs.items()}
        differ = {k for k in as_pod.keys() | ours.keys() if as_pod.get(k) != ours.get(k)}
        allowed = allowed_keys(variant, name)
        for key in sorted(differ - allowed):
            compose_value, pod_value = show(theirs.get(key)), show(ours.get(key))
            yield f"{where}: {key}: compose {compose_value}, kubernetes {pod_value}"
        for key in sorted(allowed - differ):
            yield f"{where}: {key} is in ALLOWED but equal ({show(ours.get(key))}): unlist it"


_builds: dict[str, Build] = {}


@pytest.fixture(scope="module")
def kubectl() -> str:
    return require_tool("kubectl", "install kubectl (see tests/deploy/test_k8s.py)")


def render(kubectl: str, variant: Variant, workdir: Path) -> Build:
    if variant.name not in _builds:
        if variant.components:
            built = with_components(kubectl, workdir, variant.build, variant.components, None)
        else:
            built = Build.parse(variant.name, kustomize(kubectl, K8S / variant.build))
        _builds[variant.name] = built
    return _builds[variant.name]


@pytest.fixture(params=VARIANTS, ids=[v.name for v in VARIANTS])
def variant(request: pytest.FixtureRequest) -> Variant:
    chosen: Variant = request.param
    return chosen


def services_of(variant: Variant) -> dict[str, dict[str, Any]]:
    files = [compose.DEPLOY / name for name in variant.compose_files]
    return compose.heraldps_services(compose.load_compose(*files))


def test_pods_run_what_the_compose_services_run(
    variant: Variant, kubectl: str, tmp_path: Path
) -> None:
    build = render(kubectl, variant, tmp_path)
    problems = list(mismatches(variant.name, build, services_of(variant)))
    assert not problems, "\n".join(problems)


def test_every_compose_service_has_its_pod_in_some_build(
    kubectl: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The staged shard is played in dev, the cached one in base and prod: together the
    builds cover every heraldps service of the compose file."""
    services = compose.heraldps_services(compose.load_compose())
    assert set(services) == set(PODS)
    covered = set()
    for chosen in VARIANTS:
        build = render(kubectl, chosen, tmp_path_factory.mktemp("kustomize"))
        covered |= {n for n, s in services.items() if plays(build, n, compose_settings(s))}
    assert covered == set(PODS)


def test_a_changed_value_is_named_with_both_sides(kubectl: str, tmp_path: Path) -> None:
    """The comparison bites: one value changed on the compose side is reported with the
    build, the service, the variable and both values."""
    services = compose.heraldps_services(compose.load_compose())
    services["ps-1"]["environment"]["HERALDPS_CACHE_GB"] = "3"
    build = render(kubectl, Variant("base"), tmp_path)
    problems = list(mismatches("base", build, services))
    assert problems == [
        "base: compose ps-1 vs StatefulSet heraldps-ps/ps: HERALDPS_CACHE_GB: "
        "compose '3', kubernetes '1'"
    ]


def test_env_resolves_as_the_kubelet_does() -> None:
    """envFrom first (with its prefix), env after it and winning, $(NAME) of an earlier
    variable, $$ for a dollar, an unknown reference left as written."""
    build = Build.parse(
        "inline",
        """
apiVersion: v1
kind: ConfigMap
metadata: {name: shared}
data: {HERALDPS_MODE: herald, HERALDPS_PORT: "7100", "1BAD": x}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  template:
    spec:
      containers:
        - name: c
          envFrom:
            - configMapRef: {name: shared}
            - configMapRef: {name: shared}
              prefix: COPY_
          env:
            - {name: HERALDPS_PORT, value: "7200"}
            - {name: HERALDPS_PS, value: "$(HERALDPS_MODE):$(HERALDPS_PORT)"}
            - {name: PRICE, value: "$$(HERALDPS_MODE) $(LATER)"}
            - {name: LATER, value: x}
""",
    )
    env = build.env(build.container("Deployment", "d", "c"))
    assert env == {
        "HERALDPS_MODE": "herald", "HERALDPS_PORT": "7200", "COPY_HERALDPS_MODE": "herald",
        "COPY_HERALDPS_PORT": "7100", "COPY_1BAD": "x", "HERALDPS_PS": "herald:7200",
        "PRICE": "$(HERALDPS_MODE) $(LATER)", "LATER": "x",
    }  # fmt: skip
