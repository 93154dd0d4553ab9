"""``heraldps local --plot``: rows moved and training loss per iteration, one line per mode,
and where an iteration's time goes (a stacked bar per mode: median seconds per phase)."""

from __future__ import annotations

from typing import Any

from launcher.local import ModeResult, median_phases
from worker_client.timing import PHASES


def headless_pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files (the Agg backend), imported on first use:
    matplotlib costs start-up time that only plotting commands should pay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plot(results: dict[str, ModeResult], path: str) -> None:
    """Write the curves and the time breakdown as a PNG (matplotlib, imported only here)."""
    plt = headless_pyplot()

    fig, (traffic_ax, loss_ax, time_ax) = plt.subplots(1, 3, figsize=(17, 4.8))
    for mode, result in results.items():
        steps = list(range(len(result.per_iteration)))
        moved = [
            row["pulls"] + row["grad_pushes"] + row["write_backs"] for row in result.per_iteration
        ]
        traffic_ax.plot(steps, moved, label=mode)
        loss_ax.plot(steps, [row["loss"] for row in result.per_iteration], label=mode)
    traffic_ax.set(title="embedding rows moved per iteration", xlabel="iteration", ylabel="rows")
    loss_ax.set(title="training loss (global batch mean)", xlabel="iteration", ylabel="logloss")
    plot_breakdown(time_ax, results)
    for ax in (traffic_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_breakdown(ax: Any, results: dict[str, ModeResult]) -> None:
    """One stacked bar per mode: the workers' median milliseconds per phase of an iteration."""
    modes = list(results)
    bottoms = [0.0] * len(modes)
    phases = {mode: median_phases(results[mode].per_iteration) for mode in modes}
    for phase in PHASES:
        heights = [1000 * phases[m][phase] for m in modes]
        ax.bar(modes, heights, bottom=bottoms, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set(title="where an iteration goes (median per worker)", ylabel="ms")
    ax.legend(fontsize=7, ncol=2)
    ax.tick_params(axis="x", labelrotation=30)
