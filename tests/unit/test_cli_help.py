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
