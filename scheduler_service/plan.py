"""What the scheduler tells each worker per iteration, and the traffic it counts."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Keys = npt.NDArray[np.int64]


def _empty() -> Keys:
    return np.empty(0, dtype=np.int64)


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
    in the worker's mini-batch; write_back: ascending key).
    """

    iteration: int
    worker: int
    samples: npt.NDArray[np.int64] = field(default_factory=_empty)
    evict: Keys = field(default_factory=_empty)
    pull: Keys = field(default_factory=_empty)
    update_local: Keys = field(default_factory=_empty)
    push_grads: Keys = field(default_factory=_empty)
    write_back: Keys = field(default_factory=_empty)
    final_flush: bool = False  # after this iteration, write back every dirty row

    def same_as(self, other: CommPlan) -> bool:
        """Equal field by field (arrays compared by value and order)."""
        if (self.iteration, self.worker) != (other.iteration, other.worker):
            return False
        return all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in ("samples", "evict", "pull", "update_local", "push_grads", "write_back")
        )


@dataclass
class TrafficCounts:
    """Rows moved, one per row per direction (the counting model of the README).

    ``pushes`` counts gradient pushes plus write-backs (eviction write-backs
    included); ``final_flush`` counts the write-backs of rows still dirty
    when training ends, kept apart as the Herald paper's Table 1 does.
    ``held_samples`` / ``local_samples``: assignment locality (see
    :class:`scheduler_service.scheduler.Assignment`).
    """

    pulls: int = 0
    pushes: int = 0
    grad_pushes: int = 0
    write_backs: int = 0
    final_flush: int = 0
    evictions: int = 0
    hits: int = 0
    iterations: int = 0
    held_samples: int = 0
    local_samples: int = 0

    def add_plan(self, plan: CommPlan) -> None:
        self.pulls += int(plan.pull.shape[0])
        self.grad_pushes += int(plan.push_grads.shape[0])
        self.write_backs += int(plan.write_back.shape[0])
        self.pushes += int(plan.push_grads.shape[0] + plan.write_back.shape[0])
        self.evictions += int(plan.evict.shape[0])
