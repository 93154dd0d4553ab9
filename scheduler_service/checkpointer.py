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

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from heraldps import checkpoints
from heraldps.checkpoints import Manifest
from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition, HeraldError
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


class Checkpointer:
    """Writes checkpoints of one run and resumes from them."""

    def __init__(self, config: CheckpointConfig, ps: PSClient, mode: str, workers: int) -> None:
        self.config, self.ps, self.mode, self.workers = config, ps, mode, workers
        self.last: Manifest | None = None  # the newest checkpoint written or resumed from

    def due(self, iteration: int) -> bool:
        return self.config.directory is not None and is_checkpoint(iteration, self.config.every)

    def after_commit(self, iteration: int, samples_seen: int) -> Manifest | None:
        """Snapshot every shard at ``iteration`` (just committed) when it ends a checkpoint;
        then keep the newest ``keep``. A failed snapshot is logged and training goes on: the
        previous checkpoint stays the newest complete one."""
        if not self.due(iteration):
            return None
        assert self.config.directory is not None
        root = Path(self.config.directory)
        started = time.perf_counter()
        try:
            target = checkpoints.begin(root, iteration)
            rows = self.ps.save(str(target))
            tables = [
                {"name": name, "dim": stats.spec.dim, "rows": stats.rows}
                for name, stats in self.ps.list_tables().items()
            ]
            manifest = Manifest(
                iteration=iteration, num_shards=len(self.ps.addresses), mode=self.mode,
                workers=self.workers, tables=tables, rows=rows, samples_seen=samples_seen,
                fingerprint=self.config.fingerprint, seconds=time.perf_counter() - started,
            )  # fmt: skip
            checkpoints.publish(target, manifest)
        except (HeraldError, OSError) as exc:
            newest = self.last.iteration if self.last else "none"
            log.error("checkpoint of iteration %d failed (%s); the newest complete one stays "
                      "%s", iteration, exc, newest)  # fmt: skip
            return None
        checkpoints.prune(root, self.config.keep)
        self.last = manifest
        log.info("checkpoint of iteration %d: %d rows in %.3f s at %s", iteration, rows,
                 manifest.seconds, target)  # fmt: skip
        return manifest

    def resume(self) -> Manifest | None:
        """Load the checkpoint ``--resume-from`` names (or the newest under it) into the PS;
        None when there is none yet (the run starts at iteration 0)."""
        if not self.config.resume_from:
            return None
        found = checkpoints.resolve(Path(self.config.resume_from))
        if found is None:
            log.info("no complete checkpoint under %s: starting at iteration 0",
                     self.config.resume_from)  # fmt: skip
            return None
        path, manifest = found
        wanted = self.config.fingerprint
        if wanted and manifest.fingerprint and manifest.fingerprint != wanted:
            raise FailedPrecondition(
                f"checkpoint {str(path)!r} belongs to job {manifest.fingerprint}, not "
                f"{wanted}: resume it with the job (data, model, optimizer, batch, mode) that "
                "wrote it, or point --resume-from elsewhere"
            )
        if manifest.workers != self.workers:  # the global batch, hence the data position
            raise FailedPrecondition(
                f"checkpoint {str(path)!r} was written with {manifest.workers} workers; this "
                f"scheduler runs {self.workers}: start it with --workers {manifest.workers}"
            )
        started = time.perf_counter()
        self.ps.load(str(path))
        self.last = manifest
        log.info("resumed from %s: iteration %d committed, %d rows loaded in %.3f s; next "
                 "batch %d", path, manifest.iteration, manifest.rows,
                 time.perf_counter() - started, manifest.next_iteration)  # fmt: skip
        return manifest
