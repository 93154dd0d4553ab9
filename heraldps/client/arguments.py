"""The caller's arguments as the wire needs them, or ``InvalidArgument`` saying what is wrong.

Every public ``PSClient`` call passes its arguments through here before it builds a
request, so a bad one raises a ``heraldps.errors`` class, never a NumPy or protobuf
``ValueError``/``TypeError``, and nothing is sent. Keys are int64 on the wire: a key
outside int64 is refused, never wrapped (2**63 would become -2**63 and train another
row); unsigned arrays are converted only when every value fits. Float keys are refused
even when whole: a float64 holds integers exactly only up to 2**53.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument, shown
from heraldps.limits import check_name, check_path

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1

__all__ = ["as_counts", "as_keys", "as_rows", "check_name", "check_path", "integer"]


def integer(value: Any, what: str, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """``value`` as an int in ``low..high`` (Python and NumPy integers; not bool, not float)."""
    if isinstance(value, bool | np.bool_):
        raise InvalidArgument(f"{what} must be an integer, got a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise InvalidArgument(
            f"{what} must be an integer, got {type(value).__name__} {shown(value)}"
        ) from None
    if not low <= number <= high:
        raise InvalidArgument(f"{what} must be in {low}..{high}, got {number}")
    return number


def _array(values: Any, what: str) -> np.ndarray:
    try:
        return np.asarray(values)
    except (ValueError, TypeError, OverflowError) as exc:  # ragged lists, odd objects
        raise InvalidArgument(f"{what}: not an array of numbers ({exc})") from None


def as_keys(keys: npt.ArrayLike, what: str = "keys") -> npt.NDArray[np.int64]:
    """The caller's keys (or versions) as contiguous int64; InvalidArgument for anything
    that is not a 1-D array of integers within int64."""
    array = _array(keys, what)
    if array.ndim != 1:
        raise InvalidArgument(f"{what} must be 1-D, got shape {array.shape}")
    if not array.size:
        return np.empty(0, dtype=np.int64)
    kind = array.dtype.kind
    if kind == "O":  # NumPy keeps Python ints beyond int64 and uint64 as objects
        raise InvalidArgument(
            f"{what} must be integers within int64 ({INT64_MIN}..{INT64_MAX}); "
            f"{_first_outside(array)} is not"
        )
    if kind not in "iu":
        hint = (
            " (NumPy makes a list that mixes negative keys with keys beyond int64 float64)"
            if kind == "f"
            else ""
        )
        raise InvalidArgument(f"{what} must be integers, got {array.dtype}{hint}")
    if kind == "u" and array.dtype.itemsize == 8:
        top = int(array.max())
        if top > INT64_MAX:
            raise InvalidArgument(
                f"{what}: {top} is beyond int64 (the wire's key type, largest {INT64_MAX}); "
                "unsigned keys are taken only when every value fits"
            )
    return np.ascontiguousarray(array, dtype=np.int64)


def _first_outside(array: np.ndarray) -> str:
    """The first element of an object array that is no int64 (an error path only)."""
    for value in array.flat:
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            return f"{shown(value)} (a {type(value).__name__})"
        if not INT64_MIN <= int(value) <= INT64_MAX:
            return str(value)
    return "some value"


def as_rows(rows: npt.ArrayLike, n: int, width: int, what: str) -> npt.NDArray[np.float32]:
    """The caller's rows as contiguous float32 ``[n, width]``; InvalidArgument naming
    ``what`` for another shape or values that are not real numbers."""
    array = _array(rows, what)
    if array.dtype.kind not in "iuf":
        raise InvalidArgument(f"{what} must be real numbers, got {array.dtype}")
    if array.shape != (n, width):
        raise InvalidArgument(
            f"{what} must have shape ({n}, {width}) (one row of the table's width per key), "
            f"got {array.shape}"
        )
    if array.dtype == np.float32:
        return np.ascontiguousarray(array)
    with np.errstate(over="ignore"):  # beyond float32: Inf, refused by the finite check
        return np.ascontiguousarray(array, dtype=np.float32)


def as_counts(counts: npt.ArrayLike, n: int, what: str) -> npt.NDArray[np.int32]:
    """The caller's per-row counts as contiguous int32 ``[n]``; InvalidArgument naming
    ``what`` otherwise (a count beyond int32 is refused, never wrapped)."""
    array = _array(counts, what)
    if array.shape != (n,) or (array.size and array.dtype.kind not in "iu"):
        raise InvalidArgument(
            f"{what} must be {n} integers, got {array.dtype} of shape {array.shape}"
        )
    if array.size and (int(array.max()) > INT32_MAX or int(array.min()) < -INT32_MAX - 1):
        raise InvalidArgument(f"{what}: values must fit int32, got {int(array.max())}")
    return np.ascontiguousarray(array, dtype=np.int32)
