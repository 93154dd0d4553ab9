"""Every flag of every subcommand also comes from ``HERALDPS_<FLAG>`` (launcher.cli.env_parser)."""

from __future__ import annotations

import argparse

import pytest

from launcher.cli import build_parser
from launcher.cli.env_parser import EnvArgumentParser, env_name, flag_actions, subcommands

# Values for the positionals a subcommand needs on the command line.
POSITIONALS = {"health": ["127.0.0.1:7001"]}


def _env_value(action: argparse.Action) -> tuple[str, object]:
    """A valid value for ``action`` other than its default: (text, parsed)."""
    if action.nargs == 0:
        return "true", action.const
    if action.choices is not None:
        choice = next(c for c in action.choices if c != action.default)
        return str(choice), choice
    if callable(action.type) and action.type is not str:
        for text in ("12345", "0.25", "3"):  # the first one the flag's type accepts
            try:
                value = action.type(text)
            except (ValueError, argparse.ArgumentTypeError):
                continue
            if value != action.default:
                return text, value
    return "from-env", "from-env"


def _all_flags() -> list[tuple[str, str, argparse.Action]]:
    found = []
    for command, sub in subcommands(build_parser()).items():
        for name, action in flag_actions(sub):
            found.append((command, name, action))
    return found


def test_every_flag_of_every_subcommand_has_a_variable() -> None:
    flags = _all_flags()
    commands = {c for c, _, _ in flags}
    assert {"ps", "scheduler", "worker", "feed", "health", "local", "simulate"} <= commands
    for _, name, action in flags:
        long = next(s for s in action.option_strings if s.startswith("--"))
        assert name == "HERALDPS_" + long[2:].upper().replace("-", "_")


@pytest.mark.parametrize("command", sorted(subcommands(build_parser())))
def test_each_variable_sets_its_flag(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """All of a subcommand's variables at once, required flags included, nothing on argv."""
    expected = {}
    for name, action in flag_actions(subcommands(build_parser())[command]):
        text, value = _env_value(action)
        monkeypatch.setenv(name, text)
        expected[action.dest] = value
    args = build_parser().parse_args([command, *POSITIONALS.get(command, [])])
    assert {dest: getattr(args, dest) for dest in expected} == expected


def test_command_line_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERALDPS_PORT", "7005")
    monkeypatch.setenv("HERALDPS_STORE", "cached")
    args = build_parser().parse_args(["ps", "--port", "7009"])
    assert (args.port, args.store) == (7009, "cached")
    monkeypatch.setenv("HERALDPS_LOG_LEVEL", "DEBUG")  # the top-level flag too
    assert build_parser().parse_args(["ps"]).log_level == "DEBUG"
    assert build_parser().parse_args(["--log-level", "ERROR", "ps"]).log_level == "ERROR"


def test_defaults_hold_without_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERALDPS_PORT", "")  # empty counts as unset
    args = build_parser().parse_args(["ps"])
    assert (args.port, args.store, args.cache_gb) == (7001, "staged", 1.0)


def test_required_flags_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERALDPS_WORKERS", "2")
    monkeypatch.setenv("HERALDPS_CACHE_ROWS", "900")
    parser = build_parser()
    args = parser.parse_args(["scheduler"])
    assert (args.workers, args.cache_rows, args.port) == (2, 900, 7100)
    # The requirement is only relaxed for that parse: without the variable it is back.
    monkeypatch.delenv("HERALDPS_WORKERS")
    with pytest.raises(SystemExit):
        parser.parse_args(["scheduler"])


def test_missing_required_flag_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HERALDPS_CACHE_ROWS", "900")
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["scheduler"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "required: --workers" in err and "HERALDPS_WORKERS" in err


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("HERALDPS_PORT", "70o1", "HERALDPS_PORT='70o1' is not a valid port for --port"),
        ("HERALDPS_CACHE_GB", "lots", "HERALDPS_CACHE_GB='lots' is not a valid float"),
        ("HERALDPS_STORE", "disk", "HERALDPS_STORE='disk': --store takes one of staged, cached"),
        ("HERALDPS_DURABILITY", "SYNC", "--durability takes one of sync, periodic"),
    ],
)
def test_a_bad_value_fails_naming_the_variable(
    name: str,
    text: str,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(name, text)
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["ps"])
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err


def test_a_bad_value_for_another_role_does_not_break_a_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PS container's variables must not break ``heraldps health`` run inside it."""
    monkeypatch.setenv("HERALDPS_STORE", "not-a-store")
    monkeypatch.setenv("HERALDPS_CACHE_GB", "not-a-number")
    args = build_parser().parse_args(["health", "127.0.0.1:7001"])
    assert (args.address, args.timeout) == ("127.0.0.1:7001", 5.0)


def test_switches_and_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flag kinds the CLI may grow: on/off switches and multi-value flags."""
    parser = EnvArgumentParser(prog="t")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--no-cache", dest="cache", action="store_false")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1])
    monkeypatch.setenv("HERALDPS_VERBOSE", "yes")
    monkeypatch.setenv("HERALDPS_NO_CACHE", "on")
    monkeypatch.setenv("HERALDPS_SIZES", "8 16")
    args = parser.parse_args([])
    assert (args.verbose, args.cache, args.sizes) == (True, False, [8, 16])
    monkeypatch.setenv("HERALDPS_VERBOSE", "off")
    assert parser.parse_args([]).verbose is False
    assert parser.parse_args(["--sizes", "3"]).sizes == [3]
    monkeypatch.setenv("HERALDPS_VERBOSE", "maybe")
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_help_names_the_variable() -> None:
    sub = subcommands(build_parser())["ps"]
    text = sub.format_help()
    assert "[env HERALDPS_MAX_MESSAGE_MB]" in " ".join(text.split())
    assert env_name(next(a for a in sub._actions if a.dest == "help")) is None


def test_a_required_one_of_group_is_satisfied_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``heraldps export``'s required --checkpoint | --ps: a variable gives the source; with
    neither the usage error stays, and the group is required again after each parse."""
    monkeypatch.setenv("HERALDPS_PS", "127.0.0.1:7001")
    args = build_parser().parse_args(["export", "--job", "j.json", "--out", "m"])
    assert (args.ps, args.checkpoint) == ("127.0.0.1:7001", None)
    monkeypatch.delenv("HERALDPS_PS")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "--job", "j.json", "--out", "m"])
    assert "one of the arguments --checkpoint --ps is required" in capsys.readouterr().err
