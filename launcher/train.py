"""``heraldps train``: one job, one mode, trained epoch by epoch to the end.

One local cluster (the shards, the scheduler and the workers of ``heraldps local``)
lives for the whole run. Every epoch the training rows are put in a new order (by the
job's seed and the epoch) and fed as global batches; the epoch's last batch carries the
flush marker, so once it is committed the PS holds the exact model: every row a worker
cache held dirty is written back and the dense replica is stored. The validation split is
then evaluated from the PS; the best epoch's model is exported (``heraldps.model_export``)
to ``OUT/best``; the learning rate is decayed when the monitored metric does not improve
(the next epoch's batches carry the new ``lr_scale``) and training stops after
``patience`` epochs without improvement. At the end the test split is scored by the
serving code (``worker_client.predictor``) from ``OUT/best``, so ``heraldps predict`` on
that model gives the report's figure by construction.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from prometheus_client import CollectorRegistry, Gauge

from heraldps import checkpoints
from heraldps.client import PSClient
from heraldps.data import DataSpec, SparseDataset, read_all
from heraldps.data.global_batches import StreamedBatches
from heraldps.data.shuffle import ShuffledRows, bucket_sizes, shuffled_batches
from heraldps.errors import HeraldError
from heraldps.job import TrainingJob
from heraldps.job_file import JobFile, Schedule
from heraldps.traffic import REPORTED
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from launcher.cluster import (
    ClusterError,
    ManagedProcess,
    ps_process,
    scheduler_process,
    start_servers,
    stop_cluster,
    worker_process,
)
from launcher.export import export_from_ps
from launcher.feed import submit_batches
from launcher.local import (
    Recovery,
    Restart,
    _monitor,
    checkpoint_flags,
    clear_checkpoints,
    evaluate,
    restarting,
)
from launcher.plot import headless_pyplot
from launcher.train_state import Epoch, TrainState
from worker_client.evaluation import auc, logloss
from worker_client.minibatch import global_batches
from worker_client.predictor import Predictor

BEST = "best"
CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class Data:
    """The run's splits: training rows in memory, validation and test specs (streamed)."""

    job: TrainingJob  # with the first pass's numbers (rows, keys, dense statistics)
    # None: streamed every epoch, in file order (no shuffle) or through the streaming
    # shuffle (``schedule.shuffle_buffer_rows`` > 0)
    train: SparseDataset | None
    valid: DataSpec | None
    test: DataSpec | None


