"""Every flag of every command says what it does and shows its default."""

from __future__ import annotations

import argparse

import pytest

from launcher.cli import COMMANDS, build_parser
from launcher.cli.env_parser import flag_actions, subcommands


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_every_flag_has_a_description_and_its_default(name: str) -> None:
    parser = subcommands(build_parser())[name]
    text = " ".join(parser.format_help().split())
    flags = list(flag_actions(parser))
    for _, action in flags:
        flag = next(s for s in action.option_strings if s.startswith("--"))
        assert action.help and len(action.help.split("[env")[0].strip()) > 8, flag
        shown = parser._get_formatter()._get_help_string(action)  # what --help prints
        assert "(default: " in shown or action.required, flag
    assert "(default: " in text or not flags  # `warmup` has no flags


def test_the_top_level_help_lists_every_command_with_a_line() -> None:
    text = build_parser().format_help()
    for command in COMMANDS:
        assert command.name in text and len(command.help) > 20
    ps = next(c for c in COMMANDS if c.name == "ps")
    assert "Staged-PS" in ps.help and "Cached-PS" in ps.help


def test_a_usage_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["local", "--shards", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "heraldps local: error: argument --shards: must be >= 1, got 0 "
        "(see 'heraldps local --help')"
    ]


def test_switches_show_off_and_unset_values_show_none() -> None:
    parser = subcommands(build_parser())["scheduler"]
    helps = {a.dest: parser._get_formatter()._get_help_string(a) for _, a in flag_actions(parser)}
    assert helps["no_shadow_naive"].endswith("(default: off)")
    assert helps["metrics_port"].endswith("(default: none)")
    assert isinstance(parser, argparse.ArgumentParser)


def test_local_dense_sync_auto_all_reduces_only_on_a_real_network() -> None:
    """Loopback: the PS path (the all-reduce only costs CPU there); --link-mbit: all-reduce."""
    from launcher.cli import build_parser
    from launcher.cli.local import dense_sync_of

    parser = build_parser()
    assert dense_sync_of(parser.parse_args(["local"])) == "ps"
    assert dense_sync_of(parser.parse_args(["local", "--link-mbit", "10"])) == "allreduce"
    assert dense_sync_of(parser.parse_args(["local", "--dense-sync", "allreduce"])) == "allreduce"
    assert (
        dense_sync_of(parser.parse_args(["local", "--link-mbit", "10", "--dense-sync", "ps"]))
        == "ps"
    )


@pytest.mark.parametrize("command", ["scheduler", "local", "simulate"])
def test_look_ahead_is_one_to_thirty_two_batches(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    required = ["--workers", "2", "--cache-rows", "9"] if command == "scheduler" else []
    parse = build_parser().parse_args
    several = command == "simulate"  # simulate counts each of a list
    assert parse([command, *required]).look_ahead == ((1,) if several else 1)
    assert parse([command, *required, "--look-ahead", "3"]).look_ahead == ((3,) if several else 3)
    for bad, why in (("0", "got 0"), ("33", "got 33"), ("x", "got 'x'")):
        with pytest.raises(SystemExit) as exit_info:
            parse([command, *required, "--look-ahead", bad])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "--look-ahead must be" in err and why in err, err


def test_simulate_takes_a_list_of_look_aheads(capsys: pytest.CaptureFixture[str]) -> None:
    parse = build_parser().parse_args
    assert parse(["simulate", "--look-ahead", "1,4,2,4"]).look_ahead == (1, 4, 2)
    for bad in ("1,0", "2,,x", ","):
        with pytest.raises(SystemExit):
            parse(["simulate", "--look-ahead", bad])
        assert "--look-ahead" in capsys.readouterr().err


def test_the_scheduler_service_refuses_a_look_ahead_as_its_flag_does() -> None:
    from heraldps.errors import InvalidArgument
    from scheduler_service.server import SchedulerConfig

    assert SchedulerConfig(workers=2, cache_rows=9, look_ahead=32).look_ahead == 32
    for bad in (0, 33):
        with pytest.raises(InvalidArgument, match="--look-ahead must be 1") as refused:
            SchedulerConfig(workers=2, cache_rows=9, look_ahead=bad)
        assert refused.value.reason == "INVALID_ARGUMENT"
