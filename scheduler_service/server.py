"""Running the scheduler service: config, PS commit hook, process (``heraldps.serving``)."""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import asdict, dataclass, field

from heraldps.admission import Limits
from heraldps.client import PSClient
from heraldps.fence import MAX_LEASE_SECONDS, MAX_RUN_ID_CHARS, MIN_LEASE_SECONDS
from heraldps.modes import (
    DEFAULT_MAX_BACKLOG,
    EARLY_WRITE_BACK_ALL,
    MODES,
    check_look_ahead,
    check_prefetch_plans,
    mode_named,
)
from heraldps.ports import check_port
from heraldps.security import ClientSecurity, ServerSecurity
from heraldps.serving import GrpcProcess, serve_until_signal
from heraldps.traffic import Traffic
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.barrier import Barrier, RunAborted
from scheduler_service.checkpointer import CheckpointConfig, Checkpointer
from scheduler_service.claim import ShardLease
from scheduler_service.metrics import CheckpointMetrics, SchedulerMetrics
from scheduler_service.scheduler import make_scheduler
from scheduler_service.servicer import SchedulerServicer
from scheduler_service.shadow import NaiveShadow
from scheduler_service.watchdog import Watchdog

log = logging.getLogger(__name__)

RESUME_WAIT_SECONDS = 120.0  # for the shards to come up before a resume loads them
# How long a worker session without a plan stream stays live when --worker-timeout is 0.
DEFAULT_SESSION_EXPIRY = 60.0
ABORT_EXIT_SECONDS = 3.0  # an aborted run that can resume: answer ABORTED this long, then exit 1
SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
# Feeding batches and ending the run are the operator's (the feed's); workers have the rest.
ADMIN_METHODS = tuple(f"/{SERVICE_NAME}/{m}" for m in ("SubmitBatch", "Finish"))


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything the scheduler process is configured with (CLI flags / HERALDPS_* env)."""

    workers: int
    cache_rows: int
    mode: str = "herald"
    # The run's distinct keys when known (a first pass, a keyset): sizes the cache mirror's
    # index and records up front, so planning never stalls on their growth. 0: unknown.
    expected_keys: int = 0
    # Rows per worker and iteration written back before anyone needs them (-1: every
    # idle dirty row; 0: off).
    early_write_back: int = EARLY_WRITE_BACK_ALL
    # Batches the scheduler sees beyond the plan it releases (1..32; it holds them).
    look_ahead: int = 1
    # herald_pipelined: plans a worker may hold and pull early rows for (1..8).
    prefetch_plans: int = 1
    table: str = "emb"
    ps: tuple[str, ...] = field(default_factory=tuple)
    host: str = "127.0.0.1"  # containers pass 0.0.0.0 explicitly
    port: int = 7100
    metrics_port: int | None = None
    max_backlog: int = DEFAULT_MAX_BACKLOG
    max_message_mb: int = 64
    threads: int = 32
    grace_seconds: float = 10.0
    port_file: str | None = None
    # Plan every batch a second time in mode naive to export naive's row counts (Herald
    # Table 1's baseline, live); costs planning time and mirror memory again. Not needed
    # (and not run) in mode naive, whose own counts are the baseline.
    shadow_naive: bool = True
    compress_plans: bool = False  # gzip WatchPlans (the samples travel in the plans)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    security: ServerSecurity = field(default_factory=ServerSecurity)
    # What the scheduler presents to the PS shards; it commits, so it needs the admin token.
    ps_security: ClientSecurity = field(default_factory=ClientSecurity)
    max_concurrent_rpcs: int = 0  # 0: 4 x threads (heraldps.admission)
    max_streams: int = 0  # 0: workers + 16 (each worker holds one plan stream)
    stream_stall_seconds: float = 60.0
    # A worker that has not reported the iteration in progress this many seconds after
    # it could start (or after the worker last spoke) aborts the run; 0: never.
    worker_timeout: float = 60.0
    # Fencing (heraldps.fence): the run this scheduler claims the shards for ("": its
    # --job-fingerprint, else a fresh random id), the claim's lease, and whether to take
    # shards another run's live scheduler holds.
    run_id: str = ""
    claim_lease_seconds: float = 30.0
    force_takeover: bool = False

    def __post_init__(self) -> None:
        check_port(self.port, "--port")
        check_port(self.metrics_port, "--metrics-port")
        check_look_ahead(self.look_ahead, "--look-ahead")  # InvalidArgument, as the flag's
        check_prefetch_plans(self.prefetch_plans, "--prefetch-plans")
        if len(self.run_id) > MAX_RUN_ID_CHARS:
            raise ValueError(f"--run-id has at most {MAX_RUN_ID_CHARS} characters")
        if not MIN_LEASE_SECONDS <= self.claim_lease_seconds <= MAX_LEASE_SECONDS:
            raise ValueError(
                f"--claim-lease-seconds must be in [{MIN_LEASE_SECONDS:g}, "
                f"{MAX_LEASE_SECONDS:g}], got {self.claim_lease_seconds}"
            )
        if not self.worker_timeout >= 0:  # also refuses NaN
            raise ValueError(
                f"--worker-timeout must be >= 0 seconds (0: never), got {self.worker_timeout}"
            )
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.threads < self.min_threads:
            raise ValueError(
                f"--threads {self.threads} is too few for {self.workers} workers' reports "
                f"waiting for commits (--mode {self.mode}); use at least {self.min_threads}"
            )
        if (self.checkpoints.every or self.checkpoints.resume_from) and not self.ps:
            raise ValueError("--checkpoint-every and --resume-from need --ps (the shards)")
        if self.limits.max_streams < self.workers:
            raise ValueError(
                f"--max-streams {self.max_streams} is too few for {self.workers} workers' "
                f"plan streams; use at least {self.workers} (0: workers + 16)"
            )
        if self.pipelined and self.max_backlog < self.prefetch_plans + 1:
            raise ValueError(
                f"--mode {self.mode} releases plans up to t+{self.prefetch_plans} while t "
                f"trains (--prefetch-plans {self.prefetch_plans}), which needs --max-backlog "
                f"{self.prefetch_plans + 1} or more, got {self.max_backlog}"
            )

    @property
    def limits(self) -> Limits:
        streams = self.max_streams or self.workers + 16
        return Limits(self.threads, self.max_concurrent_rpcs, streams, self.stream_stall_seconds)

    @property
    def pipelined(self) -> bool:
        """Whether plans flow one iteration ahead (the mode's early pulls)."""
        return mode_named(self.mode).early_pulls

    @property
    def min_threads(self) -> int:
        """Plan streams run in their own budget (``--max-streams``), outside ``--threads``;
        a pipelined worker's ReportDone waits for the commit and holds a thread meanwhile."""
        return (self.workers if self.pipelined else 0) + 4


class SchedulerServer(GrpcProcess):
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        config.security.check()
        self.ps = PSClient(list(config.ps), security=config.ps_security) if config.ps else None
        scheduler = make_scheduler(
            config.workers, config.cache_rows, config.mode, config.checkpoints.every,
            config.expected_keys, config.early_write_back, config.look_ahead,
            config.prefetch_plans,
        )  # fmt: skip
        self.barrier = Barrier(scheduler, self._commit, config.max_backlog)
        self.run_id = (
            config.run_id or config.checkpoints.fingerprint or f"run-{secrets.token_hex(4)}"
        )
        self.lease = (
            ShardLease(self.ps, self.run_id, config.claim_lease_seconds, config.force_takeover,
                       self._lost_claim)
            if self.ps is not None
            else None
        )  # fmt: skip
        self.watchdog = Watchdog(self.barrier, config.worker_timeout)
        self.metrics = SchedulerMetrics(config.mode)
        checkpoint_metrics = CheckpointMetrics(self.metrics.registry)  # exported either way
        self.checkpointer: Checkpointer | None = None
        if self.ps is not None:
            self.checkpointer = Checkpointer(
                config.checkpoints, self.ps, config.mode, config.workers, checkpoint_metrics
            )
            self.barrier.can_checkpoint = config.checkpoints.directory is not None
        self.metrics.aborted.set_function(lambda: float(self.barrier.failure is not None))
        self.shadow = (
            NaiveShadow(config.workers, config.cache_rows)
            if config.shadow_naive and not mode_named(config.mode).is_naive
            else None
        )
        self.metrics.watch_counts(lambda: scheduler.counts, self._naive_counts)
        self.stopping = threading.Event()
        self.servicer = SchedulerServicer(
            self.barrier,
            self.metrics,
            config.table,
            self.stopping,
            self.shadow,
            compress_plans=config.compress_plans,
            tokens=config.security.tokens(),
            session_expiry=config.worker_timeout or DEFAULT_SESSION_EXPIRY,
        )
        super().__init__(
            name="scheduler",
            host=config.host,
            port=config.port,
            threads=config.threads,
            max_message_bytes=config.max_message_mb * 2**20,
            service_names=(SERVICE_NAME,),
            registry=self.metrics.registry,
            metrics_port=config.metrics_port,
            port_file=config.port_file,
            grace_seconds=config.grace_seconds,
            security=config.security,
            admin_methods=ADMIN_METHODS,
            limits=config.limits,
        )
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(self.servicer, self.server)

    def _naive_counts(self) -> Traffic | None:
        """Naive's counts on the batches so far: the scheduler's own in mode naive."""
        if mode_named(self.config.mode).is_naive:
            return self.barrier.scheduler.counts
        if self.shadow is None or self.shadow.failed is not None:
            return None
        return self.shadow.counts

    def _lost_claim(self, why: str) -> None:
        self.barrier.fail(
            RunAborted(f"this scheduler (run {self.run_id!r}) lost its claim on the shards: "
                       f"{why}; the run is aborted")
        )  # fmt: skip

    def _commit(self, iteration: int) -> None:
        """Every worker reported ``iteration``: commit it on every PS shard."""
        if self.ps is not None:
            assert self.lease is not None
            self.lease.acquire()  # at the first commit, unless a resume claimed them
            self.ps.commit(iteration, self.barrier.lr_scale(iteration))
        self.barrier.committed_on_ps()  # the snapshot below is not a frozen shard
        log.info("committed iteration %d", iteration)
        if self.checkpointer is not None:  # before the next plans flow: nothing newer on the PS
            b = self.barrier
            b_loss, requested = b.loss_through(iteration), b.checkpoint_requested(iteration)
            self.checkpointer.after_commit(iteration, b.samples_through(iteration), b_loss,
                                           requested)  # fmt: skip

    def resume(self) -> None:
        """Load the checkpoint ``--resume-from`` names into the shards and start after it,
        before serving: no worker sees a plan before the model is in place."""
        if self.checkpointer is None:
            return
        if not self.config.checkpoints.resume_from:
            self.checkpointer.clean_partial()
            return
        assert self.ps is not None and self.lease is not None
        self.ps.wait_ready(timeout=RESUME_WAIT_SECONDS)
        self.lease.acquire()  # before the Load: never into shards a live run holds
        manifest = self.checkpointer.resume()
        self.checkpointer.clean_partial()
        if manifest is not None:
            self.barrier.resume_at(manifest.iteration, manifest.samples_seen, manifest.loss_sum,
                                   manifest.loss_samples)  # fmt: skip
            self.metrics.committed.set(manifest.iteration)

    def start(self) -> None:
        self.resume()
        super().start()
        if self.config.worker_timeout > 0:
            self.watchdog.start()
        if self.config.checkpoints.resume_from:
            threading.Thread(target=self._exit_when_aborted, name="abort-exit", daemon=True).start()
        log.info("config %s", asdict(self.config))

    def _exit_when_aborted(self) -> None:
        """With ``--resume-from``, an aborted run ends the process (exit 1) so that its
        supervisor (a Kubernetes Deployment) starts it again, and the new scheduler resumes
        from the newest checkpoint. It waits ``ABORT_EXIT_SECONDS`` first, so the workers
        and the feed waiting on it hear why."""
        while not self.stopping.is_set():
            failure = self.barrier.wait_aborted(1.0)
            if failure is None:
                continue
            log.error("run aborted (%s); exiting in %g s so the scheduler restarts and "
                      "resumes from the newest checkpoint", failure.message,
                      ABORT_EXIT_SECONDS)  # fmt: skip
            if not self.stopping.wait(ABORT_EXIT_SECONDS):
                self.exit_code = 1
                self.stop()
            return

    def before_stop(self) -> None:
        self.watchdog.stop()
        self.stopping.set()
        self.barrier.wake_all()

    def stop(self, grace: float | None = None) -> None:
        super().stop(grace)
        if self.lease is not None:
            self.lease.release()
        if self.ps is not None:
            self.ps.close()


def serve(config: SchedulerConfig) -> int:
    return serve_until_signal(SchedulerServer(config))