class TrainMetrics:
    """The progress line's figures on ``/metrics`` (``--metrics-port``)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.epoch = Gauge("heraldps_train_epoch", "Epochs finished", registry=r)
        self.loss = Gauge("heraldps_train_loss", "Mean training loss of the last epoch",
                          registry=r)  # fmt: skip
        self.auc = Gauge("heraldps_train_valid_auc", "Validation AUC after the last epoch",
                         registry=r)  # fmt: skip
        self.logloss = Gauge("heraldps_train_valid_logloss",
                             "Validation logloss after the last epoch", registry=r)  # fmt: skip
        self.lr = Gauge("heraldps_train_lr", "Learning rate of the last epoch", registry=r)
        self.speed = Gauge("heraldps_train_samples_per_second",
                           "Training samples per second in the last epoch", registry=r)  # fmt: skip
        self.best = Gauge("heraldps_train_best_epoch", "Epoch of the best model (0: none)",
                          registry=r)  # fmt: skip

    def observe(self, e: Epoch, best: int) -> None:
        self.epoch.set(e.epoch)
        self.loss.set(e.train_loss)
        self.auc.set(e.valid_auc)
        self.logloss.set(e.valid_logloss)
        self.lr.set(e.lr)
        self.speed.set(e.samples_per_second)
        self.best.set(best)


def epoch_order(rows: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of the training rows in ``epoch`` (from 1): a permutation drawn from
    (seed, epoch), the same in every run of the job; file order without ``shuffle``. The
    streaming shuffle with a buffer of at least ``rows`` rows gives this order too."""
    if not shuffle:
        return np.arange(rows, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(rows).astype(np.int64)


class Trainer:
    """The cluster of one ``heraldps train`` run and its epoch loop.

    With checkpoints (``schedule.checkpoint_every``, ``checkpoint_epochs``) the scheduler
    snapshots the PS into ``OUT/checkpoints``; a process that dies stops the cluster, and up
    to ``cluster.max_restarts`` times it starts again from the newest checkpoint
    (:func:`launcher.local.restarting`, as ``heraldps local`` does). The epoch loop then goes
    on from that checkpoint's batch, with the state of ``OUT/train-state.json`` rewound to it.
    A run whose ``OUT`` already holds this job's state resumes the same way (``resume``)."""

    def __init__(
        self,
        job_file: JobFile,
        data: Data,
        out: Path,
        cache_rows: int,
        say: Callable[[str], None] = print,
        metrics: TrainMetrics | None = None,
        resume: TrainState | None = None,
    ) -> None:
        self.jf, self.data, self.out, self.say = job_file, data, out, say
        self.job = replace(data.job, cache_rows=cache_rows, iterations=None)
        self.metrics = metrics or TrainMetrics()
        self.workdir = out / "cluster"
        self.processes: list[ManagedProcess] = []
        self.state = resume or TrainState(fingerprint(job_file, self.job))
        self.resuming = resume is not None  # the first start loads the newest checkpoint
        self.traffic: dict[str, int] = {}
        self.walls: list[float] = []  # each epoch's wall seconds, its validations included
        self.stop = threading.Event()  # set: the feeding thread stops submitting
        self.feeder = ThreadPoolExecutor(1, thread_name_prefix="feeder")
        self.restarts: list[Restart] = []
        self.resumed_from: int | None = None  # a rerun: the checkpoint's next batch
        s = job_file.schedule
        self.recovery = Recovery(checkpoint_every=s.checkpoint_every,
                                 checkpoint_dir=(out / CHECKPOINTS).absolute(),
                                 keep=s.keep_checkpoints,
                                 max_restarts=job_file.cluster.max_restarts)  # fmt: skip

    @property
    def epochs(self) -> list[Epoch]:
        return self.state.epochs

    @property
    def evals(self) -> list[dict[str, float]]:
        return self.state.evals

    @property
    def best_epoch(self) -> int:
        return self.state.best_epoch

    # ----- the cluster ---------------------------------------------------------------
    def _scheduler_flags(self, resume: bool) -> tuple[str, ...]:
        """Checkpoint flags (``OUT/checkpoints``), with ``resume``: start from the newest."""
        r, s = self.recovery, self.jf.schedule
        if not (s.checkpoints or r.max_restarts):
            return ()
        assert r.checkpoint_dir is not None
        return checkpoint_flags(r, r.checkpoint_dir, self.state.fingerprint, resume)

    def _start(self, resume: bool) -> tuple[PSClient, ManagedProcess, list[ManagedProcess]]:
        job, cluster = self.job, self.jf.cluster
        self.workdir.mkdir(parents=True, exist_ok=True)
        job_path = self.workdir / "job.json"
        job_path.write_text(job.to_json())
        store: tuple[str, ...] = ()
        if cluster.store == "cached":
            store = ("--store", "cached", "--data-dir", str(self.workdir / "ps-data"),
                     "--cache-gb", str(cluster.cache_gb))  # fmt: skip
            shutil.rmtree(self.workdir / "ps-data", ignore_errors=True)  # the checkpoint is it
        shards = [ps_process(i, cluster.shards, self.workdir, store)
                  for i in range(cluster.shards)]  # fmt: skip
        self.processes += shards
        start_servers(shards)
        addresses = [p.address for p in shards]
        ps = PSClient(addresses)
        ps.wait_ready()
        job.create_tables(ps)
        keys = job.distinct_keys or 0
        scheduler = scheduler_process(job.workers, job.cache_rows, cluster.mode, addresses,
                                      self.workdir, expected_keys=keys,
                                      early_write_back=job.early_write_back,
                                      look_ahead=job.look_ahead,
                                      prefetch_plans=job.prefetch_plans,
                                      extra=self._scheduler_flags(resume))  # fmt: skip
        self.processes.append(scheduler)
        start_servers([scheduler])
        workers = [worker_process(w, job_path, scheduler.address, addresses, self.workdir,
                                  workers_here=job.workers)
                   for w in range(job.workers)]  # fmt: skip
        self.processes += workers
        return ps, scheduler, workers

    def run(self) -> dict[str, Any]:
        """Train until early stopping or ``max_epochs``; the report (also OUT/report.json)."""
        started = time.perf_counter()
        if not self.resuming:  # a new run: a restart must never load an older run's
            assert self.recovery.checkpoint_dir is not None
            clear_checkpoints(self.recovery.checkpoint_dir)
        self.state.save(self.out)  # before any checkpoint: a rerun finds whose they are
        try:
            _, self.restarts = restarting(self.recovery.max_restarts, self.workdir,
                                          lambda n: _TrainAttempt(self, n))  # fmt: skip
        finally:
            self.feeder.shutdown(wait=True)
        self.traffic = self._traffic()
        test_auc, test_logloss = self._test()
        report = self._report(time.perf_counter() - started, test_auc, test_logloss)
        (self.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        write_curves(self.epochs, self.best_epoch, self.out / "curves.png")
        return report

    def _attempt(self, attempt: _TrainAttempt) -> None:
        """One start of the cluster (from the newest checkpoint after the first, or on a
        rerun): train to the end, or raise ClusterError when a process dies."""
        self.processes, self.stop = [], threading.Event()
        mode = self.jf.cluster.mode
        if attempt.number:
            self.say(f"a process failed (its log: {self.workdir}/NAME.log.{attempt.number - 1});"
                     f" restart {attempt.number} of at most {self.recovery.max_restarts} from "
                     "the newest checkpoint")  # fmt: skip
        try:
            ps, scheduler, workers = self._start(attempt.number > 0 or self.resuming)
            servers = self.processes[: self.jf.cluster.shards + 1]
            watch = _Watch(scheduler, servers, workers, mode, attempt)
            with grpc.insecure_channel(scheduler.address) as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=30)
                attempt.resumed_at = int(status.next_batch_iteration)
                if self.resuming and attempt.number == 0:
                    self.resumed_from = attempt.resumed_at
                self._epochs(ps, stub, watch)
                stub.Finish(scheduler_pb2.FinishRequest(), timeout=60)
            self._wait_exit(stub_address=scheduler.address, servers=servers, workers=workers)
            ps.close()
        except (TimeoutError, grpc.RpcError, HeraldError) as exc:
            if isinstance(exc, ClusterError):
                raise
            dead = [f"{p.name} (exit {p.proc.poll()})" for p in self.processes
                    if p.proc.poll() not in (None, 0)]  # fmt: skip
            raise ClusterError(f"{mode}: {exc}; exited: {', '.join(dead) or 'none'}") from exc
        finally:
            self.stop.set()
            stop_cluster(self.processes)

    def _batches_per_epoch(self) -> int:
        job = self.job
        if self.data.train is None:
            assert job.train_rows is not None
            return len(StreamedBatches(job.data_spec(), job.train_rows, job.global_batch, None))
        return self.data.train.rows // job.global_batch

    def _monitored(self, e: Epoch) -> float:
        """The value of ``e`` the schedule watches (no validation: every epoch improves)."""
        if self.data.valid is None:
            return float(e.epoch) if self.jf.schedule.monitor == "auc" else -float(e.epoch)
        return e.valid_auc if self.jf.schedule.monitor == "auc" else e.valid_logloss

    def _epochs(self, ps: PSClient, stub: scheduler_pb2_grpc.SchedulerStub, watch: _Watch) -> None:
        """The epochs from the batch the scheduler expects (0, or a checkpoint's next)."""
        sched, state = self.jf.schedule, self.state
        per_epoch, next_batch = self._batches_per_epoch(), watch.attempt.resumed_at
        state.rewind(next_batch, per_epoch)
        plateau = state.replay(sched, [self._monitored(e) for e in state.epochs])
        epoch = len(state.epochs) + 1
        done = next_batch - (epoch - 1) * per_epoch  # batches of `epoch` committed already
        if next_batch:
            self.say(f"resumed from the checkpoint of iteration {next_batch - 1}: epoch {epoch}"
                     f", {done} of {per_epoch} batches done")  # fmt: skip
        if 0 < done < per_epoch:
            self._validate_within(ps, epoch, next_batch - 1, done)  # if it was not yet
        while epoch <= sched.max_epochs and not plateau.stopped:
            epoch_began = time.perf_counter()
            seconds = self._train_epoch(ps, stub, watch, epoch, done, per_epoch, plateau.scale)
            status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=30)
            loss_sum, samples = status.committed_loss_sum, status.committed_samples
            before = state.loss_at_end[-1] if state.loss_at_end else (0.0, 0)
            loss = (loss_sum - before[0]) / max(samples - before[1], 1)
            valid_auc = valid_logloss = float("nan")
            if self.data.valid is not None:
                valid_auc, valid_logloss = evaluate(self.job, self.data.valid, ps)
            trained = (per_epoch - done) * self.job.global_batch
            record = Epoch(epoch, per_epoch, loss, valid_auc, valid_logloss,
                           self.base_lr * plateau.scale, trained / max(seconds, 1e-9),
                           seconds, improved=False)  # fmt: skip
            record.improved = plateau.observe(self._monitored(record))
            if record.improved:
                self._export_best(ps, record)  # before the state names it the best
            state.epochs.append(record)
            state.loss_at_end.append((loss_sum, samples))
            state.save(self.out)  # before the next epoch's first batch
            self.walls.append(time.perf_counter() - epoch_began)  # training, flush, validation
            self.metrics.observe(record, self.best_epoch)
            self.say(self._line(record, sched.max_epochs))
            epoch, done = epoch + 1, 0
        if plateau.stopped:
            self.say(f"early stop: {plateau.since_best} epochs without a better validation "
                     f"{sched.monitor} (patience {sched.patience}); best epoch "
                     f"{self.best_epoch}")  # fmt: skip

    @property
    def base_lr(self) -> float:
        return self.job.make_optimizer().lr

    def _train_epoch(
        self,
        ps: PSClient,
        stub: scheduler_pb2_grpc.SchedulerStub,
        watch: _Watch,
        epoch: int,
        done: int,
        per_epoch: int,
        scale: float,
    ) -> float:
        """Feed ``epoch``'s batches from its ``done``-th on, in spans of ``eval_every``
        (validating after each but the last); the seconds it took (validations excluded)."""
        every = self.jf.schedule.eval_every or per_epoch
        first_t = (epoch - 1) * per_epoch  # the epoch's first iteration
        batches = self._epoch_batches(epoch, start_batch=done)
        seconds = 0.0
        while done < per_epoch:
            end = min((done // every + 1) * every, per_epoch)  # the span's end in the epoch
            span = itertools.islice(batches, end - done)
            began = time.perf_counter()
            last_span = end == per_epoch
            self._feed(stub, span, first_t + done, end - done, scale, watch, last_span)
            seconds += time.perf_counter() - began
            done = end
            if done < per_epoch:
                self._validate_within(ps, epoch, first_t + done - 1, done)
        return seconds

    def _validate_within(self, ps: PSClient, epoch: int, iteration: int, done: int) -> None:
        """The validation after ``done`` batches of ``epoch`` (``eval_every``), unless there
        is none there or it was taken before a resume."""
        every = self.jf.schedule.eval_every
        if not every or done % every or self.data.valid is None:
            return
        if any(e["iteration"] == iteration for e in self.evals):
            return
        auc_now, logloss_now = evaluate(self.job, self.data.valid, ps)
        self.evals.append({"epoch": epoch, "iteration": iteration, "valid_auc": auc_now,
                           "valid_logloss": logloss_now})  # fmt: skip
        self.state.save(self.out)
        self.say(f"  iteration {iteration}: valid AUC {auc_now:.6f}, logloss "
                 f"{logloss_now:.6f}")  # fmt: skip

    def _feed(
        self,
        stub: scheduler_pb2_grpc.SchedulerStub,
        batches: Iterable[SparseDataset],
        start: int,
        count: int,
        scale: float,
        watch: _Watch,
        epoch_end: bool,
    ) -> None:
        """Feed ``count`` ``batches`` as iterations ``start``, ... with learning-rate multiplier
        ``scale``, the last one flushed (checkpointed at an epoch's end with
        ``checkpoint_epochs``), and wait for its commit: the PS then holds the exact model.
        The batches go from a thread while this one watches the processes."""
        last = start + count - 1
        checkpoint = {last} if epoch_end and self.jf.schedule.checkpoint_epochs else set()
        errors: list[BaseException] = []

        def feed() -> None:
            try:
                submit_batches(stub, batches, start=start, stop=self.stop,
                               lr_scales=[scale] * (last + 1), flush={last},
                               checkpoint=checkpoint, finish=False)  # fmt: skip
            except BaseException as exc:  # reported by the watch
                errors.append(exc)

        feeding = self.feeder.submit(feed)
        try:
            watch.until(last, errors)
        except BaseException:
            self.stop.set()  # the feeding thread gives up at its next retry
            raise
        feeding.result()

    def _epoch_batches(self, epoch: int, start_batch: int = 0) -> Iterator[SparseDataset]:
        """``epoch``'s global batches from ``start_batch`` on (a resumed epoch skips those
        committed before; ``_batches_per_epoch`` counts them): the training rows in the epoch's
        order (in memory, or through the streaming shuffle, which shuffles the epoch again and
        skips), or streamed from the file in its order."""
        job, sched = self.job, self.jf.schedule
        if self.data.train is None:
            assert job.train_rows is not None
            if not sched.shuffle:
                streamed = StreamedBatches(job.data_spec(), job.train_rows, job.global_batch,
                                           None)  # fmt: skip
                return streamed.iter_from(start_batch)
            rows = ShuffledRows(job.data_spec(), job.train_rows, sched.shuffle_buffer_rows,
                                sched.seed, epoch, self.workdir)  # fmt: skip
            return itertools.islice(shuffled_batches(rows, job.global_batch), start_batch, None)
        order = epoch_order(self.data.train.rows, sched.seed, epoch, sched.shuffle)
        batches = global_batches(self.data.train.take(order), job.global_batch, None, 1)
        return iter(batches[start_batch:])

    def _line(self, e: Epoch, max_epochs: int) -> str:
        mean = sum(self.walls) / len(self.walls)  # whole epochs, validation included
        left = (max_epochs - e.epoch) * mean
        mark = " *" if e.improved else ""
        return (f"epoch {e.epoch}/{max_epochs}: train loss {e.train_loss:.6f}, valid AUC "
                f"{e.valid_auc:.6f}, logloss {e.valid_logloss:.6f}, lr {e.lr:.3g}, "
                f"{e.samples_per_second:,.0f} samples/s, {e.seconds:.1f} s, at most "
                f"{left:.0f} s left{mark}")  # fmt: skip

    def _wait_exit(
        self, stub_address: str, servers: list[ManagedProcess], workers: list[ManagedProcess]
    ) -> None:
        """After Finish: every worker ends its plan stream and exits 0."""
        deadline = time.monotonic() + 120
        while not all(w.proc.poll() == 0 for w in workers):
            for w in workers:
                if w.proc.poll() not in (None, 0):
                    raise ClusterError(f"{w.name} exited with code {w.proc.poll()}; its log "
                                       f"({w.log_path}) ends with:\n{w.log_tail()}")  # fmt: skip
            if time.monotonic() > deadline:
                raise ClusterError(f"the workers did not exit after Finish ({stub_address})")
            time.sleep(0.05)

    def _export_best(self, ps: PSClient, e: Epoch) -> None:
        """The PS's model (exact: the epoch ended with a flush) to OUT/best, replacing the
        previous best only once the new one is complete."""
        fresh = self.out / f".{BEST}-epoch-{e.epoch}"
        shutil.rmtree(fresh, ignore_errors=True)
        source = {"mode": self.jf.cluster.mode, "epoch": e.epoch, "valid_auc": e.valid_auc,
                  "valid_logloss": e.valid_logloss}  # fmt: skip
        export_from_ps(self.job, ps, fresh, {k: v for k, v in source.items() if v == v})
        shutil.rmtree(self.out / BEST, ignore_errors=True)
        fresh.rename(self.out / BEST)

    def _test(self) -> tuple[float, float]:
        """Test AUC and logloss of OUT/best, scored by the serving code."""
        if self.data.test is None or not (self.out / BEST).is_dir():
            return float("nan"), float("nan")
        predictor = Predictor.load(self.out / BEST)
        return score_spec(predictor, self.data.test)

    def _traffic(self) -> dict[str, int]:
        """Rows the workers moved over the whole run, from their reports."""
        totals = dict.fromkeys(REPORTED, 0)
        for w in range(self.job.workers):
            path = self.workdir / f"worker-{w}.json"
            if path.exists():
                for entry in json.loads(path.read_text())["iterations"]:
                    for key in totals:
                        totals[key] += int(entry.get(key, 0))
        return totals

    def _report(self, seconds: float, test_auc: float, test_logloss: float) -> dict[str, Any]:
        jf = self.jf
        return {
            "job_file": str(jf.path) if jf.path else None,
            "settings": jf.settings,
            "job": asdict(self.job),
            "schedule": asdict(jf.schedule),
            "cluster": asdict(jf.cluster),
            "epochs": [asdict(e) for e in self.epochs],
            "evals_within_epochs": self.evals,
            "best_epoch": self.best_epoch,
            "best_model": str(self.out / BEST) if self.best_epoch else None,
            "test_auc": test_auc,
            "test_logloss": test_logloss,
            "seconds": seconds,
            "traffic": self.traffic,
            "resumed_from": self.resumed_from,
            "restarts": [asdict(r) for r in self.restarts],
        }


class _TrainAttempt:
    """One start of the run's cluster (:class:`launcher.local.Resumable`)."""

    def __init__(self, trainer: Trainer, number: int) -> None:
        self.trainer, self.number = trainer, number
        self.resumed_at = -1  # the first batch this start feeds
        self.first_commit: float | None = None  # when an iteration past it was committed

    def committed(self, when: float) -> None:
        if self.first_commit is None:
            self.first_commit = when

    def run(self) -> None:
        self.trainer._attempt(self)


@dataclass(frozen=True)
class _Watch:
    """The processes of one start, watched while a span of batches trains."""

    scheduler: ManagedProcess
    servers: list[ManagedProcess]
    workers: list[ManagedProcess]
    mode: str
    attempt: _TrainAttempt

    def until(self, last: int, errors: list[BaseException]) -> None:
        """Wait for iteration ``last``'s commit; a process that dies, the scheduler's abort
        or the feeding's error (``errors``) is a ClusterError (with the log)."""
        _monitor(self.scheduler, self.servers, self.workers, last + 1, self.mode, None, errors,
                 after=self.attempt.resumed_at - 1, on_first_commit=self.attempt.committed,
                 until=last)  # fmt: skip


def fingerprint(jf: JobFile, job: TrainingJob) -> str:
    """What a resume must not change (``heraldps.checkpoints.fingerprint``): the job every
    process runs, the mode and shards, the splits and the schedule's rules. Not
    ``max_epochs`` nor the checkpoint settings: a rerun may train longer."""
    schedule = asdict(jf.schedule)
    for key in ("max_epochs", "checkpoint_every", "checkpoint_epochs", "keep_checkpoints"):
        schedule.pop(key)
    return checkpoints.fingerprint(
        replace(job, epochs=1).to_json(), jf.cluster.mode, str(jf.cluster.shards),
        json.dumps(asdict(jf.splits), sort_keys=True), json.dumps(schedule, sort_keys=True),
    )  # fmt: skip


def score_spec(predictor: Predictor, spec: DataSpec) -> tuple[float, float]:
    """AUC and logloss of ``predictor`` on the rows of ``spec``."""
    from heraldps.data import stream
    from worker_client.predictor import EVAL_CHUNK_ROWS

    parts = [(predictor.score(chunk), np.asarray(chunk.labels, np.float32))
             for chunk in stream(spec, EVAL_CHUNK_ROWS)]  # fmt: skip
    if not parts:
        return float("nan"), float("nan")
    p, y = np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])
    return auc(y, p), logloss(y, p)


