"""Generate a small click log: a CSV with five categorical fields and a 0/1 label.

The case issue 25 was filed on (a new user's own CSV, not a benchmark set)::

    python benchmarks/gen_clicklog.py --rows 100000 --out /tmp/netbench/clicklog.csv

Columns ``user,item,publisher,hour,device,click``. user, item and publisher are
Zipf (exponent 1.2) over 100,000, 20,000 and 2,000 values, each vocabulary in a
random order; hour is uniform over 24; device Zipf (1.0) over 5. The label is
drawn from a logistic model of per-value effects, so a model has something to
learn. At 4 workers x 128 a worker's mini-batch touches about 220 distinct keys
of its 640 lookups (the filed case: naive moved 55,317 rows in 30 iterations).
Deterministic for a seed. (``examples/make_clicklog.py`` is the README's richer example,
with dense columns and empty cells; this one keeps to the filed case's five fields.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import numpy.typing as npt

FIELDS = (  # name, vocabulary, Zipf exponent (0: uniform)
    ("user", 100_000, 1.2),
    ("item", 20_000, 1.2),
    ("publisher", 2_000, 1.2),
    ("hour", 24, 0.0),
    ("device", 5, 1.0),
)
LABEL = "click"


def field_values(
    rng: np.random.Generator, vocab: int, exponent: float, rows: int
) -> npt.NDArray[np.int64]:
    """``rows`` draws from a vocabulary of ``vocab`` ids: Zipf by rank, ranks shuffled."""
    if exponent == 0:
        return rng.integers(0, vocab, rows)
    p = np.arange(1, vocab + 1, dtype=np.float64) ** -exponent
    p /= p.sum()
    return rng.permutation(vocab)[rng.choice(vocab, rows, p=p)]


def generate(rows: int, seed: int = 0) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int8]]:
    """The fields' values and the labels."""
    rng = np.random.default_rng(seed)
    columns = [field_values(rng, vocab, a, rows) for _, vocab, a in FIELDS]
    logit = np.full(rows, -1.5)
    for values, (_, vocab, _) in zip(columns, FIELDS, strict=True):
        logit += rng.normal(0.0, 0.6, vocab)[values]
    labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    return columns, labels


def write_csv(path: Path, rows: int, seed: int = 0) -> None:
    columns, labels = generate(rows, seed)
    table = np.column_stack([*columns, labels])
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ",".join([name for name, _, _ in FIELDS] + [LABEL])
    np.savetxt(path, table, fmt="%d", delimiter=",", header=header, comments="")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    write_csv(args.out, args.rows, args.seed)
    print(f"wrote {args.rows:,} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
