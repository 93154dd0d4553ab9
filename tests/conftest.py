"""Shared fixtures: real shard servers on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from heraldps.client import PSClient
from ps_server.server import PSConfig, PSServer

ClusterFactory = Callable[..., tuple[list[PSServer], PSClient]]


@pytest.fixture
def cluster() -> Iterator[ClusterFactory]:
    """Start ``num_shards`` in-process shards and a client; everything stops after the test."""
    started: list[tuple[list[PSServer], PSClient]] = []

    def start(
        num_shards: int = 2,
        max_message_mb: int = 64,
        memory_limit_gb: float | None = None,
        client_max_message_mb: int | None = None,
        **store: Any,
    ) -> tuple[list[PSServer], PSClient]:
        """``store``: extra PSConfig fields, e.g. ``store="cached", data_dir=...``. A cached
        store gets a 10 MiB host cache per table unless the test says otherwise: the
        default (1 GiB) is touched when a table is created, and a suite of them would hold
        tens of GB."""
        if store.get("store") == "cached":
            store.setdefault("cache_gb", 0.01)
        servers = []
        for index in range(num_shards):
            server = PSServer(
                PSConfig(
                    host="127.0.0.1",
                    port=0,
                    shard_index=index,
                    num_shards=num_shards,
                    metrics_port=0,
                    max_message_mb=max_message_mb,
                    memory_limit_gb=memory_limit_gb,
                    grace_seconds=1.0,
                    **store,
                )
            )
            server.start()
            servers.append(server)
        client = PSClient(
            [f"127.0.0.1:{s.port}" for s in servers],
            max_message_mb=client_max_message_mb or max_message_mb,
        )
        client.wait_ready()
        started.append((servers, client))
        return servers, client

    yield start
    for servers, client in started:
        client.close()
        for server in servers:
            server.stop(grace=0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.gpu`` tests run only where CuPy sees a CUDA GPU (never in CI)."""
    from worker_client.device import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class XdistGroups:
    """Fails the run when ``--dist loadgroup`` did not group: the tests that bind fixed host
    ports (``xdist_group("host-ports")``) would then run at once and collide. pytest 9.2
    broke the grouping silently (pytest-xdist#1386); pyproject pins pytest below it."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not getattr(config.option, "loadgroup", False):
            return
        ungrouped = [
            i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid
        ]
        if ungrouped:
            raise pytest.UsageError(
                f"pytest-xdist did not group {ungrouped[:3]} (--dist loadgroup): these tests "
                "bind fixed host ports and must not run at once. Install the pytest version "
                "pyproject.toml's dev extra allows, or run serially with -p no:xdist"
            )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", "no") == "loadgroup" and _version(pytest.__version__) >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} breaks pytest-xdist's --dist loadgroup "
            "(pytest-xdist#1386), which keeps the tests that bind fixed host ports apart: "
            "install the dev extra again (pip install -e '.[dev]' pins pytest<9.2), or run "
            "serially with -p no:xdist"
        )
    config.pluginmanager.register(XdistGroups(), "heraldps-xdist-groups")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())
