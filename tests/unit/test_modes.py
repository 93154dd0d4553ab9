"""The training modes as values: Herald's Table 1 and HET, field by field."""

from __future__ import annotations

import pytest

from heraldps.errors import InvalidArgument
from heraldps.modes import (
    ALL_MODES,
    DEFAULT_LOCAL_MODES,
    HERALD_MODES,
    HET_MODE,
    LOCATION_AWARE,
    LOCATION_AWARE_MODES,
    MODES,
    PIPELINED_MODE,
    SEQUENTIAL,
    Mode,
    mode_named,
)


def test_the_names_and_their_order_stay() -> None:
    """Names on the CLI, in proto, job files and reports, in the order reports list them."""
    assert ALL_MODES == ("naive", "on_demand", "location_aware", "herald", PIPELINED_MODE, HET_MODE)
    assert ALL_MODES[:-1] == HERALD_MODES
    assert LOCATION_AWARE_MODES == ("location_aware", "herald", PIPELINED_MODE)
    assert DEFAULT_LOCAL_MODES == ("naive", "on_demand", "location_aware", "herald", HET_MODE)


@pytest.mark.parametrize(
    ("name", "partitioner", "on_demand", "early", "het"),
    [
        ("naive", SEQUENTIAL, False, False, False),
        ("on_demand", SEQUENTIAL, True, False, False),
        ("location_aware", LOCATION_AWARE, False, False, False),
        ("herald", LOCATION_AWARE, True, False, False),
        (PIPELINED_MODE, LOCATION_AWARE, True, True, False),
        (HET_MODE, SEQUENTIAL, False, False, True),
    ],
)
def test_fields(name: str, partitioner: str, on_demand: bool, early: bool, het: bool) -> None:
    mode = mode_named(name)
    assert mode is MODES[name] and mode.name == name
    assert (mode.partitioner, mode.on_demand_sync, mode.early_pulls, mode.het) == (
        partitioner, on_demand, early, het,
    )  # fmt: skip
    assert mode.plans_rows == (not het) and mode.bounded_staleness == het
    assert mode.plans_ahead == (2 if early else 1)
    assert mode.is_naive == (name == "naive")


def test_herald_and_pipelined_make_the_same_plans_and_no_other_two_do() -> None:
    planned = [MODES[name] for name in HERALD_MODES]
    same = {(a.name, b.name) for a in planned for b in planned if a != b and a.plans == b.plans}
    assert same == {("herald", PIPELINED_MODE), (PIPELINED_MODE, "herald")}


def test_unknown_names_and_partitioners_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="unknown mode 'fast'; choose one of naive"):
        mode_named("fast")
    with pytest.raises(ValueError, match="partitioner"):
        Mode("x", partitioner="random")
