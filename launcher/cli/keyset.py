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
    from heraldps.data import check, stream
    from heraldps.data.key_union import distinct_keys
    from launcher.cli.data import spec_of
    from launcher.preflight import check_columns

    columns = names(args.sparse_columns)
    check_columns(args.data, args.format, columns)
    spec = spec_of(args)
    check(spec)
    # Streamed: memory follows the vocabulary (8 bytes a key), not the file.
    keys = distinct_keys(chunk.keys for chunk in stream(spec))
    count = write_keyset(args.out, keys)
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
