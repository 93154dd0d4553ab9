"""One iteration of one worker, behind one interface: Herald plan execution or HET.

The worker learns its mode when it registers and picks the step once
(:func:`worker_client.worker.make_step`); every iteration then calls ``step.run(plan)``. Both steps
share what a worker owns: the embedding cache, the model, the dense
parameters and the PS connection, and return the rows they moved
(:class:`~heraldps.traffic.Traffic`) and the summed loss.

Dense parameters move through a :class:`~worker_client.dense_sync.DenseSync`:
all-reduced among the workers (the default) or pulled from and pushed to the
PS every iteration. An all-reduce runs on in the background until the next
forward pass needs its result.
"""

from __future__ import annotations

import abc
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.arrays import to_host
from heraldps.client import PSClient
from heraldps.errors import FailedPrecondition
from heraldps.job import TrainingJob
from heraldps.plan import CommPlan
from heraldps.traffic import Traffic
from worker_client.cache import EmbeddingCache
from worker_client.dense_sync import DenseSync, PSDense
from worker_client.minibatch import MiniBatch, select
from worker_client.timing import PhaseTimer


class MissingSamples(FailedPrecondition):
    """A plan carries no samples, or samples of another shape than the job's model."""


class Step(abc.ABC):
    """A worker's cache, model and PS connection; ``run`` trains one iteration."""

    def __init__(
        self,
        job: TrainingJob,
        worker: int,
        ps: PSClient,
        cache_rows: int,
        xp: Any = np,
        dense: DenseSync | None = None,
    ) -> None:
        self.job = job
        self.worker = worker
        self.ps = ps
        self.xp = xp
        self.model = job.model(xp)
        self.optimizer = job.make_optimizer()
        self.dense = dense or PSDense(ps, job.dense_parameter(self.model.dense_size), worker)
        self.timer = PhaseTimer()
        self._dense_waited = self.dense.wait_seconds  # peer wait counted up to here
        self.cache = EmbeddingCache(
            cache_rows,
            job.embedding_dim,
            self.optimizer.state_width(job.embedding_dim),
            job.policy,
            xp,
        )

    @abc.abstractmethod
    def run(self, plan: CommPlan) -> tuple[Traffic, float]:
        """Train ``plan``'s samples and move the rows the mode asks for; (traffic, loss sum)."""

    # ----- shared pieces ---------------------------------------------------------------
    def mini_batch(self, plan: CommPlan) -> MiniBatch:
        """The plan's samples laid out for the model; refuses plans without samples."""
        samples = plan.mini_batch
        if samples is None:
            raise MissingSamples(
                f"the plan of iteration {plan.iteration} carries no samples: the feeder "
                "submitted keys only; submit whole samples (SubmitBatchRequest.batch, as "
                "heraldps feed does)"
            )
        if samples.rows != plan.samples.shape[0]:
            raise MissingSamples(
                f"the plan of iteration {plan.iteration} names {plan.samples.shape[0]} samples "
                f"but carries {samples.rows}"
            )
        c = self.model.config
        if (len(samples.sparse_columns), len(samples.dense_columns)) != (c.num_fields, c.num_dense):
            raise MissingSamples(
                f"the samples have {len(samples.sparse_columns)} sparse and "
                f"{len(samples.dense_columns)} dense columns, but the job's model has "
                f"{c.num_fields} and {c.num_dense}: the feeder and the workers run different jobs"
            )
        return select(samples)

    def train(
        self, mb: MiniBatch, slots: npt.NDArray[np.int64], plan: CommPlan
    ) -> tuple[float, Any, Any]:
        """(loss sum, embedding gradients [rows], dense gradient) of ``plan``'s mini-batch on
        the cached rows ``slots`` (one per key of ``mb.keys``); gradients stay on the device.
        Dropout masks are drawn from the samples' global indices (iteration x global batch +
        index in the global batch), so they do not depend on which worker trains a sample."""
        xp = self.xp
        sample_ids = None
        if self.job.dropout > 0:
            sample_ids = xp.asarray(plan.iteration * self.job.global_batch + plan.samples)
        self.settle_dense()
        with self.timer("dense_pull"):  # all-reduce: a copy of the replica
            dense = xp.asarray(self.dense.values())
        batch_sum = self.dense.batch_sum(plan.iteration)
        if batch_sum is None and self.model.reductions_per_step and self.job.workers > 1:
            raise FailedPrecondition(
                "batch normalization needs the batch statistics' all-reduce among the "
                "workers: train with --dense-sync allreduce"
            )
        # compute, less the batch-norm statistics' waits for the other workers (peer_wait)
        waited, started = self.dense.statistics_wait_seconds, time.perf_counter()
        try:
            emb = self.cache.gather(slots)
            out = self.model.forward_backward(
                dense,
                emb,
                xp.asarray(mb.field_rows),
                xp.asarray(mb.dense),
                xp.asarray(mb.labels),
                loss_scale=float(self.job.global_batch),
                sample_ids=sample_ids,
                batch_sum=batch_sum,
            )
        finally:
            self.timer.add_blocked("compute", time.perf_counter() - started,
                                   self.dense.statistics_wait_seconds - waited)  # fmt: skip
        self.dense.hold_running(out.running)  # written over this gradient's update
        return out.loss_sum, out.emb_grad, out.dense_grad

    def push_dense(
        self, dense_grad: Any, iteration: int, final: bool = False, lr_scale: float = 1.0
    ) -> None:
        """Hand the dense gradient to the dense sync (all-reduce and apply, or push); an
        all-reduce runs on in the background (:meth:`start_dense`)."""
        if self.dense.overlaps(final):
            self.start_dense(to_host(dense_grad), iteration, final, lr_scale)
            return
        waited, started = self.dense.wait_seconds, time.perf_counter()
        self.dense.update(to_host(dense_grad), iteration, final, lr_scale)
        self.timer.add_blocked("dense_push", time.perf_counter() - started,
                               self.dense.wait_seconds - waited)  # fmt: skip

    def start_dense(
        self, grad: npt.NDArray[np.float32], iteration: int, final: bool, lr_scale: float = 1.0
    ) -> None:
        """Start the dense update and leave it running: the report, the wait for the next
        plan and the next pulls need none of it; :meth:`settle_dense` waits for it."""
        self._dense_waited = self.dense.wait_seconds
        self.dense.start_update(grad, iteration, final, lr_scale)

    def settle_dense(self) -> None:
        """Before a forward pass: wait for the dense update still running, counted as
        ``dense_push`` less the all-reduce's wait for its peers."""
        started = time.perf_counter()
        self.dense.settle()
        self.timer.add_blocked("dense_push", time.perf_counter() - started,
                               self.dense.wait_seconds - self._dense_waited)  # fmt: skip
        self._dense_waited = self.dense.wait_seconds
