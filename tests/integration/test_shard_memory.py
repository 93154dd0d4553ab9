"""A shard's memory holds its limit, with real shard processes (``heraldps ps``) and real
LMDB in temp dirs: an empty Cached table costs only the documented per-table overhead
(its cache is committed as rows arrive), CreateTable past ``--memory-limit-gb`` is
RESOURCE_EXHAUSTED on every shard before any creates the table, and the shards always
end with the same tables (docs/cached-ps.md, "Memory")."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition, ResourceExhausted
from heraldps.optim import AdaGrad
from heraldps.spec import TableSpec
from heraldps.v1 import ps_pb2, ps_pb2_grpc
from ps_server.cached_store import CachedStore
from ps_server.cached_table import CachePolicy
from ps_server.memory import TABLE_OVERHEAD_BYTES
from tests import processes

# Start-up noise on top of the tables: gRPC's and malloc's first allocations for the
# calls (measured under 10 MB; the bound stays far below one unfixed table's cache).
SLACK_BYTES = 16 * 2**20


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Shards:
    """Real shard processes; ``flags[i]`` are shard i's extra ``heraldps ps`` flags."""

    def __init__(
        self, workdir: Path, store: str, flags: list[list[str]], env: dict[str, str] | None = None
    ) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.addresses: list[str] = []
        count = len(flags)
        for index, extra in enumerate(flags):
            name = f"shard-{index}"
            port_file = workdir / f"{name}.port"
            args = ["ps", "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
                    "--shard-index", str(index), "--num-shards", str(count), "--store", store,
                    *extra]  # fmt: skip
            if store == "cached":
                args += ["--data-dir", str(workdir / "data")]
            self.procs.append(processes.start(name, args, workdir, env))
        for index, proc in enumerate(self.procs):
            name = f"shard-{index}"
            port = processes.port(workdir / f"{name}.port", proc, workdir, name)
            self.addresses.append(f"127.0.0.1:{port}")

    def tables_of_each(self) -> list[list[str]]:
        """Each shard's table names, asked of that shard alone."""
        names = []
        for address in self.addresses:
            with PSClient([address]) as one:
                names.append(sorted(one.list_tables()))
        return names


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[type[Shards]]:
    started: list[Shards] = []

    class Started(Shards):
        def __init__(
            self, store: str, flags: list[list[str]], env: dict[str, str] | None = None
        ) -> None:
            super().__init__(tmp_path, store, flags, env)
            started.append(self)

    yield Started  # type: ignore[misc]
    for s in started:
        processes.stop_all(s.procs)


def test_empty_cached_tables_cost_only_the_per_table_overhead(shards: type[Shards]) -> None:
    """200 empty dim-4 tables of a 0.05 GB cache each (10 GB of caches configured): the
    shard grows by at most 200 x the documented overhead. Before, each table's cache was
    touched at CreateTable (about 100 MB each, checked after every table)."""
    # One malloc arena: the calls' temporaries, warmed up once, reuse the same heap
    # (with two, whichever arena a call lands on keeps its own copy of them).
    cluster = shards("cached", [["--cache-gb", "0.05"]], {**os.environ, "MALLOC_ARENA_MAX": "1"})
    pid = cluster.procs[0].pid
    keys = np.arange(50_000, dtype=np.int64)
    with PSClient(cluster.addresses) as ps:
        # The first calls' one-off costs: compiled kernels loaded (eviction's too), the
        # heap each of malloc's arenas keeps for the calls' temporaries.
        ps.create_table("warm", 4, AdaGrad())
        for t in range(16):
            ps.pull("warm", keys + t * 50_000)
        start = rss_bytes(pid)
        for i in range(200):
            ps.create_table(f"t{i}", 4, AdaGrad())
            grown = rss_bytes(pid) - start
            assert grown <= (i + 1) * TABLE_OVERHEAD_BYTES + SLACK_BYTES, (
                f"{i + 1} empty tables grew the shard by {grown / 2**20:.1f} MiB"
            )
        # Rows commit the cache as they arrive (800,000 rows pulled, room for about
        # 385,000), never past its size. The calls' temporaries first (malloc gave
        # them back while the tables were created).
        ps.pull("warm", keys)
        before = rss_bytes(pid)
        for t in range(16):
            ps.pull("t0", keys + t * 50_000)
        cache = int(0.05 * 2**30)
        assert ps.describe_table("t0").bytes <= cache
        grown = rss_bytes(pid) - before
        assert grown <= cache + SLACK_BYTES, f"a full cache grew the shard by {grown / 2**20} MiB"


def create_until_refused(ps: PSClient, tries: int) -> tuple[list[str], ResourceExhausted]:
    made = []
    for i in range(tries):
        try:
            ps.create_table(f"t{i}", 4, AdaGrad())
        except ResourceExhausted as err:
            return made, err
        made.append(f"t{i}")
    raise AssertionError(f"{tries} tables created, none refused: the memory limit did not hold")


