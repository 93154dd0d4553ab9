"""The workers' dense all-reduce over real gRPC servers on 127.0.0.1.

Every worker must end each round with the same bits (replicas stay equal),
equal to the sum in worker order; a peer's bad part is refused with a clear
code and leaves the mailbox as it was; a replica updated from all-reduced
gradients equals what the PS path (push, commit) stores, bit for bit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from heraldps.errors import DeadlineExceeded, FailedPrecondition, HeraldError, Unavailable
from heraldps.model import RunningStats
from heraldps.optim import SGD, AdaGrad, Adam, Optimizer
from heraldps.v1 import collective_pb2, collective_pb2_grpc
from tests.conftest import ClusterFactory
from worker_client.collective import (
    DENSE_STREAM,
    STATISTICS_STREAM,
    AllReduce,
    BatchSums,
    Mailbox,
    part_edges,
    serve_collective,
)
from worker_client.dense_sync import AllReduceDense

MB = 2**20


@pytest.fixture
def ring() -> Iterator[Callable[..., list[AllReduce]]]:
    """``ring(n, size)``: n all-reduce members, each with its own server."""
    servers: list[grpc.Server] = []
    members: list[AllReduce] = []

    def start(n: int, size: int, timeout: float = 10.0) -> list[AllReduce]:
        boxes = [Mailbox(w, n, size) for w in range(n)]
        ports = []
        for box in boxes:
            server, port = serve_collective(box, "127.0.0.1", 0, 4 * MB)
            servers.append(server)
            ports.append(port)
        peers = [f"127.0.0.1:{p}" for p in ports]
        group = [AllReduce(w, peers, size, boxes[w], timeout, 4 * MB) for w in range(n)]
        members.extend(group)
        return group

    yield start
    for member in members:
        member.close()
    for server in servers:
        server.stop(grace=0)


def run_all(group: list[AllReduce], inputs: list[np.ndarray], round_: int) -> list[np.ndarray]:
    """Every member's ``sum`` at once (each blocks until its peers deliver)."""
    outputs: list[Any] = [None] * len(group)

    def one(w: int) -> None:
        try:
            outputs[w] = group[w].sum(inputs[w], round_)
        except HeraldError as err:
            outputs[w] = err

    threads = [threading.Thread(target=one, args=(w,)) for w in range(len(group))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outputs


@pytest.mark.parametrize(("workers", "size"), [(4, 1003), (3, 10), (3, 2), (1, 7)])
def test_every_worker_gets_the_same_bits_the_sum_in_worker_order(
    ring: Callable[..., list[AllReduce]], workers: int, size: int
) -> None:
    group = ring(workers, size)
    rng = np.random.default_rng(workers * size)
    for round_ in range(3):  # consecutive rounds reuse the mailboxes
        inputs = [rng.standard_normal(size).astype(np.float32) * 10**w for w in range(workers)]
        outputs = run_all(group, inputs, round_)
        expected = inputs[0].copy()
        for w in range(1, workers):
            expected += inputs[w]
        for out in outputs:
            assert isinstance(out, np.ndarray), out
            assert out.tobytes() == expected.tobytes()


def update_all(replicas: list[AllReduceDense], grads: list[np.ndarray], t: int,
               final: bool = False) -> None:  # fmt: skip
    """Every replica's ``update`` at once (each blocks until its peers deliver)."""
    threads = [threading.Thread(target=r.update, args=(g, t, final))
               for r, g in zip(replicas, grads, strict=True)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def test_bytes_per_worker_are_those_of_a_ring_all_reduce(
    ring: Callable[..., list[AllReduce]],
) -> None:
    n, size = 4, 1000
    group = ring(n, size)
    run_all(group, [np.ones(size, np.float32)] * n, 0)
    # Each direction carries (n-1)/n of the vector twice: 2 * 750 floats out, 2 * 750 in.
    assert [m.bytes_moved for m in group] == [4 * 4 * 750] * n


def deliver(port: int, **fields: Any) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        collective_pb2_grpc.CollectiveStub(channel).Deliver(
            collective_pb2.CollectivePart(**fields), timeout=10
        )


def test_bad_parts_are_refused_and_leave_the_mailbox_as_it_was() -> None:
    box = Mailbox(1, 3, 10)  # worker 1 of 3 owns part 1: floats 3..5
    server, port = serve_collective(box, "127.0.0.1", 0, 4 * MB)
    try:
        good = {"round": 5, "phase": 0, "sender": 0, "part": 1}
        three = np.arange(3, dtype="<f4").tobytes()
        cases = [
            ({**good, "values": np.arange(4, dtype="<f4").tobytes()}, "INVALID_ARGUMENT"),
            ({**good, "values": np.array([1, np.nan, 2], "<f4").tobytes()}, "INVALID_ARGUMENT"),
            ({**good, "sender": 1, "values": three}, "INVALID_ARGUMENT"),  # itself
            ({**good, "sender": 7, "values": three}, "INVALID_ARGUMENT"),
            ({**good, "part": 2, "values": three}, "INVALID_ARGUMENT"),  # not its part
            ({**good, "phase": 3, "values": three}, "INVALID_ARGUMENT"),
        ]
        for fields, code in cases:
            with pytest.raises(grpc.RpcError) as err:
                deliver(port, **fields)
            assert err.value.code().name == code, fields
        deliver(port, **good, values=three)
        with pytest.raises(grpc.RpcError) as err:  # the same part again, different values
            deliver(port, **good, values=np.ones(3, "<f4").tobytes())
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        deliver(port, **{**good, "round": 6}, values=three)
        with pytest.raises(grpc.RpcError) as err:  # a third round at once: a runaway peer
            deliver(port, **{**good, "round": 7}, values=three)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        (part,) = box.take(5, 0, [0], timeout=1)
        assert part.tolist() == [0.0, 1.0, 2.0]
        box.finish(5)
        with pytest.raises(grpc.RpcError) as err:  # round 5 is over
            deliver(port, **good, values=three)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        server.stop(grace=0)


def test_a_missing_or_dead_peer_fails_the_round_with_a_message(
    ring: Callable[..., list[AllReduce]],
) -> None:
    group = ring(2, 8, timeout=1.0)
    with pytest.raises(DeadlineExceeded, match="no phase-0 part of round 0 from workers"):
        group[0].sum(np.ones(8, np.float32), 0)  # worker 1 never calls sum
    dead = AllReduce(0, ["127.0.0.1:1", "127.0.0.1:9"], 8, Mailbox(0, 2, 8), 2.0, MB)
    with pytest.raises(Unavailable, match=r"127\.0\.0\.1:9"):
        dead.sum(np.ones(8, np.float32), 0)
    dead.close()


def test_part_edges_cover_the_vector() -> None:
    assert part_edges(10, 3) == [0, 3, 6, 10]
    assert part_edges(2, 3) == [0, 0, 1, 2]


@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), AdaGrad(lr=0.1), Adam(lr=0.01)])
def test_replicas_equal_each_other_and_the_ps_path(
    cluster: ClusterFactory, ring: Callable[..., list[AllReduce]], optimizer: Optimizer
) -> None:
    """Two workers' replicas after 4 iterations equal each other and the dense table the PS
    trains from the same gradients pushed and committed; worker 0's checkpoint is on the PS."""
    _, ps = cluster(2)
    size = 600  # three rows of 256: the last one padded
    initial = np.linspace(-1, 1, size, dtype=np.float32)
    allreduced = ps.create_dense("dense", size, optimizer, initial=initial)
    through_ps = ps.create_dense("twin", size, optimizer, initial=initial)
    group = ring(2, size)
    replicas = [AllReduceDense(ps, allreduced, optimizer, m, checkpoint_every=3) for m in group]
    rng = np.random.default_rng(1)
    for t in range(4):
        grads = [rng.standard_normal(size).astype(np.float32) for _ in range(2)]
        update_all(replicas, grads, t, final=t == 3)
        for w in range(2):  # worker order, as the all-reduce adds them
            ps.push_dense_gradients(through_ps, grads[w], t)
        ps.commit(t)
    (rows0, state0), (rows1, state1) = (r.replica() for r in replicas)
    assert rows0.tobytes() == rows1.tobytes() and state0.tobytes() == state1.tobytes()
    twin_rows, _, twin_state = ps.pull_with_state("twin", through_ps.keys)
    np.testing.assert_allclose(rows0, twin_rows, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(state0, twin_state, rtol=1e-6, atol=1e-7)
    stored, versions, stored_state = ps.pull_with_state("dense", allreduced.keys)
    assert stored.tobytes() == rows0.tobytes() and stored_state.tobytes() == state0.tobytes()
    assert versions.tolist() == [4, 4, 4]  # one per iteration, as commits would count


def test_started_updates_run_in_the_background_and_settle_to_the_same_replicas(
    cluster: ClusterFactory, ring: Callable[..., list[AllReduce]]
) -> None:
    """``start_update`` returns before the all-reduce can finish (worker 0 starts before worker
    1 has sent anything, from the same thread); ``values`` waits for it; the replicas equal
    those of updates run to the end, bit for bit. A failed background update (a silent peer)
    raises at ``settle``."""
    _, ps = cluster(1)
    size, optimizer = 300, AdaGrad(lr=0.1)
    initial = np.linspace(-1, 1, size, dtype=np.float32)
    param = ps.create_dense("dense", size, optimizer, initial=initial)
    started = [AllReduceDense(ps, param, optimizer, m, checkpoint_every=0) for m in ring(2, size)]
    waited = [AllReduceDense(ps, param, optimizer, m, checkpoint_every=0) for m in ring(2, size)]
    rng = np.random.default_rng(2)
    for t in range(3):
        grads = [rng.standard_normal(size).astype(np.float32) for _ in range(2)]
        assert all(r.overlaps(final=False) and not r.overlaps(final=True) for r in started)
        for w in range(2):  # one thread: worker 0's call must not wait for worker 1
            started[w].start_update(grads[w], t, False)
        update_all(waited, grads, t)
        values = [r.values() for r in started]  # settles
        assert values[0].tobytes() == values[1].tobytes() == waited[0].values().tobytes()
    lonely = AllReduceDense(ps, param, optimizer, ring(2, size, timeout=1.0)[0], 0)
    lonely.start_update(np.ones(size, np.float32), 0, False)
    with pytest.raises(DeadlineExceeded):
        lonely.settle()


def test_batch_statistics_and_dense_gradients_share_the_server_without_meeting() -> None:
    """Stream 1 (batch-norm statistics, several rounds per iteration, shorter vectors padded,
    each a one-round exchange of whole vectors) and stream 0 (the dense gradient, round =
    iteration) on one Collective server per worker: every worker gets the worker-order sum of
    each, the same bits, while the workers run skewed; a part for a stream a worker does not
    run is refused."""
    n, size, stats_size, per_step = 3, 50, 9, 4
    dense_boxes = [Mailbox(w, n, size) for w in range(n)]
    stats_boxes = [Mailbox(w, n, stats_size) for w in range(n)]
    servers, ports = [], []
    for w in range(n):
        server, port = serve_collective({DENSE_STREAM: dense_boxes[w],
                                         STATISTICS_STREAM: stats_boxes[w]},
                                        "127.0.0.1", 0, 4 * MB)  # fmt: skip
        servers.append(server)
        ports.append(port)
    peers = [f"127.0.0.1:{p}" for p in ports]
    dense = [AllReduce(w, peers, size, dense_boxes[w], 10.0, 4 * MB) for w in range(n)]
    sums = [BatchSums(AllReduce(w, peers, stats_size, stats_boxes[w], 10.0, 4 * MB,
                                stream=STATISTICS_STREAM, exchange=True), per_step)
            for w in range(n)]  # fmt: skip
    rng = np.random.default_rng(3)
    lengths = [9, 8, 8, 9]  # forward [count, sum, sum sq], backward [sum, sum]: padded to 9
    inputs = [[[rng.standard_normal(k).astype(np.float32) for k in lengths]
               for _ in range(n)] for _ in range(3)]  # fmt: skip
    grads = [[rng.standard_normal(size).astype(np.float32) for _ in range(n)] for _ in range(3)]
    got: list[list[Any]] = [[] for _ in range(n)]

    def worker(w: int) -> None:
        for t in range(3):
            batch_sum = sums[w].for_iteration(t)
            for k in range(per_step):
                time.sleep(0.01 * ((w + k + t) % 3))  # the workers drift apart
                got[w].append(batch_sum(inputs[t][w][k]))
            got[w].append(dense[w].sum(grads[t][w], t))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    expected = []
    for t in range(3):
        for k in range(per_step):
            total = inputs[t][0][k].copy()
            for w in range(1, n):
                total += inputs[t][w][k]
            expected.append(total)
        total = grads[t][0].copy()
        for w in range(1, n):
            total += grads[t][w]
        expected.append(total)
    for w in range(n):
        assert len(got[w]) == len(expected), w
        for out, want in zip(got[w], expected, strict=True):
            assert out.tobytes() == want.tobytes()
    lone = BatchSums(AllReduce(0, peers[:1], stats_size, Mailbox(0, 1, stats_size), 1.0, MB,
                               stream=STATISTICS_STREAM), per_step)  # fmt: skip
    batch_sum = lone.for_iteration(9)
    for _ in range(per_step):
        batch_sum(np.ones(2, np.float32))
    with pytest.raises(FailedPrecondition, match="a step makes 4"):
        batch_sum(np.ones(2, np.float32))  # one reduction more than a step makes
    with pytest.raises(grpc.RpcError) as err:
        deliver(ports[0], round=0, phase=0, sender=1, part=0, stream=7,
                values=np.zeros(3, "<f4").tobytes())  # fmt: skip
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for member in [*dense, *sums]:
        member.close()
    for server in servers:
        server.stop(grace=0)


def test_running_statistics_are_written_over_the_update(
    cluster: ClusterFactory, ring: Callable[..., list[AllReduce]]
) -> None:
    """Batch norm's running statistics take no gradient and are not trained: each replica
    writes the step's new values over its update, so weight decay never moves them and the
    replicas stay equal; the other entries are updated as without them."""
    _, ps = cluster(1)
    size, optimizer = 300, Adam(lr=0.01, l2=0.1)
    initial = np.linspace(-1, 1, size, dtype=np.float32)
    param = ps.create_dense("dense", size, optimizer, initial=initial)
    with_stats = [AllReduceDense(ps, param, optimizer, m, 0) for m in ring(2, size)]
    without = [AllReduceDense(ps, param, optimizer, m, 0) for m in ring(2, size)]
    positions = np.array([3, 4, 260, 299], np.int64)
    for t in range(3):
        grads = [np.ones(size, np.float32) for _ in range(2)]
        for g in grads:
            g[positions] = 0.0  # as the model's gradient of a running statistic
        running = RunningStats(positions, np.full(4, 0.5 + t, np.float32))
        for replicas in (with_stats, without):
            if replicas is with_stats:
                for r in replicas:
                    r.hold_running(running)
            update_all(replicas, grads, t)
        rows = [r.values() for r in with_stats]
        assert rows[0].tobytes() == rows[1].tobytes()
        assert rows[0][positions].tolist() == [0.5 + t] * 4
        others = np.setdiff1d(np.arange(size), positions)
        assert rows[0][others].tobytes() == without[0].values()[others].tobytes()
        assert not np.allclose(without[0].values()[positions], initial[positions])  # decayed
