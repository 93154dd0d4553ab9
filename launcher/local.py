"""``heraldps local``: a whole cluster on 127.0.0.1 (or, with ``--link-mbit``, on an
emulated network of one link per process: :mod:`launcher.netns`) training one mode
after another.

For each mode: start S PS shards, create the tables, start the scheduler
(the Herald mode, or ``het`` for HET workers) and N worker processes, feed
the global batches, wait for the last commit, then read the final model
from the PS, evaluate it on held-out data and shut everything down. Traffic
is counted twice: by the workers from their own RPCs, and by the PS shards'
Prometheus counters.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from heraldps import checkpoints
from heraldps.client import PSClient
from heraldps.data import DataSpec, SparseDataset, stream
from heraldps.data.global_batches import GlobalBatches, InMemoryBatches
from heraldps.data.key_union import distinct_keys as distinct_keys_of
from heraldps.errors import HeraldError
from heraldps.job import DENSE_TABLE, EMBEDDING_TABLE, TrainingJob
from heraldps.modes import mode_named
from heraldps.serving import channel_options
from heraldps.traffic import REPORTED
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from launcher.cluster import (
    DEFAULT_WORKER_TIMEOUT,
    ClusterError,
    ManagedProcess,
    Placement,
    ProcessDied,
    link_rates,
    ps_process,
    scheduler_process,
    start_servers,
    stop_cluster,
    worker_process,
)
from launcher.export import export_from_ps
from launcher.feed import MAX_MESSAGE_BYTES, submit_batches
from launcher.netns import ClusterNetwork
from worker_client.evaluation import auc, logloss
from worker_client.minibatch import select
from worker_client.predictor import EVAL_CHUNK_ROWS
from worker_client.timing import PHASES, network_share


class Progress(Protocol):
    """Told what happens while modes train (a terminal bar, log lines)."""

    def update(self, mode: str, done: int, total: int, so_far: dict[str, float]) -> None: ...

    def done(self, mode: str, result: ModeResult) -> None: ...


@dataclass
class ModeResult:
    """Everything one mode's run produced."""

    mode: str
    iterations: int
    seconds: float
    samples_per_second: float
    traffic: dict[str, int]
    ps_counted: dict[str, int]
    per_iteration: list[dict[str, Any]]
    auc: float
    logloss: float
    row_bytes: dict[str, int]
    global_batch: int = 0
    # Bytes per process link (in/out) on an emulated network (--link-mbit); empty on loopback.
    link_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    model: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    restarts: list[Restart] = field(default_factory=list)  # failures resumed from checkpoints

    def report(self) -> dict[str, Any]:
        """The mode's figures as ``--json`` writes them (rows, bytes, quality, speed)."""
        t, b = self.traffic, self.row_bytes
        phases, period = median_phases(self.per_iteration), median_period(self.per_iteration)
        flush_bytes = b["final_flush"]
        pushes = t["grad_pushes"] + t["write_backs"]
        bytes_pulled = t["pulls"] * b["pull"] + t.get("state_pulls", 0) * b["pull_state"]
        bytes_pushed = t["grad_pushes"] * b["grad_push"] + t["write_backs"] * b["write_back"]
        return {
            "pulls": t["pulls"],
            "pushes": pushes,
            "final_flush": t["final_flush"],
            "moved": t["pulls"] + pushes,
            "moved_with_flush": t["pulls"] + pushes + t["final_flush"],
            "grad_pushes": t["grad_pushes"],
            "write_backs": t["write_backs"],
            "version_checks": t["version_checks"],
            "early_pulls": t["early_pulls"],
            "state_pulls": t.get("state_pulls", 0),
            "bytes_pulled": bytes_pulled,
            "bytes_pushed": bytes_pushed,
            "bytes_final_flush": t["final_flush"] * flush_bytes,
            "bytes_moved_with_flush": bytes_pulled + bytes_pushed + t["final_flush"] * flush_bytes,
            "sample_bytes": t["sample_bytes"],
            "dense_bytes": t["dense_bytes"],
            "auc": self.auc,
            "logloss": self.logloss,
            "iterations": self.iterations,
            "seconds": self.seconds,
            "samples_per_second": self.samples_per_second,
            "iteration_seconds_median": period,
            "samples_per_second_median": self.global_batch / period if period > 0 else 0.0,
            "phases_median": phases,
            "network_share": network_share(phases),
            "link_bytes": self.link_bytes,
            "ps_counted": self.ps_counted,
            "restarts": [asdict(r) for r in self.restarts],
            "per_iteration": self.per_iteration,
        }


