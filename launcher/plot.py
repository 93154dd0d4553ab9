"""``heraldps local --plot``: rows moved and training loss per iteration, one line per mode."""

from __future__ import annotations

from launcher.local import ModeResult


def write_plot(results: dict[str, ModeResult], path: str) -> None:
    """Write the curves as a PNG (matplotlib, imported only here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (traffic_ax, loss_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, result in results.items():
        steps = list(range(len(result.per_iteration)))
        moved = [
            row["pulls"] + row["grad_pushes"] + row["write_backs"] for row in result.per_iteration
        ]
        traffic_ax.plot(steps, moved, label=mode)
        loss_ax.plot(steps, [row["loss"] for row in result.per_iteration], label=mode)
    traffic_ax.set(title="embedding rows moved per iteration", xlabel="iteration", ylabel="rows")
    loss_ax.set(title="training loss (global batch mean)", xlabel="iteration", ylabel="logloss")
    for ax in (traffic_ax, loss_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
