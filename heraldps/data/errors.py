"""The one error of the data path: bad input, said in one line with file, row and column."""

from __future__ import annotations

from heraldps.errors import InvalidArgument


class DataError(InvalidArgument, ValueError):
    """A data file or data argument is unusable; the message says where and what to do.

    A ``ValueError`` too, so callers written against the old reader keep catching it.
    """

    reason = "BAD_DATA"
