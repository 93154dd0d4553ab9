"""The one place that runs iproute2 (``ip``, ``tc``): namespaces, links, addresses, qdiscs.

Each function is one command; a failure raises :class:`NetworkError` with the
command and its stderr on one line, so the launcher can print it as is.
Reads use ``ip -json`` so nothing parses iproute2's human output.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from heraldps.errors import HeraldError

COMMAND_TIMEOUT_SECONDS = 30.0


class NetworkError(HeraldError):
    """An ``ip`` or ``tc`` command failed; the message names the command and why."""


def run(*argv: str) -> str:
    """Run ``argv`` (``ip ...``, ``tc ...``, or ``iptables ...`` for launcher.firewall); its
    stdout, or NetworkError."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkError(f"`{' '.join(argv)}` could not run: {exc}") from None
    if done.returncode != 0:
        why = " ".join(done.stderr.split()) or f"exit code {done.returncode}"
        raise NetworkError(f"`{' '.join(argv)}` failed: {why}")
    return done.stdout


def _json(*argv: str) -> list[dict[str, Any]]:
    text = run("ip", "-json", *argv).strip()
    result: list[dict[str, Any]] = json.loads(text) if text else []
    return result


# ----- reads -------------------------------------------------------------------------------


def namespaces() -> list[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    return [entry["name"] for entry in _json("netns", "list")]


def namespace_pids(namespace: str) -> list[int]:
    """Processes living in ``namespace`` (empty if it is gone)."""
    try:
        return [int(p) for p in run("ip", "netns", "pids", namespace).split()]
    except NetworkError:
        return []


def links() -> list[str]:
    """Interface names in the root namespace."""
    return [entry["ifname"] for entry in _json("link", "show")]


def ipv4_networks() -> list[str]:
    """Every IPv4 network in use in the root namespace: interface addresses
    (``a.b.c.d/len``) and route destinations other than the default route."""
    used = [
        f"{info['local']}/{info['prefixlen']}"
        for entry in _json("-4", "addr", "show")
        for info in entry.get("addr_info", [])
    ]
    routes = _json("-4", "route", "show", "table", "all")
    used += [r["dst"] for r in routes if r["dst"] != "default"]
    return used


# ----- changes -----------------------------------------------------------------------------


def add_namespace(namespace: str) -> None:
    run("ip", "netns", "add", namespace)
    run("ip", "-n", namespace, "link", "set", "lo", "up")


def delete_namespace(namespace: str) -> None:
    run("ip", "netns", "delete", namespace)


def add_bridge(name: str, address: str) -> None:
    """A bridge in the root namespace, up, with ``address`` (``a.b.c.d/len``)."""
    run("ip", "link", "add", name, "type", "bridge")
    run("ip", "addr", "add", address, "dev", name)
    run("ip", "link", "set", name, "up")


def add_veth(
    host_end: str, bridge: str, namespace: str, inner: str, address: str, mtu: int
) -> None:
    """A veth pair: ``host_end`` on ``bridge``, ``inner`` in ``namespace`` with ``address``."""
    run("ip", "link", "add", host_end, "mtu", str(mtu), "type", "veth",
        "peer", "name", inner, "mtu", str(mtu), "netns", namespace)  # fmt: skip
    run("ip", "link", "set", host_end, "master", bridge)
    run("ip", "link", "set", host_end, "up")
    run("ip", "-n", namespace, "addr", "add", address, "dev", inner)
    run("ip", "-n", namespace, "link", "set", inner, "up")


def delete_link(name: str) -> None:
    run("ip", "link", "delete", name)


def add_token_bucket(
    dev: str, rate_kbit: int, burst_bytes: int, limit_bytes: int, namespace: str | None = None
) -> None:
    """A ``tbf`` root qdisc on ``dev``: its egress at ``rate_kbit`` kbit/s."""
    where = ("-n", namespace) if namespace else ()
    run("tc", *where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_kbit}kbit",
        "burst", str(burst_bytes), "limit", str(limit_bytes))  # fmt: skip
