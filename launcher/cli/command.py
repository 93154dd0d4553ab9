"""One ``heraldps`` subcommand: its flags, what it runs, and the one error wrapper of all."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from heraldps.errors import HeraldError, InvalidArgument, error_from_rpc
from heraldps.modes import (
    EARLY_WRITE_BACK_ALL,
    MAX_LOOK_AHEAD,
    MAX_PREFETCH_PLANS,
    check_look_ahead,
    check_prefetch_plans,
    early_write_back_setting,
)
from heraldps.ports import MAX_PORT

USAGE_ERROR = 2  # argparse's code for a bad command line; ours for a bad configuration


@dataclass(frozen=True)
class Command:
    """A subcommand. ``run`` imports what it needs itself, so ``heraldps --help`` and the
    commands of one role never load the modules of another (a PS shard loads no plotting)."""

    name: str
    help: str  # one line in ``heraldps --help``
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    failure_code: int = 2  # exit code when the run fails with a clear message
    interrupted: str = "interrupted"

    def __call__(self, args: argparse.Namespace) -> int:
        """Run; a domain, value, OS or RPC error becomes one line on stderr and an exit code:
        2 for a bad command line or configuration (as argparse), ``failure_code`` otherwise."""
        try:
            return self.run(args)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (launcher.lifeline)
            signum = int(getattr(exc, "signum", signal.SIGINT))
            self._say(f"{self.interrupted} ({signal.Signals(signum).name})")
            return 128 + signum
        except InvalidArgument as exc:
            self._say(str(exc))
            return USAGE_ERROR
        except (HeraldError, ValueError, OSError) as exc:
            self._say(str(exc))
            return self.failure_code
        except grpc.RpcError as err:  # a stub called directly (the scheduler's)
            error = error_from_rpc(err)
            self._say(f"an RPC failed: {error.code.name} {error.message}")
            return self.failure_code

    def _say(self, message: str) -> None:
        print(f"heraldps {self.name}: {message}", file=sys.stderr)


class HelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default (``off`` for switches, ``none`` if unset)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or "%(default)" in text
            or action.default is argparse.SUPPRESS
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)
        ):
            return text
        if action.nargs == 0:
            default = "on" if action.default else "off"
        elif action.default is None:
            default = "none"
        else:
            default = "%(default)s"
        return f"{text} (default: {default})"


def addresses(text: str) -> tuple[str, ...]:
    """``--ps A,B,...`` as a tuple of addresses, in shard order (empty entries dropped)."""
    return tuple(a for a in text.split(",") if a)


def names(text: str | None) -> tuple[str, ...] | None:
    """A comma-separated column list (``--sparse-columns a,b``); None when not given."""
    return tuple(c for c in text.split(",") if c) if text else None


def early_write_back(text: str) -> int:
    """``--early-write-back``: ``all`` (-1, every idle dirty row), ``off`` (0) or a number
    of rows per worker and iteration (``heraldps.modes.early_write_back_setting``)."""
    number = text.strip().removeprefix("-").isdigit()
    try:
        return early_write_back_setting(int(text) if number else text, "--early-write-back")
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_early_write_back_argument(p: argparse.ArgumentParser) -> None:
    """``--early-write-back`` as ``scheduler``, ``simulate`` and ``local`` take it."""
    p.add_argument(
        "--early-write-back",
        type=early_write_back,
        default=EARLY_WRITE_BACK_ALL,
        metavar="ROWS",
        help="dirty rows written back early, per worker and iteration: rows no worker uses "
        "in the next batch and their owner did not update in its iteration (on-demand "
        "modes; docs/scheduler.md#early-write-backs). Shrinks the final flush and checkpoint "
        "bursts: all (-1, the default), off (0) or a number of rows",
    )


def checked_count(text: str, check: Callable[[object, str], int], flag: str) -> int:
    """An argparse value checked by one of ``heraldps.modes``' ``check_*`` functions, its
    ``InvalidArgument`` turned into argparse's usage error (a non-number reaches the check
    as text, which names it)."""
    try:
        value: object = int(text)
    except ValueError:
        value = text
    try:
        return check(value, flag)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def look_ahead(text: str) -> int:
    """``--look-ahead``: batches the scheduler sees beyond the plan it releases, 1 to
    ``MAX_LOOK_AHEAD`` (``heraldps.modes.check_look_ahead``)."""
    return checked_count(text, check_look_ahead, "--look-ahead")


def look_aheads(text: str) -> tuple[int, ...]:
    """``simulate --look-ahead 1,2,4``: each setting once, in the order given."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(
            f"--look-ahead takes batch counts, comma-separated (e.g. 1,2,4), got {text!r}"
        )
    return tuple(dict.fromkeys(look_ahead(part) for part in parts))


