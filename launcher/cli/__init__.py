"""The ``heraldps`` command line: one table of commands, each in its own module.

Every flag can also be set through an environment variable named
``HERALDPS_<FLAG>`` (upper case, dashes as underscores: ``--max-message-mb``
is ``HERALDPS_MAX_MESSAGE_MB``); a flag on the command line wins. See
``launcher.cli.env_parser`` for the rules.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from heraldps import __version__
from heraldps.runtime import tune_malloc
from launcher.cli import (
    export,
    feed,
    health,
    keyset,
    local,
    predict,
    ps,
    scheduler,
    simulate,
    train,
    warmup,
    worker,
)
from launcher.cli.command import Command, HelpFormatter
from launcher.cli.env_parser import EnvArgumentParser, mention_env

COMMANDS: tuple[Command, ...] = (
    ps.COMMAND,
    scheduler.COMMAND,
    worker.COMMAND,
    feed.COMMAND,
    local.COMMAND,
    train.COMMAND,
    export.COMMAND,
    predict.COMMAND,
    simulate.COMMAND,
    keyset.COMMAND,
    health.COMMAND,
    warmup.COMMAND,
)


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = EnvArgumentParser(
        prog="heraldps",
        description="heraldps: a parameter-server cluster for embedding models. Every flag "
        "--some-flag can also come from the environment variable HERALDPS_SOME_FLAG; the "
        "command line wins.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"heraldps {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            formatter_class=HelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(run=command)
    mention_env(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    tune_malloc()
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
