"""Flags that name the data and how to read it, shared by ``simulate``, ``keyset`` and
``local``; and the first pass over it, made before any process starts."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from heraldps.bundled import PREFIX

if TYPE_CHECKING:
    from heraldps.data import DataProfile, DataSpec, SparseDataset

BUNDLED_TRAIN = f"{PREFIX}criteo_head8k"


def add_data_arguments(p: argparse.ArgumentParser, default: str | None = BUNDLED_TRAIN) -> None:
    p.add_argument(
        "--data",
        default=default,
        required=default is None,
        help="data: a file, comma-separated files, a directory (its data files, Spark's "
        "part-* included) or a glob, read in natural name order (day_2 before day_10); .gz "
        "streams; .parquet is read by row group. Or a file shipped in the package: "
        "bundled:criteo_head8k (its train.tsv), bundled:criteo_head8k/test.tsv",
    )
    p.add_argument(
        "--format",
        default="criteo",
        choices=("criteo", "avazu", "csv", "parquet"),
        help="criteo TSV (no header), avazu CSV, any csv with a header line, or parquet "
        "(columns by name); criteo, avazu and csv columns may also come in .parquet files",
    )
    p.add_argument(
        "--sparse-columns",
        default=None,
        help="comma-separated categorical columns (required with --format csv and parquet; "
        "the format's own columns otherwise)",
    )
    p.add_argument(
        "--label-column",
        default=None,
        help="the 0/1 label column (required with --format csv and parquet, unless --no-label)",
    )
    p.add_argument(
        "--no-label",
        action="store_true",
        help="the data has no label column (inference or key counting only): labels are 0",
    )
    p.add_argument(
        "--dense-columns",
        default=None,
        help="comma-separated numeric columns (criteo: I1..I13 by default; others: none)",
    )
    p.add_argument(
        "--dense-transform",
        default=None,
        help="how dense columns enter the model: one of log1p, standardize, minmax, raw for "
        "every column, or COLUMN=TRANSFORM,... per column (the rest: the default). Default: "
        "log1p for criteo, standardize otherwise (docs/data.md#dense-transforms)",
    )


def spec_of(args: argparse.Namespace) -> DataSpec:
    """The data flags as a ``DataSpec`` (columns resolved, not yet checked against the file)."""
    from heraldps.data import DataSpec
    from launcher.cli.command import names

    spec = DataSpec(
        source=args.data,
        format=args.format,
        sparse_columns=names(args.sparse_columns),
        label_column=getattr(args, "label_column", None),
        dense_columns=names(getattr(args, "dense_columns", None)),
        no_label=bool(getattr(args, "no_label", False)),
    )
    text = getattr(args, "dense_transform", None)
    if text:
        transforms = parse_transforms(text, spec.dense(), spec.transforms())
        spec = replace(spec, dense_transforms=transforms)
    return spec


def parse_transforms(
    text: str, columns: tuple[str, ...], defaults: tuple[str, ...]
) -> tuple[str, ...]:
    """``--dense-transform``: one transform for every column, or ``COL=T,...`` (the other
    columns keep their ``defaults``)."""
    from heraldps.data.spec import DENSE_TRANSFORMS
    from heraldps.errors import InvalidArgument

    if "=" not in text:
        if text not in DENSE_TRANSFORMS:
            raise InvalidArgument(
                f"--dense-transform {text!r}: use one of {', '.join(DENSE_TRANSFORMS)}, or "
                "COLUMN=TRANSFORM,... per column"
            )
        return tuple(text for _ in columns)
    chosen: dict[str, str] = {}
    for part in text.split(","):
        column, _, transform = part.partition("=")
        if column not in columns:
            raise InvalidArgument(
                f"--dense-transform names {column!r}, which is not a dense column; the dense "
                f"columns are: {', '.join(columns) or 'none (add --dense-columns)'}"
            )
        if transform not in DENSE_TRANSFORMS:
            raise InvalidArgument(
                f"--dense-transform {part!r}: use one of {', '.join(DENSE_TRANSFORMS)}"
            )
        chosen[column] = transform
    return tuple(chosen.get(c, d) for c, d in zip(columns, defaults, strict=True))


def first_pass(
    spec: DataSpec,
    what: str = "reading",
    *,
    profile_rows: int | None = None,
    on_chunk: Callable[[SparseDataset], None] | None = None,
) -> DataProfile:
    """``check`` then ``scan`` of ``spec``: every error in the data before any process
    starts, with a progress line on stderr every few seconds on long files.
    ``profile_rows`` and ``on_chunk`` as in ``scan`` (a training split's profile from a
    pass that checks every row; more numbers from the same pass)."""
    from heraldps.data import check, scan

    check(spec)
    return scan(spec, progress=progress_line(what), profile_rows=profile_rows, on_chunk=on_chunk)


def count_rows(spec: DataSpec) -> int:
    """``check`` then the rows of ``spec``, by parsing alone (``heraldps.data.count_rows``),
    with progress lines on long files."""
    from heraldps.data import check
    from heraldps.data import count_rows as count

    check(spec)
    return count(spec, progress=progress_line("counting rows"))


def progress_line(what: str) -> Callable[[int, int, int], None]:
    """A reader's ``progress(rows, bytes_done, bytes_total)``: a line on stderr every 5 s."""
    started = last = time.monotonic()

    def progress(rows: int, done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < 5:
            return
        last = now
        share = (
            f" ({min(100 * done / total, 100):.0f}% of {total / 2**20:,.0f} MiB)" if total else ""
        )
        rate = rows / max(now - started, 1e-9)
        print(f"{what}: {rows:,} rows{share}, {rate:,.0f} rows/s", file=sys.stderr, flush=True)

    return progress
