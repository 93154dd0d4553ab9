"""How a worker moves the dense parameters (the MLP): through the PS, or by all-reduce.

``ps``: pull the dense table before every iteration and push its gradient
after; the PS sums the workers' gradients and applies the optimizer at the
commit. Every worker's link carries the whole dense model twice per
iteration, and the PS's link N times that.

``allreduce`` (the default): every worker keeps a replica (values and optimizer
state, in the dense table's row layout), sums the gradients with the other
workers (:class:`~worker_client.collective.AllReduce`) and applies the same
optimizer function the PS would, so the replicas equal each other and the
model the PS path trains. Worker 0 writes its replica to the PS dense table
every ``dense_checkpoint_every`` iterations and with the final flush, so
snapshots, serving and evaluation read the dense model from the PS as before.

Batch normalization needs the all-reduce: its statistics are summed over the
workers of each global batch (:meth:`DenseSync.batch_sum`, stream 1 of the
collective), and its running statistics, which take no gradient, are written
over each update (:meth:`DenseSync.hold_running`), the same bits on every
replica. The PS path has no worker-to-worker collective: a job refuses
``batch_norm`` with ``dense_sync="ps"``.
"""

from __future__ import annotations

import abc
import concurrent.futures
from concurrent.futures import Future

import numpy as np
import numpy.typing as npt

from heraldps.batch_norm import BatchSum
from heraldps.client import DenseParameter, PSClient
from heraldps.errors import FailedPrecondition
from heraldps.model import RunningStats
from heraldps.optim import Optimizer, scaled
from worker_client.collective import AllReduce, BatchSums
from worker_client.sends import Sends

Floats = npt.NDArray[np.float32]


class DenseSync(abc.ABC):
    """The dense parameters of one worker: read them, update them with a gradient."""

    bytes_moved = 0  # payload bytes of dense parameters sent and received so far
    wait_seconds = 0.0  # blocked on other workers (the all-reduce is a barrier) so far
    statistics_wait_seconds = 0.0  # blocked on other workers' batch-norm statistics so far

    @abc.abstractmethod
    def values(self) -> Floats:
        """The dense parameters to train iteration t with (after t-1's update)."""

    @abc.abstractmethod
    def update(self, grad: Floats, iteration: int, final: bool, lr_scale: float = 1.0) -> None:
        """Apply this worker's share of iteration ``iteration``'s dense gradient, with the
        optimizer's lr times ``lr_scale`` (the iteration's plan's)."""

    def overlaps(self, final: bool) -> bool:
        """Whether :meth:`start_update` leaves the update running (here: never; a push to
        the PS must arrive before the iteration's commit, which applies it)."""
        return False

    def start_update(
        self, grad: Floats, iteration: int, final: bool, lr_scale: float = 1.0
    ) -> None:
        """Start the update; it may run on until :meth:`settle` (see :meth:`overlaps`)."""
        self.update(grad, iteration, final, lr_scale)

    def running(self) -> Future[None] | None:
        """The update still running in the background, if any (here: never)."""
        return None

    def settle(self) -> None:  # noqa: B027 (nothing runs on here)
        """Wait for a started update to finish; raise its error."""

    def close(self) -> None:  # noqa: B027 (most syncs hold nothing to release)
        """Release connections."""

    def batch_sum(self, iteration: int) -> BatchSum | None:
        """The batch-norm statistics' reducer of iteration ``iteration`` (None: none)."""
        return None

    def hold_running(self, running: RunningStats | None) -> None:
        """Running statistics (batch norm) to write over the next update's result."""
        if running is not None:
            raise FailedPrecondition(
                "batch normalization needs the dense all-reduce (--dense-sync allreduce)"
            )


class PSDense(DenseSync):
    """Pull before each iteration, push the gradient after; the PS applies it at commit."""

    def __init__(self, ps: PSClient, param: DenseParameter, worker: int = 0) -> None:
        self.ps, self.param, self.worker = ps, param, worker
        self.bytes_moved = 0

    def values(self) -> Floats:
        values = self.ps.pull_dense(self.param)
        p = self.param  # keys out; values and versions back
        self.bytes_moved += p.rows * (8 + 8 + 4 * p.row_width)
        return values

    def update(self, grad: Floats, iteration: int, final: bool, lr_scale: float = 1.0) -> None:
        """Push the gradient; the PS applies it at the commit, which carries ``lr_scale``."""
        self.ps.push_dense_gradients(self.param, grad, iteration, self.worker)
        self.bytes_moved += self.param.rows * (8 + 4 * self.param.row_width)


