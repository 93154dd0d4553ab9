"""What ``heraldps train`` knows of a run beyond the model: the epochs' figures, the
validations within epochs and the loss counters at each epoch's end (``OUT/train-state.json``).

The model lives in the checkpoints (``OUT/checkpoints``, written by the scheduler); this
file is the launcher's half. It is written whole (atomically) after every epoch's end
and every validation within an epoch, so it always covers at least the newest checkpoint.
A resume from checkpoint t first rewinds it to t: the epochs that ended after t and the
validations after t are dropped, and the schedule's state (best value, epochs without
improvement, learning-rate scale) is replayed from the epochs left, by the same rule
that produced it. So the run goes on exactly as if it had never stopped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heraldps import checkpoints
from heraldps.job_file import Schedule

FORMAT = "heraldps-train-state"
FILE = "train-state.json"


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


def better(monitor: str, value: float, best: float | None) -> bool:
    """Whether ``value`` of ``monitor`` improves on ``best`` (None: nothing yet)."""
    if not np.isfinite(value):
        return False
    if best is None:
        return True
    return value > best if monitor == "auc" else value < best


@dataclass
class Plateau:
    """The schedule's rule, epoch by epoch: keep the best value; after ``lr_patience``
    epochs without improvement scale the learning rate by ``lr_decay``; stop after
    ``patience``. An improvement resets both counts."""

    schedule: Schedule
    best: float | None = None
    since_best: int = 0
    since_decay: int = 0
    scale: float = 1.0  # the learning-rate multiplier of the next epoch

    def observe(self, value: float) -> bool:
        """One epoch's monitored ``value``; whether it improved."""
        s = self.schedule
        if better(s.monitor, value, self.best):
            self.best, self.since_best, self.since_decay = value, 0, 0
            return True
        self.since_best += 1
        self.since_decay += 1
        if s.lr_decay < 1 and self.since_decay >= s.lr_patience:
            self.scale *= s.lr_decay
            self.since_decay = 0
        return False

    @property
    def stopped(self) -> bool:
        return self.since_best >= self.schedule.patience


@dataclass
class TrainState:
    """The launcher's state of one run, by job ``fingerprint``."""

    fingerprint: str
    epochs: list[Epoch] = field(default_factory=list)
    # The scheduler's committed_loss_sum and committed_samples at each epoch's end: the
    # next epoch's mean loss is the difference (they go on across a resume).
    loss_at_end: list[tuple[float, int]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)  # within epochs (eval_every)

    def save(self, out: Path) -> None:
        body = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "epochs": [asdict(e) for e in self.epochs],
            "loss_at_end": [list(x) for x in self.loss_at_end],
            "evals": self.evals,
        }
        checkpoints.write_durably(out / FILE, json.dumps(body, indent=1) + "\n")

    @classmethod
    def load(cls, out: Path) -> TrainState | None:
        """The state ``out`` holds; None without one."""
        try:
            raw: dict[str, Any] = json.loads((out / FILE).read_text())
        except FileNotFoundError:
            return None
        if raw.get("format") != FORMAT:
            raise ValueError(f"{out / FILE} is not a {FORMAT} file")
        return cls(
            raw["fingerprint"],
            [Epoch(**e) for e in raw["epochs"]],
            [(float(s), int(n)) for s, n in raw["loss_at_end"]],
            list(raw["evals"]),
        )

    def rewind(self, next_batch: int, per_epoch: int) -> None:
        """Keep what the run knew once batch ``next_batch - 1`` was committed: the epochs
        ending by then, the validations up to it."""
        whole = next_batch // per_epoch
        del self.epochs[whole:], self.loss_at_end[whole:]
        self.evals = [e for e in self.evals if e["iteration"] < next_batch]

    def replay(self, schedule: Schedule, monitored: list[float]) -> Plateau:
        """The schedule's state after the recorded epochs (``monitored``: each one's value)."""
        plateau = Plateau(schedule)
        for value in monitored:
            plateau.observe(value)
        return plateau

    @property
    def best_epoch(self) -> int:
        improved = [e.epoch for e in self.epochs if e.improved]
        return improved[-1] if improved else 0
