"""The scheduler's checkpoints: snapshot the PS after a checkpoint iteration's commit, and
resume a run from the newest complete one (:mod:`heraldps.checkpoints` for the format).

Why the scheduler: it is the one process that knows when an iteration is committed
and nothing newer has reached the PS. The plans of a checkpoint iteration made every
worker write back its dirty rows and store its dense replica before reporting
(``CommPlan.checkpoint``), and the next iteration's plans flow only once
:meth:`Checkpointer.after_commit` returns, so the snapshot is the model at the end of
iteration t, exactly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from heraldps import checkpoints
from heraldps.checkpoints import Manifest
from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition, HeraldError, InvalidArgument
from scheduler_service.metrics import CheckpointMetrics
from scheduler_service.scheduler import is_checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointConfig:
    """``--checkpoint-every``, ``--checkpoint-dir``, ``--keep-checkpoints``, ``--resume-from``,
    ``--job-fingerprint``."""

    every: int = 0
    directory: str | None = None
    keep: int = 2
    resume_from: str | None = None
    fingerprint: str = ""

    def __post_init__(self) -> None:
        if self.every < 0 or self.keep < 1:
            raise ValueError("--checkpoint-every must be >= 0 and --keep-checkpoints >= 1")
        if self.every and not self.directory:
            raise ValueError("--checkpoint-every needs --checkpoint-dir (where snapshots go)")
        for flag, path in (
            ("--checkpoint-dir", self.directory),
            ("--resume-from", self.resume_from),
        ):
            if path and not os.path.isabs(path):
                raise ValueError(
                    f"{flag} {path!r} must be an absolute path: the scheduler writes the "
                    "manifest there and every shard its snapshot, each resolving the path "
                    "on its own (a relative one lands under a shard's --snapshot-root or "
                    "working directory, away from the manifest); use the volume's mount "
                    "path, the same in every pod"
                )


ROOM_MARGIN = 1.5  # room a checkpoint is expected to need: the newest one's size times this


class Checkpointer:
    """Writes checkpoints of one run and resumes from them."""

    def __init__(
        self,
        config: CheckpointConfig,
        ps: PSClient,
        mode: str,
        workers: int,
        metrics: CheckpointMetrics | None = None,
    ) -> None:
        self.config, self.ps, self.mode, self.workers = config, ps, mode, workers
        self.metrics = metrics or CheckpointMetrics()
        self.last: Manifest | None = None  # the newest checkpoint written or resumed from
        self.last_path: Path | None = None
        self.last_bytes = 0  # its size: what the next one is expected to need

    def due(self, iteration: int, requested: bool = False) -> bool:
        """Whether ``iteration`` ends a checkpoint: every ``--checkpoint-every``, or the
        feeder ``requested`` one (SubmitBatchRequest.checkpoint)."""
        every = is_checkpoint(iteration, self.config.every)
        return self.config.directory is not None and (requested or every)

    def clean_partial(self) -> None:
        """Remove checkpoints a previous run left half-written (no manifest), at start."""
        if self.config.directory is None:
            return
        for path in checkpoints.remove_partial(Path(self.config.directory)):
            log.warning("removed %s: a checkpoint left incomplete by an earlier run", path)

    def after_commit(
        self,
        iteration: int,
        samples_seen: int,
        loss: tuple[float, int] = (0.0, 0),
        requested: bool = False,
    ) -> Manifest | None:
        """Snapshot every shard at ``iteration`` (just committed) when it ends a checkpoint
        (``due``; ``loss``: the loss summed through it, and its samples);
        then keep the newest ``keep``. A failed snapshot is logged and counted, its partial
        folder removed, and training goes on: the previous checkpoint stays the newest good
        one. When the disk is short of the newest checkpoint's size, older checkpoints are
        removed first (never the newest good one)."""
        if not self.due(iteration, requested):
            return None
        assert self.config.directory is not None
        root = Path(self.config.directory)
        started = time.perf_counter()
        target = checkpoints.checkpoint_path(root, iteration)
        try:
            self._make_room(root)
            target = checkpoints.begin(root, iteration)
            rows = self.ps.save(str(target))
            tables = [
                {"name": name, "dim": stats.spec.dim, "rows": stats.rows}
                for name, stats in self.ps.list_tables().items()
            ]
            manifest = Manifest(
                iteration=iteration, num_shards=len(self.ps.addresses), mode=self.mode,
                workers=self.workers, tables=tables, rows=rows, samples_seen=samples_seen,
                loss_sum=loss[0], loss_samples=loss[1], fingerprint=self.config.fingerprint,
                seconds=time.perf_counter() - started,
            )  # fmt: skip
            checkpoints.publish(target, manifest)
        except (HeraldError, OSError) as exc:
            self._failed(iteration, target, exc)
            return None
        checkpoints.prune(root, self.config.keep)
        self.last, self.last_path = manifest, target
        self.last_bytes = checkpoints.size_bytes(target)
        self.metrics.written.inc()
        self.metrics.consecutive_failures.set(0)
        self.metrics.good(time.time(), self.last_bytes)
        self.metrics.free_bytes.set(checkpoints.free_bytes(root))
        log.info("checkpoint of iteration %d: %d rows, %d bytes in %.3f s at %s", iteration,
                 rows, self.last_bytes, manifest.seconds, target)  # fmt: skip
        return manifest

    def _make_room(self, root: Path) -> None:
        """Remove older checkpoints when the disk cannot hold another like the newest."""
        needed = int(self.last_bytes * ROOM_MARGIN)
        if not needed or checkpoints.free_bytes(root) >= needed:
            return
        for path in checkpoints.make_room(root, needed, self.last_path):
            self.metrics.pruned_for_space.inc()
            log.warning("removed checkpoint %s before writing the next: about %d bytes are "
                        "needed and the disk was short", path, needed)  # fmt: skip

    def _failed(self, iteration: int, target: Path, exc: BaseException) -> None:
        """Count and log a failed checkpoint, and remove what it left behind."""
        if not (target / checkpoints.MANIFEST).exists():  # published, then failed: keep it
            shutil.rmtree(target, ignore_errors=True)
        self.metrics.failed.inc()
        self.metrics.consecutive_failures.inc()
        if self.config.directory is not None:
            with contextlib.suppress(OSError):
                self.metrics.free_bytes.set(checkpoints.free_bytes(Path(self.config.directory)))
        newest = self.last.iteration if self.last else "none"
        log.error("checkpoint of iteration %d failed (%s); its partial folder was removed and "
                  "the newest good one stays %s", iteration, exc, newest)  # fmt: skip

    def resume(self) -> Manifest | None:
        """Load the newest checkpoint ``--resume-from`` names that verifies into the PS;
        None when there is none yet (the run starts at iteration 0).

        Verifies means: its manifest reads and every field has its type; the manifest, the
        folder's name, every shard's snapshot (committed iteration, shard count, tables) and
        this run (mode, workers, job fingerprint) agree; and every shard's Load checks
        (checksums, arrays) pass. All of it before any shard loads anything. A checkpoint
        that fails is skipped with a log line and a metric, and the next older one is
        tried; only when none verifies does the resume fail, naming each one and why."""
        if not self.config.resume_from:
            return None
        found = checkpoints.candidates(Path(self.config.resume_from))
        if not found:
            log.info("no complete checkpoint under %s: starting at iteration 0",
                     self.config.resume_from)  # fmt: skip
            return None
        skipped: list[str] = []
        for candidate in found:  # newest first
            reason, why = self._refusal(candidate)
            if not why:
                assert candidate.manifest is not None
                if skipped:
                    self.metrics.fallbacks.inc()
                    log.warning("falling back to checkpoint %d (%s): %d newer did not verify",
                                candidate.iteration, candidate.path, len(skipped))  # fmt: skip
                self.last, self.last_path = candidate.manifest, candidate.path
                self.last_bytes = checkpoints.size_bytes(candidate.path)
                with contextlib.suppress(OSError):
                    when = (candidate.path / checkpoints.MANIFEST).stat().st_mtime
                    self.metrics.good(when, self.last_bytes)
                return candidate.manifest
            self.metrics.skipped.labels(reason).inc()
            skipped.append(f"{candidate.path.name}: {why}")
            log.warning("checkpoint %d skipped (%s): %s", candidate.iteration, candidate.path,
                        why)  # fmt: skip
        where = self.config.resume_from
        raise FailedPrecondition(
            f"no checkpoint under {where!r} verifies ({'; '.join(skipped)}); restore one from "
            "a backup, or start the run without --resume-from"
        )

    def _refusal(self, candidate: checkpoints.Candidate) -> tuple[str, str]:
        """(metric reason, why) ``candidate`` cannot be resumed; ('', '') once it is loaded."""
        manifest = candidate.manifest
        if manifest is None:
            return candidate.reason, candidate.problem
        why = self._job_disagrees(manifest) or checkpoints.disagreement(candidate.path, manifest)
        if why:
            return "disagrees", why
        started = time.perf_counter()
        try:  # every shard checks it whole before any loads (Snapshots.load)
            self.ps.load(str(candidate.path))
        except (InvalidArgument, FailedPrecondition) as exc:
            if exc.reason == "SHARD_CLAIMED":  # another run holds the shards: no fallback
                raise
            return "damaged", exc.message
        loaded = self.ps.shard_committed_iterations()
        if any(it != manifest.iteration for it in loaded):
            return "disagrees", (f"the manifest says iteration {manifest.iteration}; the "
                                 f"shards loaded committed iterations {loaded}")  # fmt: skip
        log.info("resumed from %s: iteration %d committed, %d rows loaded in %.3f s; next "
                 "batch %d", candidate.path, manifest.iteration, manifest.rows,
                 time.perf_counter() - started, manifest.next_iteration)  # fmt: skip
        return "", ""

    def _job_disagrees(self, manifest: Manifest) -> str:
        """Why the checkpoint belongs to another job than this scheduler's ('' if it does not)."""
        wanted = self.config.fingerprint
        if wanted and manifest.fingerprint and manifest.fingerprint != wanted:
            return (
                f"it belongs to job {manifest.fingerprint}, not {wanted}: resume it with the "
                "job (data, model, optimizer, batch, mode) that wrote it"
            )
        if manifest.mode != self.mode:
            return f"it was written in mode {manifest.mode}; this scheduler runs {self.mode}"
        if manifest.workers != self.workers:  # the global batch, hence the data position
            return (
                f"it was written with {manifest.workers} workers; this scheduler runs "
                f"{self.workers}: start it with --workers {manifest.workers}"
            )
        return ""
