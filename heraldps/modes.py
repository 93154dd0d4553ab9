"""The training modes every process agrees on (Herald Table 1, plus HET alone).

A mode is one value with fields (:class:`Mode`); the scheduler, the workers and
the reports read its fields, never its name. Names (the CLI's ``--mode``, the
proto, job files and reports) stay as they are:

- ``naive``: sequential partition, every update written back each iteration;
- ``on_demand``: sequential partition, on-demand synchronization;
- ``location_aware``: Herald Algorithm 1, naive write-backs;
- ``herald``: Algorithm 1 and on-demand synchronization;
- ``herald_pipelined``: ``herald``'s plans (the same rows move), with the pulls the
  previous iteration cannot change marked early; plans flow one iteration ahead and
  workers fetch those rows while they still train the previous iteration;
- ``het``: plans carry samples only; worker caches decide pulls and pushes by clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from heraldps.errors import InvalidArgument

SEQUENTIAL = "sequential"
LOCATION_AWARE = "location_aware"
PARTITIONERS = (SEQUENTIAL, LOCATION_AWARE)


@dataclass(frozen=True)
class Mode:
    """What a training mode does, field by field.

    ``partitioner``: how the scheduler assigns a batch's samples to workers
    (``sequential`` or ``location_aware``, Herald Algorithm 1); ``on_demand_sync``:
    rows move only when another worker needs them (else every update is written back
    each iteration); ``early_pulls``: plans flow one iteration ahead with the pulls the
    previous iteration cannot change marked early; ``het``: the scheduler plans samples
    only and worker caches decide pulls and pushes by clocks, within the job's
    staleness bound (``bounded_staleness``).
    """

    name: str
    partitioner: str = SEQUENTIAL
    on_demand_sync: bool = False
    early_pulls: bool = False
    het: bool = False

    def __post_init__(self) -> None:
        if self.partitioner not in PARTITIONERS:
            raise ValueError(f"mode {self.name}: partitioner must be one of {PARTITIONERS}")

    @property
    def plans_rows(self) -> bool:
        """Whether the scheduler's plans say which rows move (every mode but HET)."""
        return not self.het

    @property
    def bounded_staleness(self) -> bool:
        """Whether the job's staleness bound applies (HET; plans are synchronous)."""
        return self.het

    @property
    def is_naive(self) -> bool:
        """Whether this mode moves rows as naive does: its traffic is the baseline's own."""
        return self.plans == (SEQUENTIAL, False) and not self.early_pulls and not self.het

    @property
    def plans(self) -> tuple[str, bool]:
        """What decides the rows a plan moves: modes equal here make the same plans."""
        return self.partitioner, self.on_demand_sync

    @property
    def plans_ahead(self) -> int:
        """Iterations whose plans a worker may hold before it commits the oldest."""
        return 2 if self.early_pulls else 1


_ALL = (
    Mode("naive"),
    Mode("on_demand", on_demand_sync=True),
    Mode("location_aware", partitioner=LOCATION_AWARE),
    Mode("herald", partitioner=LOCATION_AWARE, on_demand_sync=True),
    Mode("herald_pipelined", partitioner=LOCATION_AWARE, on_demand_sync=True, early_pulls=True),
    Mode("het", het=True),
)
MODES: dict[str, Mode] = {mode.name: mode for mode in _ALL}
"""Every mode by name, in the order the CLI and reports list them."""

PIPELINED_MODE = "herald_pipelined"
HET_MODE = "het"
ALL_MODES = tuple(MODES)
HERALD_MODES = tuple(m.name for m in _ALL if m.plans_rows)
LOCATION_AWARE_MODES = tuple(m.name for m in _ALL if m.partitioner == LOCATION_AWARE)
# What ``heraldps local`` trains without --modes: Herald's Table 1 and HET.
DEFAULT_LOCAL_MODES = ("naive", "on_demand", "location_aware", "herald", HET_MODE)

EARLY_WRITE_BACK_ALL = -1
"""``early_write_back`` value (the default): write back every idle dirty row, no cap."""


def early_write_back_cap(rows: int) -> int | None:
    """Rows per worker and iteration an ``early_write_back`` setting allows (None: no cap);
    refuses anything below ``EARLY_WRITE_BACK_ALL``."""
    if rows < EARLY_WRITE_BACK_ALL:
        raise InvalidArgument(
            f"early write-backs must be -1 (every idle dirty row), 0 (off) or a number of "
            f"rows per worker and iteration, got {rows}"
        )
    return None if rows == EARLY_WRITE_BACK_ALL else rows


def early_write_back_setting(value: object, name: str = "early_write_back") -> int:
    """A setting as a job file or a flag gives it (``name`` in the error): ``all`` (-1),
    ``off`` (0) or an int, rows per worker and iteration; anything else is refused."""
    named = {"all": EARLY_WRITE_BACK_ALL, "off": 0}
    if isinstance(value, str) and value.strip().lower() in named:
        return named[value.strip().lower()]
    if isinstance(value, bool) or not isinstance(value, int) or value < EARLY_WRITE_BACK_ALL:
        raise InvalidArgument(f"{name} must be all, off or a number of rows, got {value!r}")
    return value


MAX_LOOK_AHEAD = 32
"""The most batches a scheduler may see ahead of the plan it releases (it holds them)."""


def _count_from_one(value: object, name: str, unit: str, one: str, most: int) -> int:
    """``value`` if it is a whole number from 1 (``one``, the default) to ``most``
    ``unit``; else ``InvalidArgument`` naming ``name`` and saying what to pass."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be a whole number of {unit}, got {value!r}")
    if not 1 <= value <= most:
        raise InvalidArgument(
            f"{name} must be 1 ({one}, the default) to {most} {unit}, got {value}"
        )
    return value


def check_look_ahead(batches: object, name: str = "look_ahead") -> int:
    """A look-ahead setting (``name`` in the error): how many batches the scheduler sees
    beyond the plan it releases, 1 (today's one batch, the default) to ``MAX_LOOK_AHEAD``.
    Anything else is refused with a message that says what to pass."""
    return _count_from_one(batches, name, "batches", "one batch", MAX_LOOK_AHEAD)


MAX_PREFETCH_PLANS = 8

DEFAULT_MAX_BACKLOG = 4
"""Planned, uncommitted iterations a scheduler accepts by default (``--max-backlog``);
``herald_pipelined`` with ``--prefetch-plans P`` needs P + 1."""


def check_prefetch_plans(plans: object, name: str = "prefetch_plans") -> int:
    """A prefetch setting (``name`` in the error): how many plans ahead a
    ``herald_pipelined`` worker may hold and pull early rows for, 1 (plan t+1 while t
    trains, the default) to ``MAX_PREFETCH_PLANS``. Other modes ignore it."""
    return _count_from_one(plans, name, "plans", "the next plan", MAX_PREFETCH_PLANS)


# The scheduler keeps one bit per worker in its cache-mirror masks (uint64).
MAX_WORKERS = 64


def mode_named(name: str) -> Mode:
    """The mode called ``name``; an unknown name is an error that lists the known ones."""
    mode = MODES.get(name)
    if mode is None:
        raise InvalidArgument(f"unknown mode {name!r}; choose one of {', '.join(MODES)}")
    return mode
