"""Command-line flags that also come from ``HERALDPS_<FLAG>`` environment variables.

Containers and Kubernetes configure processes through the environment, so every
flag ``--some-flag`` of every subcommand is also read from ``HERALDPS_SOME_FLAG``.
Precedence: command line, then environment, then the flag's default. A value
from the environment goes through the same type conversion and ``choices`` check
as one typed on the command line, and a bad one fails with the variable's name.
A required flag is satisfied by its variable. An empty variable counts as unset.

Only the parser that runs reads the environment (a subcommand's flags are read
when that subcommand is chosen), so a variable meant for one role never breaks
another role's command in the same container, e.g. ``heraldps health``.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

ENV_PREFIX = "HERALDPS_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_name(action: argparse.Action) -> str | None:
    """``HERALDPS_SOME_FLAG`` for ``--some-flag``; None for positionals, help and version."""
    if isinstance(action, argparse._HelpAction | argparse._VersionAction):
        return None
    longs = [s for s in action.option_strings if s.startswith("--")]
    if not longs:
        return None
    return ENV_PREFIX + longs[0][2:].upper().replace("-", "_")


def flag_actions(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """(variable, action) of every flag of ``parser`` itself (not of its subcommands)."""
    for action in parser._actions:
        name = env_name(action)
        if name is not None:
            yield name, action


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``parser`` by name (empty if it has none)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


class EnvArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose flags fall back to ``HERALDPS_*`` variables.

    Subcommand parsers made with ``add_subparsers`` are of this class too (argparse
    gives them the parent's class), so the rule holds at every level.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace = argparse.Namespace() if namespace is None else namespace
        relaxed: list[argparse.Action] = []
        from_env: set[argparse.Action] = set()
        for name, action in flag_actions(self):
            text = os.environ.get(name, "")
            if not text or hasattr(namespace, action.dest):
                continue
            # A value already in the namespace wins over a default, and the command
            # line overwrites it: exactly the precedence we want for the environment.
            setattr(namespace, action.dest, self._from_env(action, name, text))
            from_env.add(action)
            if action.required:
                action.required = False
                relaxed.append(action)
        # A required "one of" group (export's --checkpoint | --ps) is satisfied by a
        # variable too; the command checks that exactly one was given.
        groups = [g for g in self._mutually_exclusive_groups
                  if g.required and from_env.intersection(g._group_actions)]  # fmt: skip
        for group in groups:
            group.required = False
        try:
            return super().parse_known_args(args, namespace)
        finally:
            for action in relaxed:
                action.required = True
            for group in groups:
                group.required = True

    def error(self, message: str) -> NoReturn:
        """One line: the problem (with the variables that can supply a missing flag) and
        where the usage is; argparse's multi-line usage block hides the problem."""
        missing = "the following arguments are required: "
        if message.startswith(missing):
            names = dict((_flag(a), n) for n, a in flag_actions(self))
            listed = [names[f] for f in message[len(missing) :].split(", ") if f in names]
            if listed:
                message += f" (or set {', '.join(listed)})"
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _from_env(self, action: argparse.Action, name: str, text: str) -> Any:
        """The value ``text`` stands for, converted and checked as argparse would."""
        if action.nargs == 0:  # store_true, store_false, store_const
            word = text.strip().lower()
            if word not in _TRUE + _FALSE:
                self.error(
                    f"environment variable {name}={text!r}: {_flag(action)} takes no value; "
                    f"set {name} to one of {', '.join(_TRUE)} (on) or {', '.join(_FALSE)} (off)"
                )
            return action.const if word in _TRUE else action.default
        if action.nargs in (None, "?"):
            return self._convert(action, name, text)
        return [self._convert(action, name, part) for part in shlex.split(text)]

    def _convert(self, action: argparse.Action, name: str, text: str) -> Any:
        value: Any = text
        if callable(action.type):
            try:
                value = action.type(text)
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                kind = getattr(action.type, "__name__", "value")
                self.error(
                    f"environment variable {name}={text!r} is not a valid {kind} for "
                    f"{_flag(action)} ({exc})"
                )
        if action.choices is not None and value not in action.choices:
            allowed = ", ".join(str(c) for c in action.choices)
            self.error(
                f"environment variable {name}={text!r}: {_flag(action)} takes one of {allowed}"
            )
        return value


def _flag(action: argparse.Action) -> str:
    return next(s for s in action.option_strings if s.startswith("--"))


def mention_env(parser: argparse.ArgumentParser) -> None:
    """Append ``[env HERALDPS_X]`` to every flag's help, in this parser and its subcommands."""
    for name, action in flag_actions(parser):
        if action.help != argparse.SUPPRESS:
            action.help = f"{action.help or ''} [env {name}]".strip()
    for sub in subcommands(parser).values():
        mention_env(sub)
