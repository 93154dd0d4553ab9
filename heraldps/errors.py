"""Domain errors raised by the cores and mapped once to gRPC status codes.

Every error carries a message that names the offending value and says what to
do. Cores raise these *before* mutating anything, so a rejected request
leaves the stores untouched.
"""

from __future__ import annotations


class HeraldError(Exception):
    """Base class of every heraldps domain error."""


class InvalidArgument(HeraldError):
    """The request is malformed: wrong sizes, NaN/Inf, a bad spec (INVALID_ARGUMENT)."""


class CacheTooSmall(InvalidArgument):
    """A worker's mini-batch needs more distinct rows than its cache holds (INVALID_ARGUMENT)."""

    def __init__(self, worker: int, iteration: int, needed: int, capacity: int) -> None:
        super().__init__(
            f"worker {worker}'s mini-batch of iteration {iteration} needs {needed} rows, more "
            f"than its cache of {capacity}; raise the cache size or lower the batch size"
        )
        self.worker = worker
        self.iteration = iteration
        self.needed = needed
        self.capacity = capacity


class UnknownTable(HeraldError):
    """The named table does not exist on this shard (NOT_FOUND)."""

    def __init__(self, name: str, known: list[str]) -> None:
        listed = ", ".join(repr(k) for k in sorted(known)) or "none"
        super().__init__(
            f"table {name!r} does not exist on this shard (tables: {listed}); "
            "create it with CreateTable first"
        )
        self.name = name


class TableExists(HeraldError):
    """A table with this name exists with a different spec (ALREADY_EXISTS)."""


class StaleIteration(HeraldError):
    """An iteration older than the last committed one (FAILED_PRECONDITION)."""


class FailedPrecondition(HeraldError):
    """The request is well formed but the system is not in a state to run it."""


class VersionConflict(HeraldError):
    """A write-back whose base versions no longer match the stored rows (ABORTED)."""


class ResourceExhausted(HeraldError):
    """A memory cap or size limit would be exceeded (RESOURCE_EXHAUSTED)."""