LOOK_AHEAD_HELP = (
    f"batches the scheduler sees beyond the plan it releases: 1 (the default) to {MAX_LOOK_AHEAD}. "
    "More lets it evict rows the coming batches do not use first and keep dirty rows the "
    "coming batches use; it holds that many batches (docs/scheduler.md#look-ahead)"
)


def add_look_ahead_argument(p: argparse.ArgumentParser, several: bool = False) -> None:
    """``--look-ahead`` as ``scheduler`` and ``local`` take it; ``several``: a comma-separated
    list, each setting run in turn (``simulate``)."""
    if several:
        p.add_argument("--look-ahead", type=look_aheads, default="1", metavar="K[,K...]",
                       help=f"{LOOK_AHEAD_HELP}. A list (1,2,4) counts each")  # fmt: skip
    else:
        p.add_argument("--look-ahead", type=look_ahead, default=1, metavar="K",
                       help=LOOK_AHEAD_HELP)  # fmt: skip


def prefetch_plans(text: str) -> int:
    """``--prefetch-plans``: plans ahead a herald_pipelined worker pulls early rows for, 1
    to ``MAX_PREFETCH_PLANS`` (``heraldps.modes.check_prefetch_plans``)."""
    return checked_count(text, check_prefetch_plans, "--prefetch-plans")


def add_prefetch_plans_argument(p: argparse.ArgumentParser) -> None:
    """``--prefetch-plans`` as ``scheduler`` and ``local`` take it."""
    p.add_argument(
        "--prefetch-plans",
        type=prefetch_plans,
        default=1,
        metavar="P",
        help="mode herald_pipelined: plans t+1 .. t+P flow while t trains, and the worker "
        "pulls each early row as soon as no iteration before its plan can change it: 1 (the "
        f"default) to {MAX_PREFETCH_PLANS} (docs/scheduler.md#prefetch-beyond-the-next-plan; "
        "other modes ignore it)",
    )


def at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (and <= ``high``), refused with a message
    naming the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}" if high is None else f"integer in {low}..{high}"
    return parse


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0..65535 (0: a free one)."""
    return at_least(0, MAX_PORT)(text)


port_number.__name__ = "port"


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value:g}")
    return value


def positive(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value:g}")
    return value


def non_negative(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value:g}")
    return value


def add_server_arguments(p: argparse.ArgumentParser, port: int, threads: int) -> None:
    """The flags every gRPC server role takes (``ps``, ``scheduler``)."""
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind gRPC and /metrics (0.0.0.0: every interface, as containers set)",
    )
    p.add_argument(
        "--port",
        type=port_number,
        default=port,
        help="gRPC port; 0 picks a free one; a port another process holds fails the start",
    )
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="serve Prometheus /metrics here (0: free)",
    )
    p.add_argument(
        "--max-message-mb", type=int, default=64, help="largest gRPC message accepted or sent, MiB"
    )
    p.add_argument("--threads", type=int, default=threads, help="RPC handler threads")
    p.add_argument(
        "--grace-seconds", type=float, default=10.0, help="on SIGTERM, time given to RPCs in flight"
    )
    p.add_argument(
        "--port-file", default=None, help="write '<port> <metrics port>' here once serving"
    )


def add_admission_arguments(p: argparse.ArgumentParser, streams: int, streams_help: str) -> None:
    """How much a server role takes on at once (``heraldps.admission``)."""
    p.add_argument(
        "--max-concurrent-rpcs",
        type=at_least(0),
        default=0,
        help="unary calls admitted at once, running (--threads) or waiting for a thread; "
        "one more is answered RESOURCE_EXHAUSTED (reason OVERLOADED) at once and PSClient "
        "retries it after a backoff; 0: 4 x --threads",
    )
    p.add_argument("--max-streams", type=at_least(0 if streams == 0 else 1), default=streams,
                   help=streams_help)  # fmt: skip
    p.add_argument(
        "--stream-stall-seconds",
        type=positive,
        default=60.0,
        help="a stream whose client takes no message for this long is cancelled, freeing "
        "its thread",
    )
