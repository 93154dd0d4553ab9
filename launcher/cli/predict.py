"""``heraldps predict``: score a data file with an exported model, in this process."""

from __future__ import annotations

import argparse

from launcher.cli.command import Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a directory heraldps export wrote")
    p.add_argument("--data", required=True, help="the rows to score, in the job's format")
    p.add_argument("--out", required=True, help="one probability per line, in row order")
    p.add_argument(
        "--no-label",
        action="store_true",
        help="the data has no label column (scores only; no AUC)",
    )
    p.add_argument(
        "--unseen",
        default="initializer",
        choices=("initializer", "zero"),
        help="rows of keys the model lacks: the table's initializer value (as a shard "
        "answers a pull) or zeros",
    )


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from worker_client.evaluation import auc, logloss
    from worker_client.predictor import Predictor

    predictor = Predictor.load(args.model, args.unseen)
    scores, labels = predictor.score_file(args.data, args.no_label)
    # %.9g: every float32 reads back to the same bits.
    np.savetxt(args.out, scores, fmt="%.9g")
    line = f"heraldps predict: {scores.shape[0]:,} rows scored, written to {args.out}"
    if not args.no_label and not predictor.job.no_label and 0 < labels.sum() < labels.size:
        line += f"; AUC {auc(labels, scores):.6f}, logloss {logloss(labels, scores):.6f}"
    print(line)
    return 0


COMMAND = Command(
    name="predict",
    help="score a data file with an exported model (one probability per row)",
    description="Load a model directory (heraldps export, heraldps local --export), read "
    "--data with the job's columns, transforms and key function, and write the click "
    "probability of every row to --out, one per line; with labels, print AUC and logloss.",
    add_arguments=add_arguments,
    run=run,
    failure_code=1,
)