def _ps_counts(shards: list[ManagedProcess]) -> dict[str, int]:
    """Rows of the embedding table the shards counted, from their /metrics."""
    names = {
        "heraldps_ps_pull_keys_total": "pulls",
        "heraldps_ps_push_keys_total": "grad_pushes",
        "heraldps_ps_write_back_keys_total": "write_backs",
        "heraldps_ps_version_check_keys_total": "version_checks",
    }
    totals = dict.fromkeys(names.values(), 0)
    for shard in shards:
        for line in shard.metrics().splitlines():
            name, _, rest = line.partition("{")
            if name in names and f'table="{EMBEDDING_TABLE}"' in rest:
                totals[names[name]] += int(float(line.rsplit(" ", 1)[1]))
    return totals


def _feed(
    address: str,
    batches: GlobalBatches,
    stop: threading.Event,
    compress: bool = False,
    start: int = 0,
    lr_scales: Sequence[float] = (),
) -> None:
    """Submit the global batches from ``start`` on (retrying while the scheduler's backlog
    is full), then Finish; ``compress``: gzip the batches (the scheduler's link is slow);
    ``lr_scales``: iteration t's learning-rate multiplier (1.0 past the end)."""
    compression = grpc.Compression.Gzip if compress else None
    with grpc.insecure_channel(
        address, options=channel_options(MAX_MESSAGE_BYTES), compression=compression
    ) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        submit_batches(stub, batches.iter_from(start), start=start, stop=stop,
                       lr_scales=lr_scales)  # fmt: skip


def evaluate(
    job: TrainingJob, eval_data: SparseDataset | DataSpec, ps: PSClient
) -> tuple[float, float]:
    """AUC and logloss of the PS's current model on ``eval_data``, read in chunks (a
    ``DataSpec`` is streamed: only the predictions and labels are kept, 8 bytes a row)."""
    model = job.model()
    dense = ps.pull_dense(job.dense_parameter(model.dense_size))
    chunks = (
        stream(eval_data, EVAL_CHUNK_ROWS)
        if isinstance(eval_data, DataSpec)
        else (eval_data.row_slice(i, min(i + EVAL_CHUNK_ROWS, eval_data.rows))
              for i in range(0, eval_data.rows, EVAL_CHUNK_ROWS))
    )  # fmt: skip
    probabilities, labels = [], []
    for chunk in chunks:
        mb = select(chunk)
        emb, _ = ps.pull(EMBEDDING_TABLE, mb.keys)
        probabilities.append(np.asarray(model.predict(dense, emb, mb.field_rows, mb.dense)))
        labels.append(np.asarray(mb.labels))
    if not labels:
        return float("nan"), float("nan")
    p, y = np.concatenate(probabilities), np.concatenate(labels)
    return auc(y, p), logloss(y, p)


def distinct_keys(train: GlobalBatches) -> npt.NDArray[np.int64]:
    """The sorted distinct keys of the training data (streamed: chunk by chunk)."""
    if isinstance(train, InMemoryBatches):
        return np.unique(train.dataset.keys)
    return distinct_keys_of(chunk.keys for chunk in stream(train.spec, EVAL_CHUNK_ROWS))


def read_model(
    job: TrainingJob, ps: PSClient, keys: npt.NDArray[np.int64], dense_size: int
) -> dict[str, np.ndarray]:
    """Values, state and versions of ``keys`` and the dense rows with their state."""
    values, versions, state = ps.pull_with_state(EMBEDDING_TABLE, keys)
    dense_param = job.dense_parameter(dense_size)
    dense_values, _, dense_state = ps.pull_with_state(DENSE_TABLE, dense_param.keys)
    return {
        "keys": keys,
        "values": values,
        "state": state,
        "versions": versions,
        "dense_values": dense_values,
        "dense_state": dense_state,
    }


@dataclass(frozen=True)
class Recovery:
    """Checkpoints and restarts of one mode's run (``--checkpoint-every``, ``--max-restarts``).

    On any process's failure the whole cluster stops and starts again: fresh shards load
    the newest complete checkpoint, the scheduler starts at the iteration after it, the
    workers start with cold caches, and the feeder feeds from that iteration on."""

    checkpoint_every: int = 0
    checkpoint_dir: Path | None = None  # default: WORKDIR/checkpoints
    keep: int = 2
    max_restarts: int = 0
    # A worker silent this long (the scheduler's --worker-timeout), or a scheduler not
    # answering the launcher this long, fails the attempt (0: never).
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT


@dataclass
class Restart:
    """One failure and the resume after it."""

    attempt: int  # the attempt that failed (0: the first start)
    failure: str  # the first line of its error
    resumed_at: int  # the first iteration trained again (0: no checkpoint yet)
    seconds_to_resume: float = float("nan")  # failure seen -> first new commit
    process: str = ""  # the process that died ("" when none did: a timeout, an abort)
    exit_code: int | None = None  # its exit code (negative: the signal that killed it)


def run_mode(
    job: TrainingJob,
    mode: str,
    shards: int,
    train: SparseDataset | GlobalBatches,
    eval_data: SparseDataset | DataSpec | None,
    workdir: Path,
    progress: Progress | None = None,
    keep_model: bool = False,
    store: str = "staged",
    cache_gb: float = 1.0,
    network: ClusterNetwork | None = None,
    recovery: Recovery | None = None,
    export: Path | None = None,
    lr_scales: Sequence[float] = (),
) -> ModeResult:
    """Train ``job`` in ``mode`` on a fresh local cluster; raise ClusterError on any failure
    (with ``recovery.max_restarts``: after that many whole-cluster restarts).
    ``lr_scales[t]``: iteration t's learning-rate multiplier (1.0 past the end).

    ``store="cached"`` runs Cached-PS shards (LMDB under ``workdir``) with ``cache_gb`` of
    host cache per table. With ``network`` every process runs in its namespace there.
    ``export``: write the final model there (``heraldps.model_export``) after evaluating."""
    recovery = recovery or Recovery()
    workdir.mkdir(parents=True, exist_ok=True)
    batches = (
        InMemoryBatches(train, job.global_batch, job.iterations, job.epochs)
        if isinstance(train, SparseDataset)
        else train
    )
    job_path = workdir / "job.json"
    job_path.write_text(job.to_json())
    # Absolute: the scheduler hands it to the shards, which resolve it on their own.
    checkpoint_dir = (recovery.checkpoint_dir or workdir / "checkpoints").absolute()
    if recovery.checkpoint_every or recovery.max_restarts:
        clear_checkpoints(checkpoint_dir)

    def attempt(number: int) -> _Attempt:
        started = _Attempt(job, mode, shards, batches, workdir, job_path, store, cache_gb,
                           network, recovery, checkpoint_dir, number)  # fmt: skip
        started.lr_scales = lr_scales
        started.wanted = (eval_data, progress, keep_model, export)
        return started

    result, restarts = restarting(recovery.max_restarts, workdir, attempt)
    result.restarts = restarts
    return result


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Resumable(Protocol[T_co]):
    """One start of a cluster that resumes from the newest checkpoint (``run_mode``'s
    attempts, ``heraldps train``'s): ``run`` trains until the end or raises ClusterError."""

    @property
    def resumed_at(self) -> int: ...  # the first batch it fed (-1: failed before that)

    @property
    def first_commit(self) -> float | None: ...  # when an iteration past it was committed

    def run(self) -> T_co: ...


def restarting(
    max_restarts: int, workdir: Path, attempt: Callable[[int], Resumable[T]]
) -> tuple[T, list[Restart]]:
    """Run ``attempt(0)``; on a ClusterError keep its logs (``NAME.log.N``) and run
    ``attempt(1)``, ... (each restarts the cluster from the newest checkpoint), at most
    ``max_restarts`` times. The result and every failure with its resume."""
    restarts: list[Restart] = []
    failed_at = 0.0
    for number in range(max_restarts + 1):
        current = attempt(number)
        error: ClusterError | None = None
        try:
            result = current.run()
        except ClusterError as exc:
            error = exc
        if restarts:  # this attempt resumed after the previous one failed
            restarts[-1].resumed_at = current.resumed_at
            if current.first_commit is not None:
                restarts[-1].seconds_to_resume = current.first_commit - failed_at
        if error is None:
            return result, restarts
        if number >= max_restarts:
            if restarts:
                raise ClusterError(f"{error}\n(after {len(restarts)} restarts)") from None
            raise error
        failed_at = time.perf_counter()
        what = str(error).splitlines()[0].split("; its log")[0]  # the log stays: NAME.log.N
        died = error if isinstance(error, ProcessDied) else None
        restarts.append(Restart(number, what, resumed_at=-1,
                                process=died.process if died else "",
                                exit_code=died.exit_code if died else None))  # fmt: skip
        _keep_logs(workdir, number)
    raise AssertionError("unreachable")  # pragma: no cover


