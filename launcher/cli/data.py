"""Flags that name a data file, shared by ``simulate``, ``keyset`` and ``local``."""

from __future__ import annotations

import argparse

from heraldps.bundled import PREFIX

BUNDLED_TRAIN = f"{PREFIX}criteo_head8k"


def add_data_arguments(p: argparse.ArgumentParser, default: str | None = BUNDLED_TRAIN) -> None:
    p.add_argument(
        "--data",
        default=default,
        required=default is None,
        help="data file, or a file shipped in the package: bundled:criteo_head8k "
        "(its train.tsv), bundled:criteo_head8k/test.tsv",
    )
    p.add_argument(
        "--format",
        default="criteo",
        choices=("criteo", "avazu", "csv"),
        help="criteo TSV, avazu CSV, or any csv with a header line",
    )
    p.add_argument(
        "--sparse-columns",
        default=None,
        help="comma-separated categorical columns (required with --format csv; the "
        "format's own columns otherwise)",
    )
