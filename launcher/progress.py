"""Progress of ``heraldps local``: bars on a terminal, plain lines everywhere else.

CI logs and ``| tee`` get no cursor tricks, so a live bar prints nothing there
for a minute; off a terminal every mode prints one line per ``every``
iterations (and one when it ends) instead.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from launcher.local import ModeResult


def _so_far(rate: float, so_far: dict[str, float]) -> str:
    return (
        f"{rate:,.0f} samples/s  loss {so_far['loss']:.4f}  pulled {int(so_far['pulls']):,}  "
        f"pushed {int(so_far['pushes']):,}"
    )


class ProgressDisplay(abc.ABC):
    """What the launcher reports while modes train (``launcher.local.Progress``)."""

    @abc.abstractmethod
    def update(self, mode: str, done: int, total: int, so_far: dict[str, float]) -> None:
        """``done`` of ``total`` iterations committed; ``so_far``: loss, pulls, pushes."""

    @abc.abstractmethod
    def done(self, mode: str, result: ModeResult) -> None:
        """The mode finished."""


class BarDisplay(ProgressDisplay):
    """One rich progress bar per mode (terminals)."""

    def __init__(self, bars: Progress, modes: list[str], global_batch: int) -> None:
        self.bars = bars
        self.global_batch = global_batch
        self.tasks = {m: bars.add_task(m, total=None, rate="") for m in modes}

    def update(self, mode: str, done: int, total: int, so_far: dict[str, float]) -> None:
        elapsed = self.bars.tasks[self.tasks[mode]].elapsed or 0.0
        rate = done * self.global_batch / elapsed if elapsed else 0.0
        self.bars.update(self.tasks[mode], completed=done, total=total, rate=_so_far(rate, so_far))

    def done(self, mode: str, result: ModeResult) -> None:
        t = result.traffic
        self.bars.update(
            self.tasks[mode],
            rate=f"{result.samples_per_second:,.0f} samples/s  pulled {t['pulls']:,}  "
            f"pushed {t['grad_pushes'] + t['write_backs']:,}",
        )


class LineDisplay(ProgressDisplay):
    """A plain line per mode every ``every`` committed iterations (logs, pipes)."""

    def __init__(self, console: Console, global_batch: int, every: int) -> None:
        self.console = console
        self.global_batch = global_batch
        self.every = every
        self._printed: dict[str, int] = {}
        self._started: dict[str, float] = {}

    def update(self, mode: str, done: int, total: int, so_far: dict[str, float]) -> None:
        now = time.monotonic()
        started = self._started.setdefault(mode, now)
        last = self._printed.get(mode, 0)
        finished = done == total and done > last
        if done < last + self.every and not finished:
            return
        self._printed[mode] = done
        rate = done * self.global_batch / (now - started) if now > started else 0.0
        self.console.print(f"{mode}: iteration {done}/{total}  {_so_far(rate, so_far)}",
                           highlight=False)  # fmt: skip

    def done(self, mode: str, result: ModeResult) -> None:
        t = result.traffic
        self.console.print(
            f"{mode}: done, {result.iterations} iterations in {result.seconds:.1f} s, "
            f"{result.samples_per_second:,.0f} samples/s, pulled {t['pulls']:,}, pushed "
            f"{t['grad_pushes'] + t['write_backs']:,}",
            highlight=False,
        )


@contextmanager
def progress_display(
    console: Console, modes: list[str], global_batch: int, every: int
) -> Iterator[ProgressDisplay]:
    """Bars when ``console`` is a terminal, lines otherwise."""
    if not console.is_terminal:
        yield LineDisplay(console, global_batch, every)
        return
    with Progress(
        TextColumn("{task.description:>15}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console,
    ) as bars:  # fmt: skip
        yield BarDisplay(bars, modes, global_batch)
