"""The deployed scheduler's checkpoints and ``--resume-from``, on a real scheduler server
and real shards: it snapshots after every N-th commit and, started again, loads the newest
complete checkpoint and expects the batch after it."""

from __future__ import annotations

import threading
from collections.abc import Container
from pathlib import Path

import grpc
import numpy as np
import pytest

from heraldps import checkpoints
from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition
from heraldps.optim import SGD
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.checkpointer import CheckpointConfig, Checkpointer
from scheduler_service.metrics import CheckpointMetrics
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests.conftest import ClusterFactory
from tests.integration.test_scheduler_service import CAPACITY, WORKERS, make_batches, submit


def _server(addresses: list[str], checkpoint: CheckpointConfig) -> SchedulerServer:
    config = SchedulerConfig(
        workers=WORKERS, cache_rows=CAPACITY, mode="herald", ps=tuple(addresses),
        host="127.0.0.1", port=0, max_backlog=2, grace_seconds=1, checkpoints=checkpoint,
    )  # fmt: skip
    return SchedulerServer(config)


def _train(
    server: SchedulerServer, batches: list, finish: bool, checkpoint_at: Container[int] = ()
) -> dict[int, list[bool]]:
    """Workers that report every plan (no PS traffic, a loss of 0.25 a worker); the
    checkpoint flag of each plan. The feeder asks for a checkpoint at ``checkpoint_at``."""
    flags: dict[int, list[bool]] = {w: [] for w in range(WORKERS)}
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)

        def worker(w: int) -> None:
            stub.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=w))
            for plan in stub.WatchPlans(scheduler_pb2.WatchPlansRequest(worker_id=w)):
                flags[w].append(plan.checkpoint)
                done = scheduler_pb2.ReportDoneRequest(worker_id=w, iteration=plan.iteration,
                                                       loss_sum=0.25, samples=1)  # fmt: skip
                stub.ReportDone(done)
                if not finish and plan.iteration == batches[-2].iteration:
                    return

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
        for t in threads:
            t.start()
        for batch in batches:
            submit(stub, batch, checkpoint=batch.iteration in checkpoint_at)
        if finish:
            stub.Finish(scheduler_pb2.FinishRequest())
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()
    return flags


def _checkpointed_run(
    cluster: ClusterFactory, tmp_path: Path
) -> tuple[PSClient, Path, SchedulerServer]:
    """Two shards and a scheduler that trained 6 batches, checkpointing every 2 (3 kept),
    then stopped: the client, the checkpoint root and the stopped scheduler."""
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    ps.pull("emb", np.arange(50, dtype=np.int64))
    root = tmp_path / "ckpt"
    first = _server(ps.addresses, CheckpointConfig(every=2, directory=str(root), keep=3))
    first.start()
    try:
        _train(first, make_batches(6), finish=True)
    finally:
        first.stop(grace=0)
    return ps, root, first


