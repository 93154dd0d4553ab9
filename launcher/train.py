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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from prometheus_client import CollectorRegistry, Gauge

from heraldps.client import PSClient
from heraldps.data import DataSpec, SparseDataset, read_all
from heraldps.data.global_batches import StreamedBatches
from heraldps.data.shuffle import ShuffledRows, bucket_sizes, shuffled_batches
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
    stop_all,
    worker_process,
)
from launcher.export import export_from_ps
from launcher.feed import submit_batches
from launcher.local import _raise_if_died, evaluate
from worker_client.evaluation import auc, logloss
from worker_client.minibatch import global_batches
from worker_client.predictor import Predictor

BEST = "best"


@dataclass
class Epoch:
    """One epoch's figures, as the report and the progress line give them."""

    epoch: int
    iterations: int
    train_loss: float
    valid_auc: float
    valid_logloss: float
    lr: float  # the learning rate this epoch trained with
    samples_per_second: float
    seconds: float
    improved: bool


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


def better(monitor: str, value: float, best: float | None) -> bool:
    """Whether ``value`` of ``monitor`` improves on ``best`` (None: nothing yet)."""
    if not np.isfinite(value):
        return False
    if best is None:
        return True
    return value > best if monitor == "auc" else value < best


def epoch_order(rows: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order of the training rows in ``epoch`` (from 1): a permutation drawn from
    (seed, epoch), the same in every run of the job; file order without ``shuffle``. The
    streaming shuffle with a buffer of at least ``rows`` rows gives this order too."""
    if not shuffle:
        return np.arange(rows, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(rows).astype(np.int64)


class Trainer:
    """The cluster of one ``heraldps train`` run and its epoch loop."""

    def __init__(
        self,
        job_file: JobFile,
        data: Data,
        out: Path,
        cache_rows: int,
        say: Callable[[str], None] = print,
        metrics: TrainMetrics | None = None,
    ) -> None:
        self.jf, self.data, self.out, self.say = job_file, data, out, say
        self.job = replace(data.job, cache_rows=cache_rows, iterations=None)
        self.metrics = metrics or TrainMetrics()
        self.workdir = out / "cluster"
        self.processes: list[ManagedProcess] = []
        self.epochs: list[Epoch] = []
        self.best_epoch = 0
        self.traffic: dict[str, int] = {}
        self.evals: list[dict[str, float]] = []  # validations within epochs (eval_every)
        self.walls: list[float] = []  # each epoch's wall seconds, its validations included
        self.stop = threading.Event()  # set: the feeding thread stops submitting
        self.feeder = ThreadPoolExecutor(1, thread_name_prefix="feeder")

    # ----- the cluster ---------------------------------------------------------------
    def _start(self) -> tuple[PSClient, ManagedProcess, list[ManagedProcess]]:
        job, cluster = self.job, self.jf.cluster
        self.workdir.mkdir(parents=True, exist_ok=True)
        job_path = self.workdir / "job.json"
        job_path.write_text(job.to_json())
        store: tuple[str, ...] = ()
        if cluster.store == "cached":
            store = ("--store", "cached", "--data-dir", str(self.workdir / "ps-data"),
                     "--cache-gb", str(cluster.cache_gb))  # fmt: skip
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
                                      self.workdir, expected_keys=keys)  # fmt: skip
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
        try:
            ps, scheduler, workers = self._start()
            servers = self.processes[: self.jf.cluster.shards + 1]
            with grpc.insecure_channel(scheduler.address) as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                self._epochs(ps, stub, scheduler, servers, workers)
                stub.Finish(scheduler_pb2.FinishRequest(), timeout=60)
            self._wait_exit(stub_address=scheduler.address, servers=servers, workers=workers)
            ps.close()
        finally:
            self.stop.set()
            stop_all(self.processes[::-1])
            self.feeder.shutdown(wait=True)
        self.traffic = self._traffic()
        test_auc, test_logloss = self._test()
        report = self._report(time.perf_counter() - started, test_auc, test_logloss)
        (self.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        write_curves(self.epochs, self.best_epoch, self.out / "curves.png")
        return report

    def _epochs(
        self,
        ps: PSClient,
        stub: scheduler_pb2_grpc.SchedulerStub,
        scheduler: ManagedProcess,
        servers: list[ManagedProcess],
        workers: list[ManagedProcess],
    ) -> None:
        sched, job = self.jf.schedule, self.job
        base_lr = job.make_optimizer().lr
        scale, best, since_best, since_decay, t = 1.0, None, 0, 0, 0
        for epoch in range(1, sched.max_epochs + 1):
            epoch_began = time.perf_counter()
            count, batches = self._epoch_batches(epoch)
            before = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=30)
            seconds = 0.0
            every = sched.eval_every or count
            for first in range(0, count, every):  # spans of eval_every iterations
                size = min(every, count - first)
                span = itertools.islice(batches, size)
                began = time.perf_counter()
                status = self._feed(stub, span, size, t, scale, scheduler, servers, workers)
                seconds += time.perf_counter() - began
                t += size
                if first + size < count and self.data.valid is not None:
                    auc_now, logloss_now = evaluate(job, self.data.valid, ps)
                    self.evals.append(
                        {
                            "epoch": epoch,
                            "iteration": t - 1,
                            "valid_auc": auc_now,
                            "valid_logloss": logloss_now,
                        }
                    )
                    self.say(f"  iteration {t - 1}: valid AUC {auc_now:.6f}, logloss "
                             f"{logloss_now:.6f}")  # fmt: skip
            samples = status.committed_samples - before.committed_samples
            loss = (status.committed_loss_sum - before.committed_loss_sum) / max(samples, 1)
            valid_auc = valid_logloss = float("nan")
            if self.data.valid is not None:
                valid_auc, valid_logloss = evaluate(job, self.data.valid, ps)
            value = valid_auc if sched.monitor == "auc" else valid_logloss
            if self.data.valid is None:  # nothing to monitor: every epoch is the newest best
                value = float(epoch) if sched.monitor == "auc" else -float(epoch)
            improved = better(sched.monitor, value, best)
            record = Epoch(epoch, count, loss, valid_auc, valid_logloss, base_lr * scale,
                           count * job.global_batch / max(seconds, 1e-9), seconds,
                           improved)  # fmt: skip
            self.epochs.append(record)
            if improved:
                best, self.best_epoch, since_best, since_decay = value, epoch, 0, 0
                self._export_best(ps, record)
            else:
                since_best += 1
                since_decay += 1
                if sched.lr_decay < 1 and since_decay >= sched.lr_patience:
                    scale *= sched.lr_decay
                    since_decay = 0
            self.walls.append(time.perf_counter() - epoch_began)  # training, flush, validation
            self.metrics.observe(record, self.best_epoch)
            self.say(self._line(record, sched.max_epochs))
            if since_best >= sched.patience:
                self.say(f"early stop: {since_best} epochs without a better validation "
                         f"{sched.monitor} (patience {sched.patience}); best epoch "
                         f"{self.best_epoch}")  # fmt: skip
                return

    def _feed(
        self,
        stub: scheduler_pb2_grpc.SchedulerStub,
        batches: Iterable[SparseDataset],
        count: int,
        start: int,
        scale: float,
        scheduler: ManagedProcess,
        servers: list[ManagedProcess],
        workers: list[ManagedProcess],
    ) -> scheduler_pb2.SchedulerStatus:
        """Feed ``count`` ``batches`` as iterations ``start``, ... with learning-rate multiplier
        ``scale``, the last one flushed, and wait for its commit: the PS then holds the exact
        model. The batches go from a thread while this one watches the processes."""
        last = start + count - 1
        feeding = self.feeder.submit(submit_batches, stub, batches, start=start,
                                     stop=self.stop, lr_scales=[scale] * (last + 1),
                                     flush={last}, finish=False)  # fmt: skip
        try:
            status = self._wait_committed(stub, last, scheduler, servers, workers, feeding)
        except BaseException:
            self.stop.set()  # the feeding thread gives up at its next retry
            raise
        feeding.result()
        return status

    def _epoch_batches(self, epoch: int) -> tuple[int, Iterator[SparseDataset]]:
        """How many global batches ``epoch`` has, and the batches: the training rows in the
        epoch's order (in memory, or through the streaming shuffle), or streamed from the
        file in its order."""
        job, sched = self.job, self.jf.schedule
        if self.data.train is None:
            assert job.train_rows is not None
            streamed = StreamedBatches(job.data_spec(), job.train_rows, job.global_batch, None)
            if not sched.shuffle:
                return len(streamed), streamed.iter_from(0)
            rows = ShuffledRows(job.data_spec(), job.train_rows, sched.shuffle_buffer_rows,
                                sched.seed, epoch, self.workdir)  # fmt: skip
            return len(streamed), shuffled_batches(rows, job.global_batch)
        order = epoch_order(self.data.train.rows, sched.seed, epoch, sched.shuffle)
        batches = global_batches(self.data.train.take(order), job.global_batch, None, 1)
        return len(batches), iter(batches)

    def _line(self, e: Epoch, max_epochs: int) -> str:
        mean = sum(self.walls) / len(self.walls)  # whole epochs, validation included
        left = (max_epochs - e.epoch) * mean
        mark = " *" if e.improved else ""
        return (f"epoch {e.epoch}/{max_epochs}: train loss {e.train_loss:.6f}, valid AUC "
                f"{e.valid_auc:.6f}, logloss {e.valid_logloss:.6f}, lr {e.lr:.3g}, "
                f"{e.samples_per_second:,.0f} samples/s, {e.seconds:.1f} s, at most "
                f"{left:.0f} s left{mark}")  # fmt: skip

    def _wait_committed(
        self,
        stub: scheduler_pb2_grpc.SchedulerStub,
        last: int,
        scheduler: ManagedProcess,
        servers: list[ManagedProcess],
        workers: list[ManagedProcess],
        feeding: Future[bool],
    ) -> scheduler_pb2.SchedulerStatus:
        """Poll until ``last`` is committed while ``feeding`` submits the batches; a process
        that dies, or the feeding's error, fails the run with its log."""
        while True:
            status = stub.GetStatus(scheduler_pb2.GetStatusRequest(), timeout=30)
            if status.committed_iteration >= last:
                return status
            _raise_if_died(stub, scheduler, servers, workers, self.jf.cluster.mode, 5.0)
            if feeding.done() and feeding.exception() is not None:
                feeding.result()
            time.sleep(0.02)

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
        }


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
