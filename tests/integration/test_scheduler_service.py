"""A real scheduler server, real PS shards and worker threads following the plan stream."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from heraldps import wire
from heraldps.bundled import bundled_data
from heraldps.errors import InvalidArgument
from heraldps.job import TrainingJob
from heraldps.optim import SGD
from heraldps.plan import plan_from_proto
from heraldps.samples import encode_samples
from heraldps.v1 import ps_pb2, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from scheduler_service.batch import Batch
from scheduler_service.scheduler import Scheduler
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests.conftest import ClusterFactory
from worker_client.minibatch import global_batches

WORKERS, PER_WORKER, CAPACITY = 3, 4, 40
TRAIN, _ = bundled_data()


def make_batches(count: int, first: int = 0) -> list[Batch]:
    rng = np.random.default_rng(11)
    out = []
    for t in range(first, first + count):
        lens = rng.integers(1, 4, WORKERS * PER_WORKER)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        out.append(Batch.from_arrays(t, offsets, rng.integers(0, 30, int(offsets[-1])), WORKERS))
    return out


@contextlib.contextmanager
def scheduler_server(
    cluster: ClusterFactory, mode: str = "herald", prefetch_plans: int = 1
) -> Iterator[tuple[SchedulerServer, grpc.Channel]]:
    """A scheduler (backlog 2, or what ``prefetch_plans`` needs) committing on two real
    shards, and a channel to it."""
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    server = SchedulerServer(
        SchedulerConfig(
            workers=WORKERS,
            cache_rows=CAPACITY,
            mode=mode,
            ps=tuple(ps.addresses),
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            max_backlog=max(2, prefetch_plans + 1),
            prefetch_plans=prefetch_plans,
            grace_seconds=1,
        )
    )
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield server, channel
    finally:
        channel.close()
        server.stop(grace=0)


@pytest.fixture
def scheduler(cluster: ClusterFactory) -> Iterator[tuple[SchedulerServer, grpc.Channel]]:
    with scheduler_server(cluster) as started:
        yield started


def submit(stub: scheduler_pb2_grpc.SchedulerStub, batch: Batch, checkpoint: bool = False) -> None:
    request = scheduler_pb2.SubmitBatchRequest(
        iteration=batch.iteration, offsets=wire.encode_keys(batch.offsets),
        keys=wire.encode_keys(batch.keys), table="emb", checkpoint=checkpoint,
    )  # fmt: skip
    while True:
        try:
            stub.SubmitBatch(request)
            return
        except grpc.RpcError as err:  # back-pressure: the backlog is full
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            time.sleep(0.02)


@pytest.mark.parametrize("first", [0, 10])
def test_plans_flow_commit_on_the_ps_and_match_the_core(
    scheduler: tuple[SchedulerServer, grpc.Channel], first: int
) -> None:
    """Workers watch before any batch exists; training may start at any iteration."""
    server, channel = scheduler
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    batches = make_batches(6, first)
    received: dict[int, list[scheduler_pb2.CommPlan]] = {w: [] for w in range(WORKERS)}

    def worker(w: int) -> None:
        assert (
            stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=w)).cache_rows
            == CAPACITY
        )
        for plan in stub.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=w)):
            received[w].append(plan)
            counters = scheduler_pb2.TrafficCounters(
                pulled_rows=len(plan.pull) // 8, pushed_gradient_rows=len(plan.push_grads) // 8
            )
            stub.ReportDone(
                scheduler_pb2.ReportDoneRequest(
                    worker_id=w, iteration=plan.iteration, counters=counters
                )
            )

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
    for t in threads:
        t.start()
    for batch in batches:
        submit(stub, batch)
    stub.Finish(scheduler_pb2.FinishRequest())
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()

    core = Scheduler(WORKERS, CAPACITY, "herald")
    expected = [p for b in batches for p in core.submit(b)] + core.finish()
    for w in range(WORKERS):
        got = [plan_from_proto(p) for p in received[w]]
        want = [p for p in expected if p.worker == w]
        assert len(got) == len(batches)
        assert all(a.same_as(b) for a, b in zip(got, want, strict=True))
        assert received[w][-1].final_flush and not received[w][0].final_flush
    status = stub.GetStatus(scheduler_pb2.GetStatusRequest())
    last = first + 5
    assert status.committed_iteration == last and status.finished and status.backlog == 0
    assert server.ps is not None
    shard_info = server.ps._all_shards("GetShardInfo", ps_pb2.GetShardInfoRequest())
    assert [i.committed_iteration for i in shard_info] == [last, last]
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read().decode()
    assert (
        f'heraldps_scheduler_planned_rows_total{{kind="pull",mode="herald"}} {core.counts.pulls}.0'
        in text
    )
    assert f"heraldps_scheduler_committed_iteration {last}.0" in text
    # Naive's traffic on the same batches (the shadow), locality, progress gauges.
    naive = Scheduler(WORKERS, CAPACITY, "naive")
    for batch in batches:
        naive.submit(batch)
    naive.finish()
    sample = server.metrics.registry.get_sample_value
    for kind, rows in (("pull", naive.counts.pulls), ("grad_push", naive.counts.grad_pushes),
                       ("write_back", naive.counts.write_backs)):  # fmt: skip
        labels = {"mode": "herald", "kind": kind}
        assert sample("heraldps_scheduler_naive_rows_total", labels) == rows
    held = sample("heraldps_scheduler_held_samples_total", {"mode": "herald"})
    assert held == core.counts.held_samples > 0
    local = sample("heraldps_scheduler_local_samples_total", {"mode": "herald"})
    assert local == core.counts.local_samples
    assert sample("heraldps_scheduler_commits_total") == len(batches)
    assert sample("heraldps_scheduler_registered_workers") == WORKERS
    assert sample("heraldps_scheduler_finished") == 1
    assert sample("heraldps_scheduler_last_commit_timestamp_seconds") > time.time() - 60
    assert "heraldps_scheduler_plan_seconds_bucket" in text


@pytest.mark.parametrize(
    ("mode", "prefetch"), [("herald", 1), ("herald_pipelined", 1), ("herald_pipelined", 2)]
)
def test_pipelined_plans_flow_before_the_previous_commit(
    cluster: ClusterFactory, mode: str, prefetch: int
) -> None:
    """herald_pipelined: plans t+1 .. t+P (--prefetch-plans P) reach their worker while t is
    not committed (herald: only after), with their early pulls marked (and, with P = 2,
    how far ahead each may be pulled); ReportDone(wait_for_commit) returns at the commit."""
    pipelined = mode == "herald_pipelined"
    with scheduler_server(cluster, mode, prefetch) as (server, channel):
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        for w in range(WORKERS):
            stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=w))
        batches = make_batches(3 + prefetch)
        for batch in batches[: 2 + prefetch]:  # releases plans 0 .. P (the backlog is full)
            submit(stub, batch)
        arrived: queue.SimpleQueue[scheduler_pb2.CommPlan] = queue.SimpleQueue()

        def watch() -> None:
            with contextlib.suppress(grpc.RpcError):  # cancelled when the channel closes
                for plan in stub.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=0)):
                    arrived.put(plan)

        threading.Thread(target=watch, daemon=True).start()
        got = [arrived.get(timeout=10)]
        if pipelined:  # plans 1 .. P, before iteration 0 is committed
            got += [arrived.get(timeout=10) for _ in range(prefetch)]
        with pytest.raises(queue.Empty):
            arrived.get(timeout=0.5)  # nothing further flows before a commit
        assert [p.iteration for p in got] == list(range(1 + prefetch if pipelined else 1))
        assert stub.GetStatus(scheduler_pb2.GetStatusRequest()).committed_iteration == -1
        core = Scheduler(WORKERS, CAPACITY, mode, prefetch_plans=prefetch)
        expected = [p for b in batches[: 2 + prefetch] for p in core.submit(b) if p.worker == 0]
        for message, want in zip(got, expected, strict=False):
            assert plan_from_proto(message).same_as(want)
        assert any(len(wire.decode_keys(p.pull_early, "pull_early")) for p in got) == pipelined
        for message in got:  # a lead byte for each early key, with P = 2
            assert len(message.pull_early_from) == len(message.pull_early) // 8 * (prefetch > 1)

        # Worker 0's report waits for the commit, which the other two reports make; it says
        # how long it waited (the worker counts that as barrier time, not RPC time).
        answers: queue.SimpleQueue[scheduler_pb2.ReportDoneResponse] = queue.SimpleQueue()
        threading.Thread(
            target=lambda: answers.put(stub.ReportDone(scheduler_pb2.ReportDoneRequest(
                worker_id=0, iteration=0, wait_for_commit=True), timeout=30)),
            daemon=True,
        ).start()  # fmt: skip
        with pytest.raises(queue.Empty):
            answers.get(timeout=0.5)
        for w in (1, 2):
            answer = stub.ReportDone(scheduler_pb2.ReportDoneRequest(worker_id=w, iteration=0))
            assert answer.commit_wait_seconds == 0 and answer.committed == (w == 2)
        held = answers.get(timeout=10)
        assert not held.committed and held.commit_wait_seconds >= 0.5
        assert server.ps is not None and server.ps.committed_iteration() == 0
        submit(stub, batches[2 + prefetch])  # releases plan P + 1
        assert arrived.get(timeout=10).iteration == (prefetch + 1 if pipelined else 1)

        # At its deadline a waiting report fails; the report itself still counts.
        with pytest.raises(grpc.RpcError) as failed:
            stub.ReportDone(
                scheduler_pb2.ReportDoneRequest(worker_id=0, iteration=1, wait_for_commit=True),
                timeout=0.5,
            )
        assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for w in (1, 2):
            stub.ReportDone(scheduler_pb2.ReportDoneRequest(worker_id=w, iteration=1))
        assert stub.GetStatus(scheduler_pb2.GetStatusRequest()).committed_iteration == 1


def test_pipelined_mode_needs_threads_and_a_backlog() -> None:
    """Each pipelined worker holds a waiting report (its plan stream counts against
    --max-streams); plan t+1 can only be released while t trains with a backlog of 2."""
    with pytest.raises(ValueError, match="at least 12"):
        SchedulerConfig(workers=8, cache_rows=10, mode="herald_pipelined", threads=11)
    SchedulerConfig(workers=8, cache_rows=10, mode="herald_pipelined", threads=12)
    SchedulerConfig(workers=40, cache_rows=10, mode="herald", threads=8)  # streams: own budget
    with pytest.raises(ValueError, match="at least 4"):
        SchedulerConfig(workers=2, cache_rows=10, mode="herald", threads=3)
    with pytest.raises(ValueError, match="--max-backlog 2 or more"):
        SchedulerConfig(workers=2, cache_rows=10, mode="herald_pipelined", max_backlog=1)
    with pytest.raises(ValueError, match="--max-backlog 5 or more"):
        SchedulerConfig(workers=2, cache_rows=10, mode="herald_pipelined", prefetch_plans=4)
    SchedulerConfig(workers=2, cache_rows=10, mode="herald_pipelined", prefetch_plans=4,
                    max_backlog=5)  # fmt: skip
    with pytest.raises(InvalidArgument, match="--prefetch-plans must be 1"):
        SchedulerConfig(workers=2, cache_rows=10, mode="herald_pipelined", prefetch_plans=9)


def test_bad_requests(scheduler: tuple[SchedulerServer, grpc.Channel]) -> None:
    _, channel = scheduler
    stub = scheduler_pb2_grpc.SchedulerStub(channel)

    def code_of(call: object, request: object) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as err:
            result = call(request)  # type: ignore[operator]
            if hasattr(result, "__next__"):
                next(result)
        return err.value.code(), err.value.details() or ""

    assert (
        code_of(stub.RegisterWorker, scheduler_pb2.RegisterWorkerRequest(worker_id=7))[0]
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    code, text = code_of(stub.WatchPlans, scheduler_pb2.WatchPlansRequest(worker_id=1))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "RegisterWorker" in text
    uneven = scheduler_pb2.SubmitBatchRequest(
        iteration=0, offsets=wire.encode_keys([0, 1, 2]), keys=wire.encode_keys([1, 2])
    )
    code, text = code_of(stub.SubmitBatch, uneven)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "split evenly" in text
    offsets = np.arange(WORKERS * PER_WORKER + 1) * 20
    too_big = scheduler_pb2.SubmitBatchRequest(
        iteration=0,
        offsets=wire.encode_keys(offsets),
        keys=wire.encode_keys(np.arange(int(offsets[-1]))),
    )
    code, text = code_of(stub.SubmitBatch, too_big)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "more than its cache" in text
    wrong_table = scheduler_pb2.SubmitBatchRequest(iteration=0, table="other")
    assert code_of(stub.SubmitBatch, wrong_table)[0] == grpc.StatusCode.INVALID_ARGUMENT
    submit(stub, make_batches(1)[0])
    later = make_batches(3)[2]
    code, text = code_of(
        stub.SubmitBatch,
        scheduler_pb2.SubmitBatchRequest(
            iteration=5, offsets=wire.encode_keys(later.offsets), keys=wire.encode_keys(later.keys)
        ),
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "expects iteration 1" in text
    code, text = code_of(stub.ReportDone, scheduler_pb2.ReportDoneRequest(worker_id=0, iteration=3))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        code_of(stub.ReportDone, scheduler_pb2.ReportDoneRequest(worker_id=-1))[0]
        == grpc.StatusCode.INVALID_ARGUMENT
    )


def test_no_shadow_naive_plans_once_and_exports_no_naive_series(cluster: ClusterFactory) -> None:
    from launcher.cli import build_parser

    args = build_parser().parse_args(["scheduler", "--workers", "3", "--cache-rows", "40",
                                      "--no-shadow-naive"])  # fmt: skip
    assert args.no_shadow_naive
    _, ps = cluster(1)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    server = SchedulerServer(
        SchedulerConfig(workers=WORKERS, cache_rows=CAPACITY, mode="herald",
                        ps=tuple(ps.addresses), host="127.0.0.1", port=0, metrics_port=0,
                        grace_seconds=1, shadow_naive=False)
    )  # fmt: skip
    server.start()
    try:
        assert server.shadow is None
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            submit(scheduler_pb2_grpc.SchedulerStub(channel), make_batches(1)[0])
        sample = server.metrics.registry.get_sample_value
        labels = {"mode": "herald", "kind": "pull"}
        assert sample("heraldps_scheduler_planned_rows_total", labels) is not None
        assert sample("heraldps_scheduler_naive_rows_total", labels) is None
    finally:
        server.stop(grace=0)


def test_whole_samples_travel_to_each_worker_inside_its_plan(
    scheduler: tuple[SchedulerServer, grpc.Channel],
) -> None:
    """The feeder submits samples once; every worker's plan carries exactly its own, and the
    sample bytes are reported back next to the rows."""
    _, channel = scheduler
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    # One Criteo sample (26 keys) per worker fits the fixture's 40-row caches.
    job = TrainingJob(data=str(TRAIN), workers=WORKERS, batch_size_per_worker=1)
    batches = global_batches(job.read(), job.global_batch, 2)
    for w in range(WORKERS):
        stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=w))
    streams = [
        stub.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=w)) for w in range(WORKERS)
    ]
    for t, batch in enumerate(batches):
        stub.SubmitBatch(scheduler_pb2.SubmitBatchRequest(iteration=t, batch=encode_samples(batch)))
    stub.Finish(scheduler_pb2.FinishRequest())
    for t, batch in enumerate(batches):
        seen = []
        for w, stream in enumerate(streams):
            msg = next(stream)
            plan = plan_from_proto(msg)
            assert plan.mini_batch is not None and plan.iteration == t
            want = batch.take(plan.samples)
            got = plan.mini_batch
            for name in ("offsets", "keys", "fields", "labels", "dense"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), name
            assert got.sparse_columns == batch.sparse_columns
            seen += plan.samples.tolist()
            counters = scheduler_pb2.TrafficCounters(sample_bytes=msg.mini_batch.ByteSize())
            stub.ReportDone(
                scheduler_pb2.ReportDoneRequest(worker_id=w, iteration=t, counters=counters)
            )
        assert sorted(seen) == list(range(batch.rows))  # every sample to exactly one worker
    status = stub.GetStatus(scheduler_pb2.GetStatusRequest())
    assert status.reported.sample_bytes > 0


def test_malformed_samples_are_refused(scheduler: tuple[SchedulerServer, grpc.Channel]) -> None:
    _, channel = scheduler
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    # One Criteo sample (26 keys) per worker fits the fixture's 40-row caches.
    job = TrainingJob(data=str(TRAIN), workers=WORKERS, batch_size_per_worker=1)
    (batch,) = global_batches(job.read(), job.global_batch, 1)
    good = encode_samples(batch)

    def refused(block: types_pb2.SampleBlock, **extra: bytes) -> str:
        request = scheduler_pb2.SubmitBatchRequest(iteration=0, batch=block, **extra)
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitBatch(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return err.value.details() or ""

    assert "not both" in refused(good, keys=good.keys, offsets=good.offsets)
    bad_field = types_pb2.SampleBlock()
    bad_field.CopyFrom(good)
    bad_field.fields = np.full(batch.keys.shape[0], 99, "<i4").tobytes()
    assert "batch.fields: every field must be in 0..25" in refused(bad_field)
    short = types_pb2.SampleBlock()
    short.CopyFrom(good)
    short.labels = good.labels[:-4]
    assert "batch.labels" in refused(short)
    nan = types_pb2.SampleBlock()
    nan.CopyFrom(good)
    nan.dense = np.full(batch.dense.shape, np.nan, "<f4").tobytes()
    assert "NaN" in refused(nan)
    # Nothing was accepted: the first good batch is still iteration 0.
    stub.SubmitBatch(scheduler_pb2.SubmitBatchRequest(iteration=0, batch=good))