class AllReduceDense(DenseSync):
    """A dense replica updated from all-reduced gradients; worker 0 checkpoints it to the PS."""

    def __init__(
        self,
        ps: PSClient,
        param: DenseParameter,
        optimizer: Optimizer,
        all_reduce: AllReduce,
        checkpoint_every: int,
        batch_sums: BatchSums | None = None,
    ) -> None:
        self.ps, self.param, self.optimizer = ps, param, optimizer
        self.all_reduce = all_reduce
        self.checkpoint_every = checkpoint_every
        self.batch_sums = batch_sums  # batch norm's statistics (None: the model has none)
        self._running: RunningStats | None = None  # written over the next update
        self._rows: Floats | None = None  # read from the PS at the first iteration
        self._state: Floats = np.empty(0, np.float32)
        self._versions = np.empty(0, np.int64)
        self._written = self._versions  # the versions the PS holds
        self._ps_bytes = 0
        self._pending: Future[None] | None = None  # an update running in the background

    def _replica(self) -> Floats:
        """The replica's value rows, read from the PS dense table on first use (its initial
        values, or where a restored snapshot left it): the table exists once plans flow."""
        if self._rows is None:
            rows, versions, state = self.ps.pull_with_state(self.param.name, self.param.keys)
            self._rows = np.ascontiguousarray(rows, dtype=np.float32)
            self._state = np.ascontiguousarray(state, dtype=np.float32)
            self._versions = versions.astype(np.int64)
            self._written = self._versions.copy()
            self._ps_bytes += self._rows.nbytes + self._state.nbytes + 16 * self.param.rows
        return self._rows

    @property
    def bytes_moved(self) -> int:  # type: ignore[override]
        return self.all_reduce.bytes_moved + self._ps_bytes

    @property
    def wait_seconds(self) -> float:  # type: ignore[override]
        return self.all_reduce.wait_seconds

    @property
    def statistics_wait_seconds(self) -> float:  # type: ignore[override]
        return self.batch_sums.all_reduce.wait_seconds if self.batch_sums else 0.0

    def values(self) -> Floats:
        self.settle()
        return self.param.from_rows(self._replica())

    def overlaps(self, final: bool) -> bool:
        """Every update but the final one runs on in the background: nothing but the
        next forward pass needs it, not the commit, the plan or the next pulls. The final one
        finishes (and is written to the PS) before the run ends."""
        return not final

    def start_update(
        self, grad: Floats, iteration: int, final: bool, lr_scale: float = 1.0
    ) -> None:
        self.settle()
        if not self.overlaps(final):
            self.update(grad, iteration, final, lr_scale)
            return
        self._pending = Sends.in_thread(self.update, grad, iteration, final, lr_scale)

    def running(self) -> Future[None] | None:
        return self._pending

    def settle(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def batch_sum(self, iteration: int) -> BatchSum | None:
        """Sums over the workers (stream 1 of the collective); None without batch norm, or
        for a lone worker, which holds the whole batch."""
        if self.batch_sums is None or self.all_reduce.workers == 1:
            return None
        return self.batch_sums.for_iteration(iteration)

    def hold_running(self, running: RunningStats | None) -> None:
        self._running = running

    def update(self, grad: Floats, iteration: int, final: bool, lr_scale: float = 1.0) -> None:
        total = self.all_reduce.sum(np.asarray(grad, dtype=np.float32), iteration)
        optimizer = scaled(self.optimizer, lr_scale)
        optimizer.apply(self._replica(), self._state, self.param.to_rows(total))
        running, self._running = self._running, None
        if running is not None:  # buffers, not trained: no optimizer (or decay) moves them
            running.write_into(self._replica())
        self._versions += 1  # one commit's worth, as the PS would count it
        due = self.checkpoint_every > 0 and (iteration + 1) % self.checkpoint_every == 0
        if self.all_reduce.rank == 0 and (final or due):
            self.write_to_ps()

    def write_to_ps(self) -> None:
        """Store the replica in the PS dense table (version-guarded, as any write-back)."""
        p, rows = self.param, self._replica()
        self.ps.write_back(p.name, p.keys, rows, self._state, self._written, self._versions)
        self._written = self._versions.copy()
        self._ps_bytes += rows.nbytes + self._state.nbytes + 24 * p.rows

    def replica(self) -> tuple[Floats, Floats]:
        """(values rows, optimizer state) of this worker's replica; for tests and checks."""
        return self._replica().copy(), self._state.copy()

    def close(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
            concurrent.futures.wait([pending])
        self.all_reduce.close()
        if self.batch_sums is not None:
            self.batch_sums.close()
