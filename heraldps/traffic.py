"""Embedding rows moved between workers and the PS, in one counting type.

The scheduler counts what its plans will move, a worker counts what its RPCs
moved, and the two must agree row for row; both use :class:`Traffic`, and the
wire form (``heraldps.v1.TrafficCounters``) is converted here only.

Counting model: one row in one direction counts 1. ``pushes`` is gradient
pushes plus write-backs (eviction write-backs included); ``final_flush``
counts what leaves the caches when training ends, kept apart as the Herald
paper's Table 1 does.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from heraldps.v1 import scheduler_pb2

if TYPE_CHECKING:
    from heraldps.plan import CommPlan


@dataclass
class Traffic:
    """Rows moved (and the bookkeeping around them) over some iterations.

    - ``pulls``, ``grad_pushes``, ``write_backs``: rows per direction.
    - ``final_flush``: rows written back (plan modes) or gradients pushed (HET) by the
      final flush, not part of the three counts above.
    - ``version_checks``: keys whose PS clock a HET worker read (CheckValid), no rows.
    - ``hits``: trained rows found usable in a cache (no pull).
    - ``evictions``: rows dropped from caches by plans.
    - ``stale`` (HET): cached rows whose CheckValid failed, refetched (part of ``pulls``);
      ``bound_releases`` (HET): rows that reached the staleness bound, so their gradients
      were pushed (part of ``grad_pushes``) and the row released.
    - ``iterations``, ``held_samples``, ``local_samples``: the scheduler's assignment
      locality (see :class:`scheduler_service.scheduler.Assignment`).
    - ``sample_bytes``: bytes of the training samples that arrived with the plans (keys,
      fields, dense features, labels): the price of workers never reading the data.
    - ``dense_bytes``: bytes of dense parameters a worker sent and received (the dense
      table through the PS, or its all-reduce parts and checkpoints).
    - ``early_pulls`` (``herald_pipelined``): pulls the plans mark early (scheduler) or that
      a worker fetched while the previous iteration still trained (worker); part of
      ``pulls``.
    - ``state_pulls``: pulls whose optimizer state came along (part of ``pulls``): in the
      plan modes the rows a worker updates itself, the others travel as values alone
      (``CommPlan.state_wanted``); in HET every pull.
    """

    pulls: int = 0
    grad_pushes: int = 0
    write_backs: int = 0
    final_flush: int = 0
    version_checks: int = 0
    hits: int = 0
    evictions: int = 0
    stale: int = 0
    bound_releases: int = 0
    iterations: int = 0
    held_samples: int = 0
    local_samples: int = 0
    sample_bytes: int = 0
    dense_bytes: int = 0
    early_pulls: int = 0
    state_pulls: int = 0

    @property
    def pushes(self) -> int:
        """Gradient pushes plus write-backs: Table 1's "push" column."""
        return self.grad_pushes + self.write_backs

    def add_plan(self, plan: CommPlan) -> None:
        """Count the rows a released plan moves."""
        self.pulls += int(plan.pull.shape[0])
        self.early_pulls += int(plan.pull_early.shape[0])
        self.state_pulls += int(np.count_nonzero(plan.state_wanted(plan.pull)))
        self.grad_pushes += int(plan.push_grads.shape[0])
        self.write_backs += int(plan.write_back.shape[0])
        self.evictions += int(plan.evict.shape[0])

    def add(self, other: Traffic) -> None:
        """Add every count of ``other`` to this one."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_proto(self) -> scheduler_pb2.TrafficCounters:
        """What a worker reports with ``ReportDone``: the :data:`REPORTED` counts."""
        return scheduler_pb2.TrafficCounters(
            **{wire: getattr(self, name) for name, wire in REPORTED.items()}
        )

    @classmethod
    def from_proto(cls, counters: scheduler_pb2.TrafficCounters) -> Traffic:
        return cls(**{name: getattr(counters, wire) for name, wire in REPORTED.items()})


# The counts a worker reports (``TrafficCounters``), by Traffic field -> wire field.
REPORTED = {
    "pulls": "pulled_rows",
    "grad_pushes": "pushed_gradient_rows",
    "write_backs": "written_back_rows",
    "final_flush": "final_flush_rows",
    "version_checks": "version_checks",
    "hits": "cache_hits",
    "sample_bytes": "sample_bytes",
    "dense_bytes": "dense_bytes",
    "early_pulls": "early_pulls",
    "state_pulls": "state_pulls",
}
