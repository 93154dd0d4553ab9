"""The emulated network's rules that need no root: token buckets, subnets, names, the
requirement check's messages, and the link rates ``heraldps local`` asks for."""

from __future__ import annotations

import ipaddress

import pytest

from launcher.cluster import link_rates
from launcher.iproute import NetworkError
from launcher.netns import (
    LINK_PREFIX,
    MTU,
    NAMESPACE_PREFIX,
    NetworkUnavailable,
    TokenBucket,
    check_requirements,
    free_subnet,
    owner_of,
)


@pytest.mark.parametrize("mbit", [0.5, 10, 50, 100, 1000, 10_000])
def test_the_bucket_holds_whole_packets_and_queues_a_tenth_of_a_second(mbit: float) -> None:
    bucket = TokenBucket.for_rate(mbit)
    assert bucket.rate_kbit == round(mbit * 1000)
    assert bucket.burst_bytes >= 2 * MTU  # a packet larger than the burst would never pass
    assert bucket.burst_bytes >= mbit * 1e6 / 8 * 0.001 - 1
    queued = bucket.limit_bytes - bucket.burst_bytes
    assert queued >= MTU and queued >= mbit * 1e6 / 8 * 0.1 - 1


def test_a_slow_link_gets_little_for_free_after_a_pause() -> None:
    # 10 Mbit/s: the full bucket is 2 jumbo packets, about 14 ms of the link.
    assert TokenBucket.for_rate(10).burst_bytes * 8 / 10e6 < 0.015


def test_the_subnet_avoids_every_address_and_route_in_use() -> None:
    assert free_subnet(["127.0.0.1/8", "192.0.2.2/24"]) == ipaddress.IPv4Network("10.213.0.0/24")
    busy = ["10.213.0.1/24", "10.213.1.0/24", "10.213.2.7/32", "fd00::2/64"]
    assert free_subnet(busy) == ipaddress.IPv4Network("10.213.3.0/24")


def test_no_free_subnet_says_what_to_do() -> None:
    for taken in (["10.213.0.0/16"], ["10.0.0.0/8"]):
        with pytest.raises(NetworkError, match=r"every /24 of 10\.213\.0\.0/16 is in use"):
            free_subnet(taken)


def test_names_carry_the_launcher_pid_and_fit_an_interface_name() -> None:
    pid_max = 4_194_304  # Linux's largest PID
    bridge, veth = f"{LINK_PREFIX}{pid_max}b", f"{LINK_PREFIX}{pid_max}v252"
    assert len(bridge) <= 15 and len(veth) <= 15  # IFNAMSIZ - 1
    assert owner_of(bridge) == pid_max and owner_of(veth) == pid_max
    assert owner_of(f"{NAMESPACE_PREFIX}1234-worker-3") == 1234
    for other in ("eth0", "hpsb", "hps12x", "heraldps-x-ps-0", "docker0", "lo"):
        assert owner_of(other) is None, other


def test_without_root_the_error_is_one_line_that_says_what_to_do() -> None:
    with pytest.raises(NetworkUnavailable) as info:
        check_requirements(has_cap=False, which=lambda tool: f"/usr/sbin/{tool}")
    message = str(info.value)
    assert "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)" in message
    assert "without --link-mbit" in message
    assert "\n" not in message


def test_without_iproute2_the_error_names_the_missing_tool() -> None:
    with pytest.raises(NetworkUnavailable, match=r"iproute2's tc on PATH"):
        check_requirements(has_cap=True, which=lambda tool: None if tool == "tc" else tool)
    check_requirements(has_cap=True, which=lambda tool: tool)  # all there: no error


def test_ps_links_may_differ_from_the_others() -> None:
    assert link_rates(2, 3, 50.0, 200.0) == {
        "ps-0": 200.0, "ps-1": 200.0, "scheduler": 50.0,
        "worker-0": 50.0, "worker-1": 50.0, "worker-2": 50.0,
    }  # fmt: skip
    assert set(link_rates(1, 1, 10.0).values()) == {10.0}
