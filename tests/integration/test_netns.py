"""The emulated network itself (launcher/netns.py): real namespaces, veths, token buckets.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and the tbf qdisc; skipped with the reason
elsewhere. Traffic stays inside the test's own namespaces and bridge. The local
cluster on it: tests/e2e/test_local_network.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from launcher import iproute
from launcher.netns import ClusterNetwork, NetworkUnavailable, remove_stale, running
from tests.network import leftovers, require_network

RECEIVE = r"""
import socket, sys, time
server = socket.socket()
server.bind((sys.argv[1], 0))
server.listen(1)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
received, first = 0, None
while chunk := conn.recv(1 << 20):
    first = first or time.perf_counter()
    received += len(chunk)
print(received, time.perf_counter() - first, flush=True)
"""
SEND = r"""
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
for _ in range(int(sys.argv[3])):
    conn.sendall(b"x" * (1 << 20))
conn.close()
"""


@pytest.fixture(scope="module", autouse=True)
def network_here() -> None:
    require_network()


def inside(namespace: str | None, *command: str) -> list[str]:
    return ["ip", "netns", "exec", namespace, *command] if namespace else list(command)


def mbit_per_second(
    network: ClusterNetwork, sender: str | None, receiver: str, mib: int = 4
) -> float:
    """TCP throughput from ``sender`` (None: the root namespace) to ``receiver``."""
    to = network.endpoint(receiver)
    server = subprocess.Popen(
        inside(to.namespace, sys.executable, "-c", RECEIVE, to.host),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    port = server.stdout.readline().strip()
    source = network.endpoint(sender).namespace if sender else None
    subprocess.run(inside(source, sys.executable, "-c", SEND, to.host, port, str(mib)),
                   check=True, timeout=60)  # fmt: skip
    received, seconds = server.stdout.readline().split()
    server.wait(timeout=10)
    assert int(received) == mib << 20
    return int(received) * 8 / float(seconds) / 1e6


def test_a_link_carries_its_rate_each_way() -> None:
    """``a`` at 50 Mbit/s, ``b`` at 200: a -> b is held by a's namespace end, b -> a and
    the launcher -> a by a's bridge end (tbf shapes egress only: one on each end)."""
    with ClusterNetwork({"a": 50.0, "b": 200.0}) as network:
        rates = {
            "a -> b": mbit_per_second(network, "a", "b"),
            "b -> a": mbit_per_second(network, "b", "a"),
            "launcher -> a": mbit_per_second(network, None, "a"),
        }
    for direction, rate in rates.items():
        assert 50 * 0.85 <= rate <= 50 * 1.15, f"{direction}: {rate:.1f} Mbit/s, not ~50"
    assert not leftovers(os.getpid())


def test_the_network_goes_with_the_context_also_on_an_error() -> None:
    """Leaving kills what still runs inside and removes namespaces, veths, bridge."""
    with pytest.raises(RuntimeError, match="boom"), ClusterNetwork({"a": 10.0}) as network:
        sleeper = subprocess.Popen(inside(network.endpoint("a").namespace, "sleep", "600"))
        assert len(leftovers(os.getpid())) == 3  # namespace, veth, bridge
        raise RuntimeError("boom")
    assert not leftovers(os.getpid())
    assert sleeper.wait(timeout=10) == -9


def test_a_network_that_cannot_be_built_is_a_one_line_error_and_leaves_nothing() -> None:
    with pytest.raises(NetworkUnavailable) as info, ClusterNetwork({"a": 10.0, "b/c": 10.0}):
        pass
    message = str(info.value)
    assert message.startswith("could not build the emulated network for --link-mbit: `ip ")
    assert f"heraldps-{os.getpid()}-b/c" in message and "\n" not in message
    assert not leftovers(os.getpid())


@pytest.fixture
def dead_pid() -> int:
    """The PID of a process that has exited (stands for a launcher killed with -9)."""
    probe = subprocess.Popen(["true"])
    probe.wait()
    assert not running(probe.pid)
    return probe.pid


def test_a_start_removes_the_networks_of_dead_launchers_only(dead_pid: int) -> None:
    mine = os.getpid()
    iproute.add_namespace(f"heraldps-{dead_pid}-worker-0")
    iproute.add_bridge(f"hps{dead_pid}b", "10.213.254.1/24")
    iproute.add_namespace(f"heraldps-{mine}-alive")
    try:
        assert dead_pid in remove_stale()
        assert not leftovers(dead_pid)
        assert leftovers(mine) == [f"heraldps-{mine}-alive"]  # its launcher still runs
    finally:
        iproute.delete_namespace(f"heraldps-{mine}-alive")
        for name in leftovers(dead_pid):
            subprocess.run(["ip", "link", "delete", name], check=False)


def forward_rules() -> list[str]:
    done = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_bridge_forwards_when_the_host_firewall_drops_forwarding() -> None:
    """Docker loads br_netfilter and sets FORWARD's policy to DROP: bridged frames between two
    namespaces then meet the host's iptables. Our bridge's own ACCEPT rule carries them (a
    transfer used to hang until its timeout), and the rule goes with the network."""
    bridged = "/proc/sys/net/bridge/bridge-nf-call-iptables"
    if shutil.which("iptables") is None or not os.path.exists(bridged):
        pytest.skip("needs iptables and br_netfilter (modprobe br_netfilter; Docker loads it)")
    with open(bridged) as flag:
        if flag.read().strip() != "1":
            pytest.skip("br_netfilter does not pass bridged frames to iptables here")
    policy = next(r for r in forward_rules() if r.startswith("-P FORWARD")).split()[-1]
    subprocess.run(["iptables", "-w", "-P", "FORWARD", "DROP"], check=True)
    try:
        with ClusterNetwork({"a": 200.0, "b": 200.0}) as network:
            assert mbit_per_second(network, "a", "b", mib=1) > 0
            bridge = network.bridge
            assert f"-A FORWARD -i {bridge} -o {bridge} -j ACCEPT" in forward_rules()
        assert not [r for r in forward_rules() if bridge in r]
    finally:
        subprocess.run(["iptables", "-w", "-P", "FORWARD", policy], check=True)
    assert not leftovers(os.getpid())