def read_data(job_file: JobFile) -> Data:
    """The splits of the job file, checked in a first pass; the training rows read into
    memory when the job shuffles them there (``shuffle_buffer_rows`` 0: the per-epoch
    permutation needs them), else streamed from the file every epoch."""
    from heraldps.job_file import row_split
    from launcher.cli.data import first_pass

    job, splits, split = job_file.job, job_file.splits, row_split(job_file)
    if split is not None:
        if split.train < job.global_batch:
            raise ClusterError(f"the training split has {split.train} rows, fewer than one "
                               f"global batch of {job.global_batch}")  # fmt: skip
        job = replace(job, max_rows=split.train)
    profile = first_pass(job.data_spec(), "first pass")
    stats = tuple(s.to_dict() for s in profile.dense_stats)
    job = replace(job, dense_stats=stats or None, train_rows=profile.rows,
                  distinct_keys=profile.total_distinct_keys,
                  dense_transforms=job.data_spec().transforms() or None)  # fmt: skip

    def held_out(path: str | None, start: int, rows: int) -> DataSpec | None:
        if path is not None:
            return job.data_spec(path)
        if not rows:
            return None
        return job.data_spec(job.data).with_rows(start, start + rows)

    at = split.train if split else 0
    valid = held_out(splits.valid, at, split.valid if split else 0)
    test = held_out(splits.test, at + (split.valid if split else 0), split.test if split else 0)
    # Without the in-memory shuffle the batches stream from the file: memory follows the
    # batches (and the streaming shuffle's buffer).
    sched = job_file.schedule
    in_memory = sched.shuffle and not sched.shuffle_buffer_rows
    train = read_all(job.data_spec()) if in_memory else None
    return Data(job, train, valid, test)


