"""The host firewall's part in the emulated network: let our bridge forward between its ports.

Traffic between two processes of ``heraldps local --link-mbit`` crosses the bridge in the
root namespace. Where ``br_netfilter`` is loaded (Docker loads it), bridged frames go
through iptables' FORWARD chain, and Docker sets that chain's policy to DROP, so every
worker-to-PS connection would hang. One ACCEPT rule for frames that enter and leave our
bridge (the rule Docker itself adds for ``docker0``) lets them through and nothing else; it
is removed with the bridge. Without an ``iptables`` command there are no such rules to pass.
"""

from __future__ import annotations

import shutil

from launcher import iproute

MAX_COPIES = 16  # deleting stops here even if more copies of the rule were somehow added


def _match(bridge: str) -> list[str]:
    return ["-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def accept_bridge(bridge: str) -> bool:
    """Put the ACCEPT rule for ``bridge`` first in FORWARD; False when there is no iptables."""
    iptables = shutil.which("iptables")
    if iptables is None:
        return False
    iproute.run(iptables, "-w", "-I", "FORWARD", "1", *_match(bridge))
    return True


def remove_bridge(bridge: str) -> int:
    """Remove every copy of ``bridge``'s rule (none there is fine); how many were removed."""
    iptables = shutil.which("iptables")
    if iptables is None:
        return 0
    for removed in range(MAX_COPIES):
        try:
            iproute.run(iptables, "-w", "-D", "FORWARD", *_match(bridge))
        except iproute.NetworkError:
            return removed
    return MAX_COPIES
