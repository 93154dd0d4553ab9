"""What the scheduler tells each worker per iteration (Herald's communication plan).

The plan type and its wire codec live in the common package: the scheduler
writes plans, workers read them, and neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from heraldps import wire
from heraldps.data.dataset import SparseDataset
from heraldps.optim import lr_scale_of
from heraldps.samples import decode_samples, encode_samples
from heraldps.v1 import scheduler_pb2

Keys = npt.NDArray[np.int64]

KEY_LISTS = (
    "samples", "evict", "pull", "update_local", "push_grads", "write_back", "pull_early",
    "push_later",
)  # fmt: skip


def sub_sequence_mask(keys: Keys, part: Keys) -> npt.NDArray[np.bool_] | None:
    """Which of ``keys`` are in ``part``, or None unless ``part`` is a sub-sequence of
    ``keys`` (its keys among them, in their order): the shape of ``pull_early`` within
    ``pull`` and of ``push_later`` within ``push_grads``."""
    mask = np.isin(keys, part)
    return mask if np.array_equal(keys[mask], part) else None


def _empty() -> Keys:
    return np.empty(0, dtype=np.int64)


def _no_leads() -> npt.NDArray[np.uint8]:
    return np.empty(0, dtype=np.uint8)


@dataclass
class CommPlan:
    """One worker's instructions for one iteration (Herald's communication plan).

    A worker executes, in order: evict ``evict``; pull ``pull`` (value, state,
    version) from the PS; train ``samples``; apply the optimizer locally to
    ``update_local`` (keys only this worker trains this iteration); push
    gradients of ``push_grads`` (keys several workers train; the PS sums
    them at commit); at the end of the iteration write back ``write_back``
    (value, state, version). Lists are in the order the mirror decided them
    (evict: eviction order; pull, update_local, push_grads: first occurrence
    in the global batch; write_back: ascending key); a worker matches gradient
    rows to keys by key, not by position. ``mini_batch`` holds
    the samples themselves, in ``samples`` order, when the feeder sent them.

    ``pull_early`` (mode ``herald_pipelined`` only) is a sub-sequence of ``pull``:
    keys nobody pushes or writes back in the previous iteration, so its commit
    leaves them as they are; a worker may fetch them while that iteration trains.
    ``pull_early_from`` (with ``--prefetch-plans`` above 1; empty means all 1) gives, for
    each key of ``pull_early``, how many iterations ahead it may be pulled: n when no
    iteration from ``iteration - n`` to ``iteration - 1`` changes it, so the worker may
    pull it while it trains ``iteration - n`` (iteration ``iteration - n - 1`` is
    committed by then, and nothing later changes the row before this plan runs).

    ``push_later`` is a sub-sequence of ``push_grads``: gradients the worker sends with
    its next plan, into the next iteration's buffer, off this iteration's critical path
    (pass-through rows nobody uses in the next iteration, when the next iteration
    applies the same learning rate; docs/scheduler.md#gradients-sent-later).
    """

    iteration: int
    worker: int
    samples: npt.NDArray[np.int64] = field(default_factory=_empty)
    evict: Keys = field(default_factory=_empty)
    pull: Keys = field(default_factory=_empty)
    update_local: Keys = field(default_factory=_empty)
    push_grads: Keys = field(default_factory=_empty)
    write_back: Keys = field(default_factory=_empty)
    pull_early: Keys = field(default_factory=_empty)
    push_later: Keys = field(default_factory=_empty)
    pull_early_from: npt.NDArray[np.uint8] = field(default_factory=_no_leads)
    final_flush: bool = False  # after this iteration, write back every dirty row
    checkpoint: bool = False  # the iteration ends a checkpoint: store the dense replica too
    # Multiplies every optimizer's lr in this iteration (SubmitBatchRequest.lr_scale).
    lr_scale: float = 1.0
    mini_batch: SparseDataset | None = None

    @property
    def stores_dense(self) -> bool:
        """Whether the worker's dense update of this iteration must finish and reach the PS
        before it reports: at the end of training and at a checkpoint."""
        return self.final_flush or self.checkpoint

    def state_wanted(self, keys: Keys) -> npt.NDArray[np.bool_]:
        """Which of ``keys`` (pulls of this plan) need their optimizer state: the rows the
        worker updates itself. A row it only pushes a gradient for is changed by the
        iteration's commit, so its cached copy is stale before anything there could update
        it (the scheduler plans a pull, with state if needed, before any later use); its
        state stays on the PS and only the value travels."""
        return np.isin(keys, self.update_local)

    def same_as(self, other: CommPlan) -> bool:
        """Equal field by field (arrays compared by value and order)."""
        if (self.iteration, self.worker) != (other.iteration, other.worker):
            return False
        return all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in (*KEY_LISTS, "pull_early_from")
        )

    def early_leads(self) -> npt.NDArray[np.int64]:
        """For each key of ``pull_early``, how many iterations before this plan's the
        worker may pull it (``pull_early_from``, 1 for every key when that is empty)."""
        if not self.pull_early_from.shape[0]:
            return np.ones(self.pull_early.shape[0], dtype=np.int64)
        return self.pull_early_from.astype(np.int64)


def plan_to_proto(plan: CommPlan, table: str) -> scheduler_pb2.CommPlan:
    msg = scheduler_pb2.CommPlan(
        iteration=plan.iteration,
        worker_id=plan.worker,
        table=table,
        final_flush=plan.final_flush,
        checkpoint=plan.checkpoint,
        lr_scale=plan.lr_scale,
    )
    for name in KEY_LISTS:
        setattr(msg, name, wire.encode_keys(getattr(plan, name)))
    msg.pull_early_from = np.ascontiguousarray(plan.pull_early_from, dtype=np.uint8).tobytes()
    if plan.mini_batch is not None:
        msg.mini_batch.CopyFrom(encode_samples(plan.mini_batch))
    return msg


def plan_from_proto(msg: scheduler_pb2.CommPlan) -> CommPlan:
    """Decode a plan; malformed lists or samples raise ``InvalidArgument`` naming the field."""
    plan = CommPlan(
        iteration=msg.iteration,
        worker=msg.worker_id,
        final_flush=msg.final_flush,
        checkpoint=msg.checkpoint,
        lr_scale=lr_scale_of(msg.lr_scale),
    )
    for name in KEY_LISTS:
        setattr(plan, name, wire.decode_keys(getattr(msg, name), name))
    plan.pull_early_from = np.frombuffer(msg.pull_early_from, dtype=np.uint8)
    if msg.HasField("mini_batch"):
        plan.mini_batch = decode_samples(msg.mini_batch, "mini_batch")
    return plan
