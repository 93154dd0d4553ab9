"""``heraldps warmup``: compile every numba kernel into the cache before a process needs it.

A kernel compiles at its first call in each process kind, 10-13 s per kind with a
cold cache, and numba keeps the result in its cache (``heraldps.jit``). The
warm-up makes those first calls ahead of time, through the same code the roles
run, so the kernels are compiled for exactly the argument types they get:

- the data path of ``local``, ``simulate`` and ``feed`` (check, first pass,
  streamed batches) on the bundled Criteo sample, and on small Parquet files
  with text, dictionary and integer columns;
- every scheduler mode's planning (``simulate``'s cache check and plans);
- the model's dropout masks (the warm-up's own jobs train without dropout);
- a whole cluster in this process, once per mode: Staged shards (a Cached
  shard in one mode), the scheduler service with checkpoints, the feeder and
  two workers following the plan stream, then a resume from the checkpoint and
  the evaluation, each role's own code over gRPC on 127.0.0.1.

The container image runs it at build time (deploy/Dockerfile); CI runs it before
the tests. ``tests/unit/test_warmup.py`` checks that after it a ``heraldps local``
run compiles nothing.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from heraldps.bundled import bundled_data
from heraldps.client import PSClient
from heraldps.data.global_batches import MiniBatchSizes, StreamedBatches
from heraldps.dropout import dropout_mask
from heraldps.job import TrainingJob
from heraldps.modes import ALL_MODES
from launcher.cli.data import count_rows, first_pass
from launcher.feed import FeedConfig, run_feed
from launcher.local import evaluate
from ps_server.server import PSConfig, PSServer
from scheduler_service.checkpointer import CheckpointConfig
from scheduler_service.server import SchedulerConfig, SchedulerServer
from scheduler_service.simulate import SimulationConfig, simulate
from worker_client.worker import WorkerConfig, run_worker

WORKERS = 2
PER_WORKER = 16
ITERATIONS = 4
ROLE_TIMEOUT = 300.0  # seconds any one role may wait for another (a cold compile included)


@dataclass(frozen=True)
class Step:
    """One part of the warm-up and how long it took."""

    name: str
    seconds: float


def _job(data: str, **fields: Any) -> TrainingJob:
    job = TrainingJob(data=data, workers=WORKERS, batch_size_per_worker=PER_WORKER,
                      iterations=ITERATIONS, embedding_dim=4, hidden=(8,))  # fmt: skip
    return replace(job, **fields)


def _parquet_files(folder: Path, train: Path) -> list[TrainingJob]:
    """Jobs over small Parquet files: the sample's columns as text (dictionary-encoded by
    the writer, as Spark and pandas write them), and integer ids with a float column."""
    from heraldps.data import read_all

    sample = read_all(_job(str(train)).data_spec())
    rows = min(sample.rows, 2048)  # two global batches of simulate's default shape
    rng = np.random.default_rng(0)
    labels = pa.array(sample.labels[:rows].astype(np.int64))
    text = {f"C{i}": pa.array([f"{v:x}" for v in rng.integers(0, 50, rows)]) for i in range(3)}
    ints = {f"id{i}": pa.array(rng.integers(0, 1000, rows)) for i in range(3)}
    dense = {"price": pa.array(rng.random(rows) * 100)}
    jobs = []
    for name, columns, dictionary in (("text", text, True), ("ids", ints, False)):
        path = folder / f"{name}.parquet"
        table = pa.table({"label": labels, **columns, **dense})
        pq.write_table(table, path, use_dictionary=dictionary, row_group_size=64)
        jobs.append(_job(str(path), format="parquet", sparse_columns=tuple(columns),
                         label_column="label", dense_columns=("price",)))  # fmt: skip
    return jobs


def _data_and_plans(job: TrainingJob, cache_fraction: float = 0.1) -> TrainingJob:
    """What ``local``, ``simulate`` and ``feed`` do before any process starts: check and
    scan the data, then plan all of it in every mode (``simulate``'s defaults, 8 workers
    of 128 samples; on the bundled sample the caches of 10% of its keys fill up and
    evict). Returns the job with the first pass's numbers, as ``local``
    hands it to its processes."""
    spec = job.data_spec()
    config = SimulationConfig(job.data, job.format, cache_fraction=cache_fraction)
    # As local does without --eval-data: rows counted by parsing, then one pass that
    # profiles the rows before the cut, checks those after it and sizes every mini-batch.
    cut = count_rows(spec) * 3 // 4
    sizes = MiniBatchSizes(config.workers, config.batch_size_per_worker)
    first_pass(spec, what="warmup", profile_rows=cut, on_chunk=sizes)
    profile = first_pass(spec, what="warmup", on_chunk=sizes)
    batches = StreamedBatches(spec.with_stats(profile.dense_stats), profile.rows,
                              config.workers * config.batch_size_per_worker, None)  # fmt: skip
    simulate(batches, config, profile.total_distinct_keys)
    stats = tuple(s.to_dict() for s in profile.dense_stats)
    # Room for the most keys one mini-batch can have and no more, so plans evict from the
    # second iteration on.
    cache_rows = PER_WORKER * spec.num_fields
    return replace(job, dense_stats=stats or None, train_rows=profile.rows,
                   distinct_keys=profile.total_distinct_keys, cache_rows=cache_rows)  # fmt: skip


@contextmanager
def _shards(folder: Path, store: str) -> Iterator[list[PSServer]]:
    servers = []
    try:
        for index in range(2):
            data_dir = str(folder / f"ps-{index}") if store == "cached" else None
            server = PSServer(PSConfig(port=0, shard_index=index, num_shards=2, store=store,
                                       data_dir=data_dir, cache_gb=0.01,
                                       grace_seconds=0.5))  # fmt: skip
            server.start()
            servers.append(server)
        yield servers
    finally:
        for server in servers:
            server.stop(grace=0)


def _train(job: TrainingJob, mode: str, folder: Path, store: str) -> None:
    """One mode on a cluster in this process: shards, the scheduler (checkpointing every
    iteration), the feeder and the workers, each in its own thread; then a second
    scheduler resumes from the last checkpoint, and the model is evaluated."""
    folder.mkdir(parents=True, exist_ok=True)
    job_file = str(folder / "job.json")
    Path(job_file).write_text(job.to_json())
    checkpoints = str(folder / "checkpoints")
    with _shards(folder, store) as shards:
        ps = tuple(f"127.0.0.1:{s.port}" for s in shards)
        for resume in (None, checkpoints):
            scheduler = SchedulerServer(
                SchedulerConfig(
                    workers=job.workers, cache_rows=job.cache_rows, mode=mode, ps=ps, port=0,
                    grace_seconds=0.5, worker_timeout=ROLE_TIMEOUT,
                    expected_keys=job.distinct_keys or 0,
                    checkpoints=CheckpointConfig(every=1, directory=checkpoints,
                                                 resume_from=resume),
                )
            )  # fmt: skip
            scheduler.start()
            try:
                address = f"127.0.0.1:{scheduler.port}"
                feed = FeedConfig(job_file, address, ps, timeout_seconds=ROLE_TIMEOUT)
                workers = [
                    WorkerConfig(job_file, w, address, ps, timeout_seconds=ROLE_TIMEOUT)
                    for w in range(job.workers)
                ]
                _run_all([partial(run_feed, feed), *(partial(run_worker, c) for c in workers)])
            finally:
                scheduler.stop(grace=0)
        with PSClient(list(ps)) as client:
            evaluate(job, job.data_spec(), client)


def _run_all(roles: list[Callable[[], object]]) -> None:
    """Run each role in a thread; raise the first failure (a worker's exit code 1 too)."""
    errors: list[BaseException] = []

    def guard(role: Callable[[], object]) -> None:
        try:
            if role() not in (None, 0):
                errors.append(RuntimeError("a worker failed (its log line says why)"))
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(r,), daemon=True) for r in roles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def warm() -> Iterator[Step]:
    """Compile every kernel the roles use into numba's cache (see the module docstring);
    yields each step once done."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)  # the roles' INFO lines are not the warm-up's business
    try:
        with tempfile.TemporaryDirectory(prefix="heraldps-warmup-") as temporary:
            folder = Path(temporary)
            train, _ = bundled_data()
            started = time.perf_counter()
            job = _data_and_plans(_job(str(train)))
            yield Step("data and plans: the bundled sample", time.perf_counter() - started)
            started = time.perf_counter()
            dropout_mask(np, 0.5, 0, 0, np.arange(2, dtype=np.int64), 3)  # a worker's, on NumPy
            yield Step("model: dropout masks", time.perf_counter() - started)
            for extra in _parquet_files(folder, train):
                started = time.perf_counter()
                _data_and_plans(extra, cache_fraction=1.0)
                yield Step(f"data and plans: {Path(extra.data).name}",
                           time.perf_counter() - started)  # fmt: skip
            runs = [(mode, "staged") for mode in ALL_MODES] + [("herald", "cached")]
            for mode, store in runs:
                started = time.perf_counter()
                _train(job, mode, folder / f"{mode}-{store}", store)
                yield Step(f"cluster: {mode}, {store} shards", time.perf_counter() - started)
    finally:
        root.setLevel(level)