def shuffle_setting(schedule: Schedule, rows: int) -> str:
    """The shuffle as the resolved settings show it."""
    if not schedule.shuffle:
        return "no shuffle (file order)"
    if not schedule.shuffle_buffer_rows:
        return f"shuffle in memory (a permutation of {rows:,} rows)"
    buckets = bucket_sizes(rows, schedule.shuffle_buffer_rows).shape[0]
    return (f"streaming shuffle (buffer {schedule.shuffle_buffer_rows:,} rows, {buckets:,} "
            f"bucket{'s' if buckets > 1 else ''}, spill file in cluster/)")  # fmt: skip


def write_curves(epochs: list[Epoch], best: int, path: Path) -> None:
    """Train loss and validation logloss, validation AUC, and samples/s per epoch (PNG)."""
    plt = headless_pyplot()

    x = [e.epoch for e in epochs]
    fig, (loss_ax, auc_ax, speed_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    loss_ax.plot(x, [e.train_loss for e in epochs], "o-", label="train loss")
    loss_ax.plot(x, [e.valid_logloss for e in epochs], "s--", label="valid logloss")
    loss_ax.set(title="loss per epoch", xlabel="epoch", ylabel="logloss")
    auc_ax.plot(x, [e.valid_auc for e in epochs], "o-", color="tab:green")
    if best:
        auc_ax.axvline(best, color="grey", linestyle=":", label=f"best epoch {best}")
        auc_ax.legend()
    auc_ax.set(title="validation AUC per epoch", xlabel="epoch", ylabel="AUC")
    speed_ax.bar(x, [e.samples_per_second for e in epochs], color="tab:orange")
    speed_ax.set(title="training speed", xlabel="epoch", ylabel="samples/s")
    for ax in (loss_ax, auc_ax, speed_ax):
        ax.grid(alpha=0.3)
        ax.set_xticks(x)
    loss_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
