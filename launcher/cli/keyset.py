"""``heraldps keyset``: the keys of a data pass as a HugeCTR keyset file."""

from __future__ import annotations

import argparse

from launcher.cli.command import Command, names
from launcher.cli.data import add_data_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p, default=None)
    p.add_argument("--out", required=True, help="keyset file to write")


def run(args: argparse.Namespace) -> int:
    from heraldps.client import write_keyset
    from heraldps.datasets import read_dataset
    from launcher.preflight import check_columns

    columns = names(args.sparse_columns)
    check_columns(args.data, args.format, columns)
    dataset = read_dataset(args.data, args.format, sparse_columns=columns)
    count = write_keyset(args.out, dataset.keys)
    print(f"wrote {count:,} keys to {args.out}")
    return 0


COMMAND = Command(
    name="keyset",
    help="write the keys of a data pass as a HugeCTR keyset file",
    description="Write the distinct keys of a data file (binary native-endian int64, no "
    "header: HugeCTR's keyset format) for Prefetch / heraldps worker --prefetch.",
    add_arguments=add_arguments,
    run=run,
)