def clear_checkpoints(directory: Path) -> None:
    """Remove every checkpoint under ``directory``: a new run's restarts must never load an
    older run's."""
    for old in checkpoints.published(directory):
        shutil.rmtree(old.path)
    checkpoints.remove_partial(directory)


def checkpoint_flags(
    recovery: Recovery, directory: Path, fingerprint: str, resume: bool
) -> tuple[str, ...]:
    """The scheduler's flags that write checkpoints of ``recovery`` into ``directory``
    (absolute) for the job ``fingerprint``; with ``resume``, it starts from the newest."""
    flags: tuple[str, ...] = (
        "--checkpoint-every", str(recovery.checkpoint_every), "--checkpoint-dir",
        str(directory), "--keep-checkpoints", str(recovery.keep),
        "--job-fingerprint", fingerprint,
    )  # fmt: skip
    return flags + (("--resume-from", str(directory)) if resume else ())


def _keep_logs(workdir: Path, attempt: int) -> None:
    """Keep a failed attempt's logs as ``NAME.log.ATTEMPT`` (the next attempt rewrites them)."""
    for log_file in workdir.glob("*.log"):
        log_file.replace(log_file.with_name(f"{log_file.name}.{attempt}"))


class _Attempt:
    """One start of a mode's cluster: train until the end or the first failure."""

    def __init__(
        self,
        job: TrainingJob,
        mode: str,
        shards: int,
        batches: GlobalBatches,
        workdir: Path,
        job_path: Path,
        store: str,
        cache_gb: float,
        network: ClusterNetwork | None,
        recovery: Recovery,
        checkpoint_dir: Path,
        attempt: int,
    ) -> None:
        self.job, self.mode, self.shards, self.batches = job, mode, shards, batches
        self.workdir, self.job_path, self.store, self.cache_gb = workdir, job_path, store, cache_gb
        self.network, self.recovery, self.attempt = network, recovery, attempt
        self.checkpoint_dir = checkpoint_dir
        self.resumed_at = -1  # the first batch this attempt feeds
        self.first_commit: float | None = None  # when an iteration past the resume committed
        self.lr_scales: Sequence[float] = ()  # iteration t's learning-rate multiplier
        # train()'s arguments: evaluation data, progress, keep the model, export to
        self.wanted: tuple[SparseDataset | DataSpec | None, Progress | None, bool, Path | None]
        self.wanted = (None, None, False, None)

    def _first_commit(self, when: float) -> None:
        self.first_commit = when

    def run(self) -> ModeResult:
        return self.train(*self.wanted)

    def _scheduler_flags(self) -> tuple[str, ...]:
        r = self.recovery
        if not (r.checkpoint_every or r.max_restarts):
            return ()
        job_id = checkpoints.fingerprint(self.job.to_json(), self.mode)
        return checkpoint_flags(r, self.checkpoint_dir, job_id, resume=self.attempt > 0)

    def train(
        self,
        eval_data: SparseDataset | DataSpec | None,
        progress: Progress | None,
        keep_model: bool,
        export: Path | None = None,
    ) -> ModeResult:
        job, mode, shards, batches = self.job, self.mode, self.shards, self.batches
        workdir, network = self.workdir, self.network
        processes: list[ManagedProcess] = []
        stop = threading.Event()
        try:
            store_args: tuple[str, ...] = ()
            if self.store == "cached":  # a fresh store per attempt: the checkpoint is the state
                data_dir = workdir / ("ps-data" if not self.attempt else f"ps-data.{self.attempt}")
                store_args = ("--store", "cached", "--data-dir", str(data_dir),
                              "--cache-gb", str(self.cache_gb))  # fmt: skip
            if job.distinct_keys and self.store == "staged":
                # Each shard's share of the training keys, with room for hashing's imbalance:
                # the tables never rebuild their index on the way there.
                share = int(job.distinct_keys / shards * 1.1) + 1024
                store_args += ("--expected-rows", str(share))
            shard_procs = [
                ps_process(i, shards, workdir, store_args, **_placed(network, f"ps-{i}"))
                for i in range(shards)
            ]
            processes += shard_procs
            start_servers(shard_procs)
            addresses = [p.address for p in shard_procs]
            ps = PSClient(addresses)
            ps.wait_ready()
            job.create_tables(ps)
            # On slow links the samples (batches in, plans out) are the scheduler's load: gzip.
            scheduler = scheduler_process(job.workers, job.cache_rows, mode, addresses, workdir,
                                          **_placed(network, "scheduler"),
                                          compress_plans=network is not None,
                                          extra=self._scheduler_flags(),
                                          worker_timeout=self.recovery.worker_timeout,
                                          expected_keys=job.distinct_keys or 0,
                                          early_write_back=job.early_write_back,
                                          look_ahead=job.look_ahead,
                                          prefetch_plans=job.prefetch_plans)  # fmt: skip
            processes.append(scheduler)
            start_servers([scheduler])
            start = self.resumed_at = _next_batch(scheduler.address)
            workers = [
                worker_process(w, self.job_path, scheduler.address, addresses, workdir,
                               **_placed(network, f"worker-{w}"), workers_here=job.workers)
                for w in range(job.workers)
            ]  # fmt: skip
            processes += workers
            links_before = network.link_bytes() if network is not None else {}
            started = time.perf_counter()
            errors: list[BaseException] = []

            def feed() -> None:
                try:
                    _feed(scheduler.address, batches, stop, compress=network is not None,
                          start=start, lr_scales=self.lr_scales)  # fmt: skip
                except BaseException as exc:  # reported by the monitor loop
                    errors.append(exc)

            feeder = threading.Thread(target=feed, name="feeder", daemon=True)
            feeder.start()
            first_commit = _monitor(
                scheduler, [*shard_procs, scheduler], workers, len(batches), mode, progress,
                errors, after=start - 1, on_first_commit=self._first_commit,
                worker_timeout=self.recovery.worker_timeout,
            )  # fmt: skip
            seconds = time.perf_counter() - started
            link_bytes = _link_delta(links_before, network.link_bytes() if network else {})
            # Throughput from the first commit on: worker start-up is not training.
            steady = time.perf_counter() - (first_commit or started)
            trained = len(batches) - start
            steady_samples = (trained - (1 if first_commit else 0)) * job.global_batch
            reports = [
                json.loads((workdir / f"worker-{w}.json").read_text()) for w in range(job.workers)
            ]
            traffic, per_iteration = _combine(reports, len(batches), job.global_batch)
            ps_counted = _ps_counts(shard_procs)
            auc_value = logloss_value = float("nan")
            if eval_data is not None:
                auc_value, logloss_value = evaluate(job, eval_data, ps)
            dense_size = job.model().dense_size
            kept = read_model(job, ps, distinct_keys(batches), dense_size) if keep_model else {}
            if export is not None:
                quality = {"auc": auc_value, "logloss": logloss_value}
                source = {"mode": mode, "iterations": len(batches),
                          **{k: v for k, v in quality.items() if v == v}}  # fmt: skip
                export_from_ps(job, ps, export, source)
            ps.close()
            return ModeResult(
                mode=mode,
                iterations=len(batches),
                seconds=seconds,
                samples_per_second=steady_samples / max(steady, 1e-9),
                traffic=traffic,
                ps_counted=ps_counted,
                per_iteration=per_iteration,
                auc=auc_value,
                logloss=logloss_value,
                row_bytes=job.row_bytes(mode),
                global_batch=job.global_batch,
                link_bytes=link_bytes,
                model=kept,
            )
        except (TimeoutError, grpc.RpcError, HeraldError) as exc:
            if isinstance(exc, ClusterError):
                raise
            dead = [f"{p.name} (exit {p.proc.poll()})" for p in processes
                    if p.proc.poll() not in (None, 0)]  # fmt: skip
            raise ClusterError(f"{mode}: {exc}; exited: {', '.join(dead) or 'none'}") from exc
        finally:
            stop.set()
            stop_cluster(processes)


