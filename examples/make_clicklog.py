"""Write a synthetic click log as CSV: 7 categorical columns, 2 numeric, a 0/1 label.

The file a new user most often brings: a header line, ids as text, an ``age`` of
18-80 and a ``price`` spread over three orders of magnitude, some cells empty. The
label depends on the categorical columns and, as strongly, on ``age`` and ``price``,
so a model that reads the numeric columns well beats one without them. Deterministic
for a seed. Used by the README's "Train on your own data" and by the tests.

    python examples/make_clicklog.py --rows 20000 --out /tmp/clicks.csv
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

CATEGORICAL = ("user", "item", "category", "city", "device", "hour", "weekday")
NUMERIC = ("age", "price")
LABEL = "clicked"
CARDINALITY = {"user": 3000, "item": 1500, "category": 30, "city": 200, "device": 4,
               "hour": 24, "weekday": 7}  # fmt: skip


def make_clicklog(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The columns of a click log of ``rows`` rows (text ids, float numerics with NaN for
    missing, 0/1 labels)."""
    rng = np.random.default_rng(seed)
    columns: dict[str, np.ndarray] = {}
    logit = np.full(rows, -1.6)
    for name in CATEGORICAL:
        size = CARDINALITY[name]
        weights = 1.0 / np.arange(1, size + 1) ** 1.1  # a few frequent ids, a long tail
        ids = rng.choice(size, rows, p=weights / weights.sum())
        effect = rng.normal(0.0, 0.35, size)
        logit += effect[ids]
        columns[name] = np.char.add(f"{name[0]}", ids.astype(str))
    age = rng.integers(18, 81, rows).astype(np.float64)
    price = np.exp(rng.normal(3.0, 1.2, rows))  # about 1 to 1000
    logit += 1.2 * (age - 49) / 18 - 0.9 * (np.log(price) - 3.0) / 1.2
    columns["age"], columns["price"] = age, np.round(price, 2)
    for name in NUMERIC:  # about 3% missing
        columns[name][rng.random(rows) < 0.03] = np.nan
    columns[LABEL] = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return columns


def write_clicklog(path: str | Path, rows: int, seed: int = 0) -> Path:
    """Write the click log as CSV with a header; empty cells for missing numbers."""
    columns = make_clicklog(rows, seed)
    names = (*CATEGORICAL, *NUMERIC, LABEL)
    path = Path(path)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(names)
        text = [_text(n, columns[n]) for n in names]
        out.writerows(zip(*text, strict=True))
    return path


def _text(name: str, values: np.ndarray) -> np.ndarray:
    """A column as CSV cells: ages as whole numbers, missing numbers as empty cells."""
    if name not in NUMERIC:
        return values.astype(str)
    shown = (
        np.nan_to_num(values).astype(np.int64).astype(str) if name == "age" else values.astype(str)
    )
    return np.where(np.isnan(values), "", shown)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    path = write_clicklog(args.out, args.rows, args.seed)
    print(f"wrote {args.rows:,} rows to {path}")


if __name__ == "__main__":
    main()
