"""For the emulated-network tests: skip where it cannot be built, and find what a launcher
left behind, read straight from ``ip`` (not through the code under test)."""

from __future__ import annotations

import re
import subprocess

import pytest

from launcher.iproute import NetworkError
from launcher.netns import ClusterNetwork, NetworkUnavailable, check_requirements


def require_network() -> None:
    """Skip, with the reason, unless this machine can build an emulated network
    (root, ``ip``, ``tc`` and the ``tbf`` qdisc)."""
    try:
        check_requirements()
        with ClusterNetwork({"probe": 10.0}):
            pass
    except (NetworkUnavailable, NetworkError) as exc:
        pytest.skip(f"no emulated network here: {exc}")


def leftovers(owner: int) -> list[str]:
    """Namespaces and root-namespace interfaces named for launcher ``owner``."""
    namespaces = _ip("netns", "list").split()
    lines = _ip("-o", "link").splitlines()  # "7: hps12b: <...", "8: hps12v0@if2: <..."
    interfaces = [line.split(":")[1].strip().split("@")[0] for line in lines]
    mine = re.compile(rf"^(heraldps-{owner}-|hps{owner}[bv])")
    return [name for name in namespaces + interfaces if mine.match(name)]


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
