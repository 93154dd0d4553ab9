"""An emulated cluster network: every local-cluster process behind its own rate-limited link.

``heraldps local --link-mbit R`` puts each process (PS shard, scheduler, worker)
in its own Linux network namespace, joined to one bridge by a veth pair with a
token bucket (``tc tbf``) of R Mbit/s on both ends: tbf shapes egress only, so
the namespace end limits what the process sends and the bridge end what it
receives, as if each process had its own NIC on one switch. The bridge has an
address in the root namespace, so the launcher reaches every process (feeding,
/metrics, reading the model). Only bandwidth is emulated: no latency (netem is
not available on our machines), no CPU of other machines.

Names carry the launcher's PID, so a leftover says who made it: namespaces
``heraldps-<pid>-<process>``, interfaces ``hps<pid>b`` (bridge) and
``hps<pid>v<i>`` (bridge end of process i's veth; the namespace end is
``eth0``). Everything is removed when the :class:`ClusterNetwork` context
ends, by a reaper process when the launcher dies without ending it (SIGKILL),
and at every start for launchers that are dead (:func:`remove_stale`).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType

from heraldps.errors import InvalidArgument
from launcher import firewall, iproute
from launcher.iproute import NetworkError
from launcher.lifeline import interrupt

NAMESPACE_PREFIX = "heraldps-"
LINK_PREFIX = "hps"
INNER_LINK = "eth0"
# Jumbo frames, as datacenter NICs of training clusters run: six times fewer packets per
# byte than Ethernet's 1500, which matters on a 2-core machine where the emulation's
# per-packet work competes with training (1 Gbit/s links carried 0.93 Gbit/s of TCP
# with 9000, 0.72-0.84 with 1500). The token bucket's burst must hold a whole packet,
# or larger packets are dropped forever (tbf segments GSO super-packets itself).
MTU = 9000
# The bucket holds BURST_SECONDS at the link rate, but at least BURST_PACKETS packets:
# small, so that a message after an idle pause gets little for free (18 KB, 14 ms at
# 10 Mbit/s), and at high rates large enough for the kernel's timer to keep up.
BURST_SECONDS = 0.001
BURST_PACKETS = 2
# Queue behind the bucket, in seconds at the link rate (a switch port's buffer). Packets
# beyond it are dropped, as on a real port, and TCP backs off; 0.1 s lets 4 senders into
# one link keep it busy (a 0.02 s queue lost a third of its rate to retransmissions).
QUEUE_SECONDS = 0.1
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
MAX_PROCESSES = 253  # one /24 per network: .1 is the bridge
NEEDED_CAPABILITIES = 1 << 12 | 1 << 21  # CAP_NET_ADMIN, CAP_SYS_ADMIN
_OWNED = re.compile(rf"^(?:{NAMESPACE_PREFIX}(\d+)-|{LINK_PREFIX}(\d+)[bv]\d*$)")


class NetworkUnavailable(InvalidArgument):
    """``--link-mbit`` cannot run here (not root, no iproute2, no tbf); says what to do.
    An InvalidArgument, so ``heraldps local`` exits 2 as for a bad configuration."""


@dataclass(frozen=True)
class TokenBucket:
    """One ``tbf`` qdisc: rate, burst (bucket size) and queue limit, in kbit/s and bytes."""

    rate_kbit: int
    burst_bytes: int
    limit_bytes: int

    @classmethod
    def for_rate(cls, mbit: float) -> TokenBucket:
        bytes_per_second = mbit * 1e6 / 8
        burst = max(BURST_PACKETS * MTU, round(bytes_per_second * BURST_SECONDS))
        limit = burst + max(MTU, round(bytes_per_second * QUEUE_SECONDS))
        return cls(max(1, round(mbit * 1000)), burst, limit)


@dataclass(frozen=True)
class Endpoint:
    """Where one process lives: its namespace, its address on the bridge, and the host
    end of its veth (whose counters are the process's link traffic)."""

    namespace: str
    host: str
    host_link: str = ""


def has_capabilities() -> bool:
    """Whether this process may build the network (root normally may): CAP_NET_ADMIN for
    links and qdiscs, and CAP_SYS_ADMIN, which ``ip netns add`` and ``ip netns exec`` need
    (a new namespace, a bind mount, a remount of /sys)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16) & NEEDED_CAPABILITIES == NEEDED_CAPABILITIES
    except OSError:
        pass
    return os.geteuid() == 0


def check_requirements(
    has_cap: bool | None = None, which: Callable[[str], str | None] = shutil.which
) -> None:
    """NetworkUnavailable, one line, unless this machine can build the emulated network."""
    missing = [tool for tool in ("ip", "tc") if which(tool) is None]
    if missing:
        raise NetworkUnavailable(
            f"--link-mbit needs iproute2's {' and '.join(missing)} on PATH (Debian/Ubuntu: "
            "apt-get install iproute2); or run without --link-mbit (loopback)"
        )
    if not (has_capabilities() if has_cap is None else has_cap):
        raise NetworkUnavailable(
            "--link-mbit creates network namespaces and needs root (CAP_NET_ADMIN and "
            "CAP_SYS_ADMIN): run as root (sudo heraldps local ...), or without --link-mbit "
            "(loopback)"
        )


class ClusterNetwork:
    """Namespaces, veths, token buckets and the bridge for ``links`` (process name -> Mbit/s).

    A context manager: entering builds everything (after removing stale networks of
    dead launchers) or nothing; leaving kills any process still inside a namespace
    and removes it all. While it exists SIGTERM raises KeyboardInterrupt, so the
    launcher's ``finally`` blocks stop the cluster as on Ctrl-C.
    """

    def __init__(self, links: Mapping[str, float], owner: int | None = None) -> None:
        if not links:
            raise InvalidArgument("an emulated network needs at least one process")
        self.owner = os.getpid() if owner is None else owner
        self.links = dict(links)
        self.bridge = f"{LINK_PREFIX}{self.owner}b"
        self.bridge_host = ""
        self._endpoints: dict[str, Endpoint] = {}
        self._reaper: subprocess.Popen[bytes] | None = None
        self._previous_sigterm: Callable[[int, FrameType | None], object] | int | None = None

    def endpoint(self, name: str) -> Endpoint:
        """The namespace and address of process ``name``."""
        try:
            return self._endpoints[name]
        except KeyError:
            raise InvalidArgument(
                f"no link for process {name!r} (links: {', '.join(self.links)})"
            ) from None

    def link_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each process's link carried so far: ``in`` (to the process) and ``out``,
        from the host end's counters (what it transmits reaches the process)."""
        out = {}
        for name, endpoint in self._endpoints.items():
            stats = Path("/sys/class/net") / endpoint.host_link / "statistics"
            try:
                sent = int((stats / "tx_bytes").read_text())
                received = int((stats / "rx_bytes").read_text())
            except OSError:
                continue
            out[name] = {"in": sent, "out": received}
        return out

    def __enter__(self) -> ClusterNetwork:
        remove_stale()
        self._reaper = spawn_reaper(self.owner)
        try:
            self._trap_sigterm()
            self._build()
        except NetworkError as exc:  # e.g. no tbf in this kernel: nothing started yet
            self.close()
            raise NetworkUnavailable(
                f"could not build the emulated network for --link-mbit: {exc}"
            ) from None
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _build(self) -> None:
        if len(self.links) > MAX_PROCESSES:
            raise InvalidArgument(
                f"{len(self.links)} processes: an emulated network holds at most {MAX_PROCESSES}"
            )
        with _subnet_lock():
            subnet = free_subnet(iproute.ipv4_networks())
            hosts = subnet.hosts()
            self.bridge_host = str(next(hosts))
            iproute.add_bridge(self.bridge, f"{self.bridge_host}/{subnet.prefixlen}")
            firewall.accept_bridge(self.bridge)
        for index, (name, mbit) in enumerate(self.links.items()):
            namespace = f"{NAMESPACE_PREFIX}{self.owner}-{name}"
            host, host_end = str(next(hosts)), f"{LINK_PREFIX}{self.owner}v{index}"
            iproute.add_namespace(namespace)
            self._endpoints[name] = Endpoint(namespace, host, host_end)
            iproute.add_veth(host_end, self.bridge, namespace, INNER_LINK,
                             f"{host}/{subnet.prefixlen}", MTU)  # fmt: skip
            bucket = TokenBucket.for_rate(mbit)
            for dev, where in ((host_end, None), (INNER_LINK, namespace)):
                iproute.add_token_bucket(
                    dev, bucket.rate_kbit, bucket.burst_bytes, bucket.limit_bytes, where
                )

    def _trap_sigterm(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, interrupt)

    def close(self) -> None:
        """Remove everything (idempotent), then let the reaper go."""
        try:
            remove_network(self.owner)
        finally:
            if self._previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
                self._previous_sigterm = None
            if self._reaper is not None:
                assert self._reaper.stdin is not None
                self._reaper.stdin.close()  # EOF: the reaper checks once more and exits
                try:
                    self._reaper.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._reaper.kill()
                self._reaper = None


def free_subnet(in_use: list[str]) -> ipaddress.IPv4Network:
    """The first /24 of 10.213.0.0/16 that overlaps no address or route in use."""
    used = [ipaddress.ip_network(n, strict=False) for n in in_use]
    for subnet in SUBNETS.subnets(new_prefix=24):
        if not any(subnet.overlaps(u) for u in used if u.version == 4):
            return subnet
    raise NetworkError(
        f"every /24 of {SUBNETS} is in use (addresses or routes): remove stale "
        "heraldps networks (docs/network.md) or free one"
    )


@contextmanager
def _subnet_lock() -> Iterator[None]:
    """One launcher at a time picks a subnet and addresses its bridge."""
    path = os.path.join(tempfile.gettempdir(), "heraldps-netns.lock")
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def owner_of(name: str) -> int | None:
    """The launcher PID in one of our namespace or interface names, else None."""
    match = _OWNED.match(name)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def owned(owner: int) -> tuple[list[str], list[str]]:
    """(namespaces, root-namespace interfaces) that launcher ``owner`` made."""
    namespaces = [n for n in iproute.namespaces() if owner_of(n) == owner]
    links = [n for n in iproute.links() if owner_of(n) == owner]
    return namespaces, links


def remove_network(owner: int) -> bool:
    """Kill what still runs in launcher ``owner``'s namespaces and remove its namespaces,
    veths and bridge; True if anything was there. Tolerates a concurrent remover."""
    namespaces, links = owned(owner)
    firewall.remove_bridge(f"{LINK_PREFIX}{owner}b")  # also a rule whose bridge is gone
    if not namespaces and not links:
        return False
    pids = [p for n in namespaces for p in iproute.namespace_pids(n) if p != os.getpid()]
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(pids, timeout=5.0)
    bridge = f"{LINK_PREFIX}{owner}b"
    # veths first (each removes its pair, also inside a namespace), the bridge last.
    for link in sorted(links, key=lambda n: n == bridge):
        _quietly(iproute.delete_link, link)
    for namespace in namespaces:
        _quietly(iproute.delete_namespace, namespace)
    left = owned(owner)
    if left[0] or left[1]:
        raise NetworkError(
            f"could not remove {', '.join(left[0] + left[1])}: remove by hand "
            "(docs/network.md, 'Leftovers')"
        )
    return True


def remove_stale() -> list[int]:
    """Remove the networks of launchers that are no longer running; their PIDs."""
    owners = {owner_of(n) for n in [*iproute.namespaces(), *iproute.links()]} - {None}
    dead = sorted(o for o in owners if o is not None and not running(o))
    for owner in dead:
        remove_network(owner)
    return dead


def spawn_reaper(owner: int) -> subprocess.Popen[bytes]:
    """A process in its own session that removes ``owner``'s network once the pipe to it
    closes: when the launcher ends, however it ends (a SIGKILL closes the pipe too)."""
    return subprocess.Popen(
        [sys.executable, "-m", "launcher.reaper", str(owner)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def running(pid: int) -> bool:
    """Running (a zombie, dead but not yet waited for, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _quietly(remove: Callable[[str], None], name: str) -> None:
    """Remove ``name``; one already gone (another remover, a pair's other end) is fine."""
    with suppress(NetworkError):
        remove(name)