def _next_batch(address: str) -> int:
    """The first batch the scheduler expects: 0, or the iteration after its checkpoint."""
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=30)
        return int(status.next_batch_iteration)


def _link_delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Bytes each link carried between two readings (training: workers start to exit)."""
    return {
        name: {d: n - before.get(name, {}).get(d, 0) for d, n in counts.items()}
        for name, counts in after.items()
    }


def _placed(network: ClusterNetwork | None, name: str) -> Placement:
    """``host`` and ``namespace`` of process ``name`` on ``network`` (none: loopback)."""
    if network is None:
        return {}
    endpoint = network.endpoint(name)
    return {"host": endpoint.host, "namespace": endpoint.namespace}


def _monitor(
    scheduler: ManagedProcess,
    servers: list[ManagedProcess],
    workers: list[ManagedProcess],
    iterations: int,
    mode: str,
    progress: Progress | None,
    errors: list[BaseException],
    after: int = -1,
    on_first_commit: Callable[[float], None] | None = None,
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT,
    until: int | None = None,
) -> float | None:
    """Wait for every worker to exit 0 (with ``until``: for that iteration's commit); fail
    fast (with the log) when any process dies, when the scheduler aborts the run (a silent
    worker, a failed commit: its reason), or when the scheduler has not answered for
    ``worker_timeout`` seconds (frozen).

    Returns when the first iteration past ``after`` (a resumed checkpoint's) was seen
    committed (None if never seen)."""
    first_commit: float | None = None
    unanswered_since: float | None = None
    ask_timeout = min(5.0, worker_timeout / 2) if worker_timeout > 0 else 5.0
    with grpc.insecure_channel(scheduler.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while True:
            asked = time.monotonic()
            try:
                status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=ask_timeout)
                unanswered_since = None
            except grpc.RpcError as err:
                _raise_if_aborted(err, mode)
                status = None
                unanswered_since = unanswered_since or asked
                if 0 < worker_timeout < time.monotonic() - unanswered_since:
                    raise ClusterError(
                        f"{mode}: the scheduler has not answered for {worker_timeout:g} s "
                        f"(--worker-timeout): frozen or hung; its log ({scheduler.log_path}) "
                        f"ends with:\n{scheduler.log_tail()}"
                    ) from None
            # A process that died is the cause; the feeder's lost connection only its echo.
            _raise_if_died(stub, scheduler, servers, workers, mode, ask_timeout,
                           wait=PROCESS_EXIT_WAIT_SECONDS if errors else 0.0)  # fmt: skip
            if errors:
                raise ClusterError(f"{mode}: feeding batches failed: {_rpc_text(errors[0])}")
            if all(w.proc.poll() == 0 for w in workers):
                return first_commit
            if status is not None and status.committed_iteration > after and first_commit is None:
                first_commit = time.perf_counter()
                if on_first_commit is not None:
                    on_first_commit(first_commit)
            if until is not None and status is not None and status.committed_iteration >= until:
                return first_commit
            if progress is not None and status is not None:
                r = status.reported
                so_far = {
                    "loss": status.last_loss,
                    "pulls": r.pulled_rows,
                    "pushes": r.pushed_gradient_rows + r.written_back_rows,
                }
                progress.update(mode, status.committed_iteration + 1, iterations, so_far)
            time.sleep(0.05)


PROCESS_EXIT_WAIT_SECONDS = 2.0  # a feed error: how long to look for the process behind it


def _raise_if_died(
    stub: scheduler_pb2_grpc.SchedulerStub,
    scheduler: ManagedProcess,
    servers: list[ManagedProcess],
    workers: list[ManagedProcess],
    mode: str,
    ask_timeout: float,
    wait: float = 0.0,
) -> None:
    """ProcessDied naming the first server that exited (any code) or worker that failed,
    with its exit code and log tail; with ``wait``, keep looking that long."""
    deadline = time.monotonic() + wait
    while True:
        for process in [*servers, *workers]:
            code = process.proc.poll()
            if code is not None and (code != 0 or process in servers):
                if process is not scheduler:  # a worker ended on the run's abort?
                    try:
                        stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=ask_timeout)
                    except grpc.RpcError as err:
                        _raise_if_aborted(err, mode)
                raise ProcessDied(
                    f"{mode}: {process.name} exited with code {code}; its log "
                    f"({process.log_path}) ends with:\n{process.log_tail()}",
                    process.name, code,
                )  # fmt: skip
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _rpc_text(exc: BaseException) -> str:
    """An RPC error as its status code and details (not the channel's debug dump)."""
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)


def _raise_if_aborted(err: grpc.RpcError, mode: str) -> None:
    """The scheduler aborted the run (ABORTED): a ClusterError with its reason."""
    if err.code() == grpc.StatusCode.ABORTED:
        raise ClusterError(f"{mode}: the scheduler aborted the run: {err.details()}") from None


def _combine(
    reports: list[dict[str, Any]], iterations: int, global_batch: int
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Traffic summed over workers; per iteration: rows moved, mean loss, the slowest
    worker's time from receiving its plan to its report, the workers' mean seconds per
    phase, and the period (the slowest worker's plan-to-plan time: all phases)."""
    keys = tuple(REPORTED)  # what each worker counted from its own RPCs
    totals = dict.fromkeys(keys, 0)
    per_iteration: list[dict[str, Any]] = [
        {"loss": 0.0, "seconds": 0.0, "period": 0.0, "phases": dict.fromkeys(PHASES, 0.0),
         **dict.fromkeys(keys, 0)}
        for _ in range(iterations)
    ]  # fmt: skip
    workers = max(len(reports), 1)
    for report in reports:
        for entry in report["iterations"]:
            row = per_iteration[entry["iteration"]]
            row["loss"] += entry["loss_sum"] / global_batch
            row["seconds"] = max(row["seconds"], entry["seconds"])  # the slowest worker
            phases = entry.get("phases", {})
            row["period"] = max(row["period"], sum(phases.values()))
            for phase, spent in phases.items():
                row["phases"][phase] += spent / workers
            for k in keys:
                row[k] += entry.get(k, 0)
                totals[k] += entry.get(k, 0)
    return totals, per_iteration


def median_phases(per_iteration: list[dict[str, Any]]) -> dict[str, float]:
    """Median over iterations of the workers' mean seconds per phase. The first
    iteration is left out when there are others: its plan wait is start-up, not training."""
    rows = per_iteration[1:] or per_iteration
    return {p: float(np.median([r["phases"][p] for r in rows])) if rows else 0.0 for p in PHASES}


def median_period(per_iteration: list[dict[str, Any]]) -> float:
    """Median plan-to-plan seconds of the slowest worker (first iteration left out)."""
    rows = per_iteration[1:] or per_iteration
    return float(np.median([r["period"] for r in rows])) if rows else 0.0


def run_local(
    job: TrainingJob,
    modes: list[str],
    shards: int,
    train: SparseDataset | GlobalBatches,
    eval_data: SparseDataset | DataSpec | None,
    workdir: Path | None = None,
    progress: Progress | None = None,
    store: str = "staged",
    cache_gb: float = 1.0,
    link_mbit: float | None = None,
    ps_link_mbit: float | None = None,
    recovery: Recovery | None = None,
    export: Path | None = None,
) -> dict[str, ModeResult]:
    """Every mode on its own fresh cluster, same batches and model; results by mode.

    Without ``workdir`` the logs live in a temporary directory that is removed at the
    end, so a failure's message says so instead of naming a file that no longer exists.
    With ``link_mbit`` every process runs behind its own link of that rate (PS shards:
    ``ps_link_mbit``) on one emulated network, built once for all modes. ``recovery``:
    checkpoints and restarts; its ``checkpoint_dir`` gets one folder per mode. ``export``:
    each mode's final model goes to ``export/MODE`` (``heraldps.model_export``).
    """
    recovery = recovery or Recovery()
    results = {}
    network: contextlib.AbstractContextManager[ClusterNetwork | None] = contextlib.nullcontext()
    if link_mbit is not None:
        network = ClusterNetwork(link_rates(shards, job.workers, link_mbit, ps_link_mbit))
    with tempfile.TemporaryDirectory(prefix="heraldps-local-") as scratch, network as net:
        root = workdir or Path(scratch)
        for mode in modes:
            try:
                results[mode] = run_mode(
                    job if mode_named(mode).bounded_staleness else replace(job, staleness=0),
                    mode, shards, train, eval_data, root / mode, progress, store=store,
                    cache_gb=cache_gb, network=net, recovery=_for_mode(recovery, mode),
                    export=export / mode if export is not None else None,
                )  # fmt: skip
            except ClusterError as exc:
                if workdir is not None:
                    raise
                raise ClusterError(
                    f"{exc}\n(the logs were in a temporary directory, removed now; rerun with "
                    "--workdir DIR to keep them)"
                ) from None
            if progress is not None:
                progress.done(mode, results[mode])
    return results


def _for_mode(recovery: Recovery, mode: str) -> Recovery:
    """Each mode checkpoints into its own folder of ``--checkpoint-dir``."""
    if recovery.checkpoint_dir is None:
        return recovery
    return replace(recovery, checkpoint_dir=recovery.checkpoint_dir / mode)
