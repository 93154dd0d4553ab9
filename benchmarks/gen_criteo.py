"""Generate a synthetic file in the Criteo Kaggle layout, of any size, fast and deterministic.

    python benchmarks/gen_criteo.py --rows 1000000 --out /tmp/criteo_1m.tsv \\
        [--parquet /tmp/criteo_1m.parquet] [--seed 0]

The TSV has no header and 40 tab-separated columns, ``label, I1..I13, C1..C26``,
like Kaggle's ``train.txt``; ``--parquet`` writes the same rows as Parquet
(``label`` int64, ``I1..I13`` nullable int64, ``C1..C26`` nullable string; an
empty TSV cell is a null), in row groups of ``--row-group-rows``. A ``.gz``
``--out`` is gzip-compressed.

What the rows look like, and why:

- ``C1..C26``: 8-hex-digit strings as in the real data, drawn per field from
  a vocabulary of the field's published Kaggle cardinality
  (/work/shared/data/CARDINALITIES.md: 1460, 583, 10131227, ...) with Zipf
  frequencies (exponent 1: rank ``r`` has probability ~ 1/(r+1)), so a few
  values are very common and most are rare. At 1M rows that gives about 1.93M
  distinct (field, value) keys, as the issue's 1M-row sample of the real set
  had; at 10M about 9.1M. A value's text is a bijective mix of (field, rank),
  so equal text in two fields is rare and a rank's text is stable.
- ``I1..I13``: heavy-tailed non-negative counts (a log-normal per column, its
  median near the real column's), ``I2`` is ``-1`` in about 4% of rows as in
  the real data.
- About 2% of the cells of every feature column are empty.
- ``label``: about 25% positives, with a weak dependence on C6, C14 and I1 so
  that a model has something to learn.

Deterministic: the rows depend only on ``--seed`` and their position. Rows are
made in blocks of 65,536 from a generator seeded by (seed, block), so
``--rows 1000`` is the first 1000 rows of ``--rows 1000000``, and memory stays
bounded by one block whatever ``--rows`` is. Everything is vectorized NumPy.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

# Kaggle Criteo DAC vocabulary sizes of C1..C26 (/work/shared/data/CARDINALITIES.md).
CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
# Median and log-spread of I1..I13 (roughly the real columns' scales).
DENSE_MEDIANS: tuple[float, ...] = (1, 3, 6, 4, 2500, 30, 3, 8, 40, 1, 2, 1, 4)
DENSE_SIGMA = 1.4
COLUMNS: tuple[str, ...] = (
    "label",
    *(f"I{i}" for i in range(1, 14)),
    *(f"C{i}" for i in range(1, 27)),
)
BLOCK_ROWS = 65_536
MISSING = 0.02
I2_NEGATIVE = 0.04
DENSE_MAX = 10**9 - 1  # at most 9 digits
TSV_OPTIONS = pacsv.WriteOptions(
    include_header=False, delimiter="\t", quoting_style="none", batch_size=BLOCK_ROWS
)


@dataclass(frozen=True)
class Block:
    """One block of rows as arrays: labels, dense (-2 = missing), categorical ids (-1 = missing)."""

    labels: npt.NDArray[np.int64]
    dense: npt.NDArray[np.int64]  # (rows, 13)
    values: npt.NDArray[np.int64]  # (rows, 26): the 32-bit value whose hex is the cell text

    @property
    def rows(self) -> int:
        return int(self.labels.shape[0])


def _mix32(field: int, rank: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """A bijection of rank (per field) onto 32-bit values: the categorical cell's value."""
    offset = np.uint64((field * 0x9E3779B97F4A7C15 + 0x632BE5AB) & 0xFFFFFFFF)
    x = (rank.astype(np.uint64) + offset) & np.uint64(0xFFFFFFFF)
    for mult in (0x7FEB352D, 0x846CA68B):  # lowbias32 (Chris Wellons): odd multipliers, xorshifts
        x ^= x >> np.uint64(16)
        x = (x * np.uint64(mult)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(16)
    return x.astype(np.int64)


def make_block(seed: int, block: int, rows: int) -> Block:
    """Rows ``[block * BLOCK_ROWS, block * BLOCK_ROWS + rows)`` of the data set of ``seed``."""
    rng = np.random.default_rng([seed, block])
    values = np.empty((rows, len(CARDINALITIES)), dtype=np.int64)
    ranks = np.empty_like(values)
    for f, vocab in enumerate(CARDINALITIES):
        # Zipf (exponent 1) over [0, vocab): inverse CDF of the density 1/x on [1, vocab + 1).
        r = np.floor(np.exp(rng.random(rows) * np.log(vocab + 1.0))).astype(np.int64) - 1
        ranks[:, f] = np.minimum(r, vocab - 1)
        values[:, f] = _mix32(f, ranks[:, f])
    values[rng.random(values.shape) < MISSING] = -1
    dense = np.floor(
        np.exp(
            rng.normal(np.log(np.asarray(DENSE_MEDIANS, dtype=np.float64)), DENSE_SIGMA, (rows, 13))
        )
    ).astype(np.int64)
    dense = np.minimum(dense, DENSE_MAX)
    dense[:, 0] = np.minimum(dense[:, 0], 60)
    dense[:, 1] = np.where(rng.random(rows) < I2_NEGATIVE, -1, dense[:, 1])
    dense[rng.random(dense.shape) < MISSING] = -2
    # A weak signal: some C6 and C14 values and a large I1 raise the click rate.
    logit = -1.25 + 0.6 * ((ranks[:, 5] % 3) == 0) - 0.4 * ((ranks[:, 13] % 4) == 1)
    logit = logit + 0.25 * np.log1p(np.maximum(dense[:, 0], 0)) - 0.2
    labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return Block(labels=labels, dense=dense, values=values)


def blocks(rows: int, seed: int) -> Iterator[Block]:
    """The data set's rows, one block at a time.

    A short last block is the head of the full block (the random draws depend
    on the block's length), so a smaller ``rows`` gives a prefix of the rows.
    """
    for b in range((rows + BLOCK_ROWS - 1) // BLOCK_ROWS):
        block = make_block(seed, b, BLOCK_ROWS)
        n = min(BLOCK_ROWS, rows - b * BLOCK_ROWS)
        if n < BLOCK_ROWS:
            block = Block(block.labels[:n], block.dense[:n], block.values[:n])
        yield block


_HEX_PAIRS = np.array(
    [int.from_bytes(f"{i:02x}".encode(), "little") for i in range(256)], dtype=np.uint16
)


def _hex8(values: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """8-hex-digit text of 32-bit values, as an (n, 8) byte array (one table lookup per byte)."""
    big_endian = values.astype(">u4").view(np.uint8).reshape(-1, 4)
    return _HEX_PAIRS[big_endian].view(np.uint8).reshape(-1, 8)


def _strings(block: Block, f: int) -> pa.Array:
    """Column C(f+1) as an Arrow string array (null where the TSV cell is empty)."""
    present = block.values[:, f] >= 0
    text = _hex8(block.values[present, f])
    offsets = np.zeros(block.rows + 1, dtype=np.int32)
    np.cumsum(present * 8, out=offsets[1:])
    validity = np.packbits(present, bitorder="little")
    return pa.StringArray.from_buffers(
        block.rows, pa.py_buffer(offsets), pa.py_buffer(text), pa.py_buffer(validity)
    )


def arrow_table(block: Block) -> pa.Table:
    """The block's rows as an Arrow table with the Parquet schema."""
    columns: list[pa.Array] = [pa.array(block.labels, type=pa.int64())]
    for i in range(13):
        d = block.dense[:, i]
        columns.append(pa.array(d, type=pa.int64(), mask=d == -2))
    columns.extend(_strings(block, f) for f in range(26))
    return pa.table(columns, names=list(COLUMNS))


def _open_out(path: Path) -> BinaryIO:
    if path.suffix == ".gz":
        return gzip.open(path, "wb", compresslevel=1)  # type: ignore[return-value]
    return path.open("wb", buffering=1 << 22)


def generate(
    rows: int,
    out: Path,
    parquet: Path | None = None,
    seed: int = 0,
    row_group_rows: int = 4 * BLOCK_ROWS,
) -> None:
    """Write ``rows`` rows to ``out`` (TSV) and, if given, to ``parquet``."""
    if rows < 0:
        raise ValueError(f"--rows must be >= 0, got {rows}")
    if row_group_rows <= 0 or row_group_rows % BLOCK_ROWS:
        raise ValueError(f"--row-group-rows must be a positive multiple of {BLOCK_ROWS}")
    writer = None
    pending: list[pa.Table] = []
    try:
        with _open_out(out) as tsv:
            if parquet is not None:
                schema = arrow_table(make_block(seed, 0, 0)).schema
                writer = pq.ParquetWriter(parquet, schema, compression="snappy")
            for block in blocks(rows, seed):
                table = arrow_table(block)
                pacsv.write_csv(table, tsv, TSV_OPTIONS)  # nulls as empty cells
                if writer is not None:
                    pending.append(table)
                    if sum(t.num_rows for t in pending) >= row_group_rows:
                        writer.write_table(pa.concat_tables(pending), row_group_size=row_group_rows)
                        pending = []
            if writer is not None and pending:
                writer.write_table(pa.concat_tables(pending), row_group_size=row_group_rows)
    finally:
        if writer is not None:
            writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, required=True, help="number of rows")
    parser.add_argument("--out", type=Path, required=True, help="TSV file to write (.gz: gzip)")
    parser.add_argument(
        "--parquet", type=Path, help="also write the same rows to this Parquet file"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--row-group-rows",
        type=int,
        default=4 * BLOCK_ROWS,
        help=f"Parquet row group size, a multiple of {BLOCK_ROWS} (default {4 * BLOCK_ROWS})",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    generate(args.rows, args.out, args.parquet, args.seed, args.row_group_rows)
    took = time.perf_counter() - start
    size = args.out.stat().st_size
    print(
        f"{args.rows:,} rows -> {args.out} ({size / 1e6:.1f} MB)"
        + (
            f" and {args.parquet} ({args.parquet.stat().st_size / 1e6:.1f} MB)"
            if args.parquet
            else ""
        )
        + f" in {took:.1f} s ({args.rows / max(took, 1e-9):,.0f} rows/s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
