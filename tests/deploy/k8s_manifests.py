"""Reading a kustomize build of deploy/k8s: render it, find objects, resolve pod env.

The tests render with the real ``kubectl kustomize`` and then look at the
plain objects, the way the API server will see them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"

Obj = dict[str, Any]

# Where the StatefulSet controller and the Job controller put a pod's identity.
POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
POD_IP = "status.podIP"

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
# What the kubelet accepts as a variable name from envFrom, and its $(NAME) references.
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand(value: str, defined: dict[str, str]) -> str:
    """The kubelet's expansion: ``$(NAME)`` of a variable defined earlier, ``$$`` is ``$``;
    an unknown reference stays as written."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return defined.get(name, match.group(0))

    return REFERENCE.sub(one, value)


def kustomize(kubectl: str, directory: Path) -> str:
    """YAML of ``kubectl kustomize DIR``; a failed build fails with kustomize's message."""
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    return done.stdout


def with_components(
    kubectl: str, workdir: Path, build: str, components: Sequence[str], namespace: str | None
) -> Build:
    """``build`` (a directory under deploy/k8s) plus optional components, in order, as a
    user's own kustomization would add them; ``workdir`` holds that kustomization."""
    here = workdir / "+".join((build.replace("/", "-"), *components))
    here.mkdir(parents=True)
    lines = [f"namespace: {namespace}"] if namespace else []
    lines += ["resources:", f"  - {os.path.relpath(K8S / build, here)}", "components:"]
    lines += [f"  - {os.path.relpath(K8S / 'components' / c, here)}" for c in components]
    (here / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return Build.parse("+".join((build, *components)), kustomize(kubectl, here))


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions) matches ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


@dataclass
class Build:
    """The objects of one rendered kustomization."""

    name: str
    yaml_text: str
    objects: list[Obj]

    @classmethod
    def parse(cls, name: str, text: str) -> Build:
        return cls(name, text, [o for o in yaml.safe_load_all(text) if o])

    def all(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> Obj:
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name}, found {len(found)}"
        return found[0]

    def workloads(self) -> list[Obj]:
        return [o for o in self.objects if o["kind"] in WORKLOAD_KINDS]

    def pod_labels(self) -> list[tuple[Obj, dict[str, str]]]:
        """(workload, its pod template's labels) for every workload."""
        return [(w, w["spec"]["template"]["metadata"]["labels"]) for w in self.workloads()]

    def selected_workloads(self, selector: Obj) -> list[str]:
        """Names of the workloads whose pods ``selector`` matches."""
        return [
            w["metadata"]["name"] for w, labels in self.pod_labels() if selects(selector, labels)
        ]

    def container(self, kind: str, name: str, container: str) -> Obj:
        spec = self.get(kind, name)["spec"]["template"]["spec"]
        found = [c for c in spec["containers"] if c["name"] == container]
        assert found, f"{self.name}: {kind} {name} has no container {container}"
        chosen: Obj = found[0]
        return chosen

    def argv(self, container: Obj) -> list[str]:
        """``command`` + ``args``. A heraldps container must name its command: without one
        the image's ENTRYPOINT decides, and the GPU workers run another image."""
        where = f"{self.name}: container {container['name']}"
        assert "command" in container, f"{where} has no command"
        return [*container["command"], *container.get("args", [])]

    def mounted_config(self, kind: str, name: str, container: str, path: str) -> str:
        """The text of the file a container sees at ``path``: a ConfigMap volume's item."""
        spec = self.get(kind, name)["spec"]["template"]["spec"]
        mounts = self.container(kind, name, container)["volumeMounts"]
        folder, file = str(PurePosixPath(path).parent), PurePosixPath(path).name
        (mount,) = [m for m in mounts if m["mountPath"] == folder]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        (key,) = [i["key"] for i in volume["configMap"]["items"] if i["path"] == file]
        return self.config(volume["configMap"]["name"])[key]

    def config(self, name: str = "heraldps-config") -> dict[str, str]:
        data: dict[str, str] = self.get("ConfigMap", name).get("data") or {}
        return data

    def env(self, container: Obj, fields: dict[str, str] | None = None) -> dict[str, str]:
        """A container's environment as the kubelet would set it.

        ``envFrom`` ConfigMaps first (with their prefix), then ``env`` in order, which
        wins; ``$(NAME)`` in a value expands to a variable defined before it. ``fields``
        gives the downward-API values (``POD_INDEX`` -> "0", ...).
        """
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            assert "configMapRef" in source, f"{self.name}: unhandled envFrom {source}"
            prefix = source.get("prefix", "")
            for key, value in self.config(source["configMapRef"]["name"]).items():
                if ENV_NAME.fullmatch(prefix + key):  # the kubelet skips invalid names
                    env[prefix + key] = value
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
                continue
            source = var["valueFrom"]
            if "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                env[var["name"]] = self.config(ref["name"])[ref["key"]]
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                assert fields is not None and path in fields, (
                    f"{self.name}: {container['name']} takes {var['name']} from {path}, "
                    "which the test gives no value (a field of the pod it did not expect)"
                )
                env[var["name"]] = fields[path]
            else:
                raise AssertionError(f"{self.name}: unhandled env source {source}")
        return env

    def env_source(self, container: Obj, name: str) -> Obj:
        """The raw env entry ``name`` of ``container``."""
        found = [v for v in container.get("env") or [] if v["name"] == name]
        assert len(found) == 1, f"{self.name}: {container['name']} sets {name} {len(found)} times"
        entry: Obj = found[0]
        return entry


def container_ports(pod_spec: Obj) -> dict[str | int, int]:
    """Every container port of a pod, by name and by number -> number."""
    ports: dict[str | int, int] = {}
    for container in pod_spec["containers"]:
        for port in container.get("ports") or []:
            ports[port["containerPort"]] = port["containerPort"]
            if "name" in port:
                ports[port["name"]] = port["containerPort"]
    return ports


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``4Gi``, ``1G``, ``1000``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12}  # fmt: skip
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)
