"""Where a worker's iteration goes: wall time per phase, summed over the iteration.

Phases (seconds, per iteration):

- ``plan_wait``: blocked on the plan stream (the other workers and the previous commit); in
  ``herald_pipelined`` the plan is at hand and the worker waits for the commit inside
  ``ReportDone`` instead, which the scheduler says (``commit_wait_seconds``) and is counted here;
- ``pull``: embedding pulls (HET's version checks too);
- ``dense_pull``: the dense table from the PS (``--dense-sync ps`` only);
- ``compute``: the model's forward and backward pass (with batch normalization, less its
  statistics' waits for the other workers, which are ``peer_wait``);
- ``optimizer``: the optimizer applied in the cache (rows this worker owns, HET's local steps);
- ``push``: embedding gradient pushes (HET); in the plan modes, blocked on all sends of the
  iteration, which leave together: gradients, write-backs (final flush included) and the dense
  gradient;
- ``write_back``: write-backs sent on their own. No step does that today (the plan modes send
  them with their pushes, HET writes nothing back), so it stays 0;
- ``dense_push``: the dense gradient sent on its own (HET, ``--dense-sync ps``): pushed to the
  PS; with the all-reduce, which runs on in the background after the iteration's sends, the wait
  for it before the next forward pass (the final flush's: where it runs);
- ``peer_wait``: the all-reduce waiting for the other workers' parts. The all-reduce is a
  barrier among workers, so a worker that finished first waits here (as it waits in
  ``plan_wait`` under ``--dense-sync ps``); the transfer of the peers' parts is in here too;
  so are batch normalization's statistics exchanges (two per hidden layer, inside the forward
  and backward pass: each is a barrier too);
- ``report``: the ``ReportDone`` call (for the last reporter, the commit on every shard), less
  its wait for the commit.

:data:`RPC_PHASES` are spent in RPCs: their share of the iteration is the network's.
Overlapped work (pipelining) counts only where the worker blocks on it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

PHASES = ("plan_wait", "pull", "dense_pull", "compute", "optimizer", "push", "write_back",
          "dense_push", "peer_wait", "report")  # fmt: skip
RPC_PHASES = ("pull", "dense_pull", "push", "write_back", "dense_push", "report")


class PhaseTimer:
    """Accumulates ``with timer("phase"):`` blocks until ``take`` hands them over."""

    def __init__(self) -> None:
        self._seconds = dict.fromkeys(PHASES, 0.0)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[phase] += time.perf_counter() - started

    def add(self, phase: str, seconds: float) -> None:
        self._seconds[phase] += seconds

    def add_blocked(self, phase: str, seconds: float, peer_wait: float) -> None:
        """``seconds`` blocked in ``phase``, of which ``peer_wait`` (capped at ``seconds``)
        went to waiting for the other workers' all-reduce parts: that part is ``peer_wait``."""
        peer_wait = min(max(peer_wait, 0.0), seconds)
        self._seconds[phase] += seconds - peer_wait
        self._seconds["peer_wait"] += peer_wait

    def take(self) -> dict[str, float]:
        """This iteration's seconds per phase; the timer starts over."""
        seconds, self._seconds = self._seconds, dict.fromkeys(PHASES, 0.0)
        return seconds


def network_share(phases: dict[str, float]) -> float:
    """Fraction of the iteration spent in RPCs (0 for an empty iteration)."""
    total = sum(phases.values())
    return sum(phases.get(p, 0.0) for p in RPC_PHASES) / total if total > 0 else 0.0