@pytest.mark.parametrize("store", ["cached", "staged"])
def test_create_table_past_the_limit_is_refused_on_every_shard(
    shards: type[Shards], store: str
) -> None:
    """Shard 1 has room for more tables than shard 0: the table shard 0 cannot hold is
    refused on both, and both shards list the same tables."""
    if store == "cached":  # 10 MiB caches: 5 fit in 0.06 GB, 10 in 0.11 GB
        flags = [["--cache-gb", "0.01", "--memory-limit-gb", limit] for limit in ("0.06", "0.11")]
        tries = 12
    else:  # the empty tables' indexes and overhead alone
        limit0 = 20 * TABLE_OVERHEAD_BYTES / 2**30
        flags = [["--memory-limit-gb", str(limit)] for limit in (limit0, 2 * limit0)]
        tries = 40
    cluster = shards(store, flags)
    with PSClient(cluster.addresses) as ps:
        made, err = create_until_refused(ps, tries)
        assert made, "not even one table fit"
        assert "memory-limit-gb" in str(err)
        assert "nothing was created" in str(err.__notes__)
        assert cluster.tables_of_each() == [sorted(made)] * 2
        # Refused again, and still nowhere.
        with pytest.raises(ResourceExhausted):
            ps.create_table(f"t{len(made)}", 4, AdaGrad())
        assert cluster.tables_of_each() == [sorted(made)] * 2


def test_concurrent_creates_leave_every_shard_with_the_same_tables(
    shards: type[Shards],
) -> None:
    """Eight clients create eight tables at once on two shards with room for three: each
    create succeeds everywhere or is refused and rolled back everywhere."""
    cluster = shards("cached", [["--cache-gb", "0.01", "--memory-limit-gb", "0.035"]] * 2)
    outcomes: dict[str, str] = {}

    def create(name: str) -> None:
        with PSClient(cluster.addresses) as ps:
            try:
                ps.create_table(name, 4, AdaGrad())
                outcomes[name] = "created"
            except ResourceExhausted:
                outcomes[name] = "refused"

    threads = [threading.Thread(target=create, args=(f"c{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    created = sorted(name for name, outcome in outcomes.items() if outcome == "created")
    assert len(outcomes) == 8 and len(created) <= 3, outcomes
    assert cluster.tables_of_each() == [created, created]


def test_a_create_that_fails_on_one_shard_is_dropped_from_the_others(
    shards: type[Shards],
) -> None:
    """Shard 1's LMDB map (64 KiB) fills after some tables: that create passes every
    check and fails only when written, so shard 0 has created it; the client drops it
    there again."""
    cluster = shards("cached", [["--cache-gb", "0.001"],
                                ["--cache-gb", "0.001", "--max-disk-gb", "0.00006"]])  # fmt: skip
    with PSClient(cluster.addresses) as ps:
        made, err = create_until_refused(ps, 100)
        assert "max-disk-gb" in str(err)
        assert "dropped again from" in str(err.__notes__), err.__notes__
        assert cluster.tables_of_each() == [sorted(made)] * 2


def test_drop_table_removes_only_an_empty_table(shards: type[Shards]) -> None:
    """The limit holds one 0.01 GB cache: dropping the empty table frees it for the next;
    a table with rows (even rows a pull created, only in its cache) is never dropped."""
    cluster = shards("cached", [["--cache-gb", "0.01", "--memory-limit-gb", "0.02"]])
    with (
        grpc.insecure_channel(cluster.addresses[0]) as channel,
        PSClient(cluster.addresses) as ps,
    ):
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        ps.create_table("empty", 4, AdaGrad())
        stub.DropTable(ps_pb2.DropTableRequest(table="empty"))
        assert ps.list_tables() == {}
        ps.create_table("full", 4, AdaGrad())
        ps.pull("full", np.arange(10, dtype=np.int64))
        with pytest.raises(grpc.RpcError) as err:
            stub.DropTable(ps_pb2.DropTableRequest(table="full"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert sorted(ps.list_tables()) == ["full"]
        with pytest.raises(ResourceExhausted):
            ps.create_table("second", 4, AdaGrad())


def test_a_data_dir_whose_tables_pass_the_limit_is_refused_at_start(tmp_path: Path) -> None:
    policy = CachePolicy(cache_bytes=8 * 2**20)
    store = CachedStore(tmp_path, policy=policy)
    for name in ("a", "b", "c"):
        store.create_table(TableSpec(name, 4, optimizer=AdaGrad()))
    store.close()
    with pytest.raises(FailedPrecondition, match=r"3 tables .* raise --memory-limit-gb"):
        CachedStore(tmp_path, policy=policy, memory_limit_bytes=20 * 2**20)
    CachedStore(tmp_path, policy=policy, memory_limit_bytes=30 * 2**20).close()


def test_cached_gradient_buffers_count_against_the_limit(tmp_path: Path) -> None:
    """A push whose buffer would pass the limit is refused and buffers nothing; a commit
    gives the buffer's memory back."""
    limit = 4 * 2**20 + TABLE_OVERHEAD_BYTES + 2 * 2**20
    store = CachedStore(tmp_path, policy=CachePolicy(4 * 2**20), memory_limit_bytes=limit)
    try:
        store.create_table(TableSpec("t", 16, optimizer=AdaGrad()))
        held = store.budget.used_bytes
        small = np.arange(1000, dtype=np.int64)
        store.push("t", 0, small, np.ones((1000, 16), np.float32))
        assert store.budget.used_bytes > held
        big = np.arange(100_000, dtype=np.int64)  # ~8 MB of buffer
        with pytest.raises(ResourceExhausted, match="memory limit"):
            store.push("t", 0, big, np.ones((100_000, 16), np.float32))
        store.commit(0)
        assert store.budget.used_bytes == held
        assert store.table("t").rows == 1000  # only the first push was applied
    finally:
        store.close()