def test_a_feeder_asks_for_a_checkpoint_and_a_resume_goes_on_with_its_loss_sum(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    """SubmitBatchRequest.checkpoint (heraldps train's epoch ends): a flush and a snapshot of
    that iteration, without --checkpoint-every; the manifest carries the loss summed so far,
    and a resumed scheduler's committed_loss_sum goes on from it."""
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    root = tmp_path / "ckpt"
    first = _server(ps.addresses, CheckpointConfig(directory=str(root), keep=3))
    first.start()
    try:
        flags = _train(first, make_batches(5), finish=True, checkpoint_at={1, 3})
    finally:
        first.stop(grace=0)
    assert flags[0] == [False, True, False, True, False]
    found = checkpoints.complete(root)
    assert [m.iteration for _, m in found] == [1, 3]
    assert [(m.loss_sum, m.loss_samples) for _, m in found] == [
        (0.25 * WORKERS * 2, WORKERS * 2),
        (0.25 * WORKERS * 4, WORKERS * 4),
    ]
    second = _server(ps.addresses, CheckpointConfig(directory=str(root), resume_from=str(root)))
    second.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{second.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            status = stub.GetStatus(scheduler_pb2.GetStatusRequest())
        assert status.next_batch_iteration == 4
        assert (status.committed_loss_sum, status.committed_samples) == (0.25 * WORKERS * 4,
                                                                         WORKERS * 4)  # fmt: skip
    finally:
        second.stop(grace=0)
    # Without --checkpoint-dir the request is refused, not silently dropped.
    third = _server(ps.addresses, CheckpointConfig())
    third.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{third.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                submit(stub, make_batches(1)[0], checkpoint=True)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--checkpoint-dir" in str(err.value.details())
    finally:
        third.stop(grace=0)


def test_checkpoints_are_written_and_a_restarted_scheduler_resumes_after_the_newest(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    keys = np.arange(50, dtype=np.int64)
    ps.pull("emb", keys)  # rows to snapshot
    root = tmp_path / "ckpt"
    config = CheckpointConfig(every=2, directory=str(root), keep=2, fingerprint="job-a")
    first = _server(ps.addresses, config)
    first.start()
    try:  # iterations 0..7 committed, batch 8 submitted: then it dies
        flags = _train(first, make_batches(9), finish=False)
    finally:
        first.stop(grace=0)
    assert flags[0] == [False, True] * 4
    found = checkpoints.complete(root)
    assert [m.iteration for _, m in found] == [5, 7]  # the last two kept
    manifest = found[-1][1]
    assert manifest.fingerprint == "job-a" and manifest.num_shards == 2
    assert manifest.samples_seen == 8 * make_batches(1)[0].samples
    assert {t["name"]: t["rows"] for t in manifest.tables} == {"emb": 50}

    ps.push_gradients("emb", keys, np.ones((50, 4), np.float32), iteration=8)
    ps.commit(8)  # the shards moved on past the checkpoint
    again = CheckpointConfig(every=2, directory=str(root), resume_from=str(root),
                             fingerprint="job-a")  # fmt: skip
    second = _server(ps.addresses, again)
    second.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{second.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            status = stub.GetStatus(scheduler_pb2.GetStatusRequest())
            assert (status.committed_iteration, status.next_batch_iteration) == (7, 8)
            with pytest.raises(grpc.RpcError) as err:  # the data position is checked
                submit(stub, make_batches(1)[0])
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ps.shard_committed_iterations() == [7, 7]  # the checkpoint was loaded
        values, _ = ps.pull("emb", keys)
        initial, _ = ps.pull("emb", keys + 1000)  # SGD on zeros: untouched rows are 0
        assert np.array_equal(values, np.zeros_like(values)) and not initial.any()
        _train(second, make_batches(4, first=8), finish=True)
        assert checkpoints.complete(root)[-1][1].iteration == 11
    finally:
        second.stop(grace=0)


def test_a_checkpoint_of_another_job_is_refused(cluster: ClusterFactory, tmp_path: Path) -> None:
    _, ps = cluster(1)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    target = checkpoints.begin(tmp_path, 3)
    ps.save(str(target))
    checkpoints.publish(target, checkpoints.Manifest(3, 1, "herald", WORKERS, fingerprint="a"))
    server = _server(ps.addresses, CheckpointConfig(resume_from=str(tmp_path), fingerprint="b"))
    with pytest.raises(FailedPrecondition, match="belongs to job a"):
        server.start()
    server.stop(grace=0)


def test_a_failed_checkpoint_is_logged_and_training_goes_on(
    cluster: ClusterFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint folder that cannot be written (here: a file is in the way) costs the
    checkpoint, not the run: every iteration still commits, and no manifest claims it."""
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("in the way")
    server = _server(ps.addresses, CheckpointConfig(every=2, directory=str(blocked)))
    server.start()
    try:
        _train(server, make_batches(4), finish=True)
    finally:
        server.stop(grace=0)
    assert ps.shard_committed_iterations() == [3, 3]
    assert blocked.read_text() == "in the way"
    failed = [r.getMessage() for r in caplog.records if "checkpoint of iteration" in r.getMessage()]
    assert len(failed) == 2 and all("failed" in m for m in failed), failed
    metric = server.metrics.registry.get_sample_value
    assert metric("heraldps_scheduler_checkpoint_failures_total") == 2
    assert metric("heraldps_scheduler_checkpoint_consecutive_failures") == 2
    assert metric("heraldps_scheduler_checkpoints_written_total") == 0
    assert metric("heraldps_scheduler_checkpoint_age_seconds") == -1


def test_checkpoint_metrics_count_what_was_written_and_what_a_resume_skipped(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    """Written checkpoints, their age and bytes; a resume whose newest checkpoint's manifest
    is unreadable reports it (log and metric) and falls back to the one before."""
    ps, root, first = _checkpointed_run(cluster, tmp_path)
    metric = first.metrics.registry.get_sample_value
    assert metric("heraldps_scheduler_checkpoints_written_total") == 3
    assert metric("heraldps_scheduler_checkpoint_consecutive_failures") == 0
    assert 0 <= (metric("heraldps_scheduler_checkpoint_age_seconds") or -1) < 60
    newest = checkpoints.complete(root)[-1][0]
    assert metric("heraldps_scheduler_checkpoint_bytes") == checkpoints.size_bytes(newest)
    (newest / checkpoints.MANIFEST).write_text("{")
    second = _server(ps.addresses, CheckpointConfig(resume_from=str(root)))
    second.start()
    try:
        assert ps.shard_committed_iterations() == [3, 3]
        metric = second.metrics.registry.get_sample_value
        skipped = metric("heraldps_scheduler_checkpoints_skipped_total", {"reason": "unreadable"})
        assert skipped == 1
        assert metric("heraldps_scheduler_checkpoint_fallbacks_total") == 1
    finally:
        second.stop(grace=0)


def test_resuming_after_the_last_iteration_just_finishes(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    """A run that died after its last iteration's checkpoint: the resumed scheduler expects
    no batch, Finish ends every worker's plan stream at once, and the model stays loaded."""
    _, ps = cluster(2)
    ps.create_table("emb", dim=4, optimizer=SGD(lr=0.1))
    ps.commit(7)
    target = checkpoints.begin(tmp_path, 7)
    ps.save(str(target))
    tables = [{"name": "emb", "dim": 4, "rows": 0}]
    checkpoints.publish(target, checkpoints.Manifest(7, 2, "herald", WORKERS, tables=tables))
    server = _server(ps.addresses, CheckpointConfig(resume_from=str(tmp_path)))
    server.start()
    try:
        assert _train(server, [], finish=True) == {w: [] for w in range(WORKERS)}
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            status = stub.GetStatus(scheduler_pb2.GetStatusRequest())
        assert (status.committed_iteration, status.finished) == (7, True)
    finally:
        server.stop(grace=0)


def test_a_resume_refused_by_another_runs_claim_does_not_fall_back(
    cluster: ClusterFactory, tmp_path: Path
) -> None:
    """A Load the fence refuses (another run's scheduler holds the shards) says nothing about
    the checkpoint: the resume ends with that refusal, no checkpoint is counted as skipped,
    and the shards keep what they hold."""
    ps, root, _ = _checkpointed_run(cluster, tmp_path)
    assert len(checkpoints.complete(root)) == 3
    holder = PSClient(ps.addresses)
    try:
        epoch = holder.max_claim_epoch() + 1
        committed = ps.shard_committed_iterations()
        holder.claim("the-live-run", epoch, lease_seconds=60)
        metrics = CheckpointMetrics()
        unfenced = Checkpointer(CheckpointConfig(resume_from=str(root)), ps, "herald", WORKERS,
                                metrics)  # fmt: skip
        with pytest.raises(FailedPrecondition) as refused:
            unfenced.resume()
        assert refused.value.reason == "SHARD_CLAIMED"
        assert "the-live-run" in refused.value.message
        for reason in ("unreadable", "disagrees", "damaged"):
            skipped = metrics.registry.get_sample_value(
                "heraldps_scheduler_checkpoints_skipped_total", {"reason": reason}
            )
            assert not skipped
        assert ps.shard_committed_iterations() == committed
    finally:
        holder.release_claim("the-live-run", epoch)
        holder.close()
