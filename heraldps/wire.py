"""Packing of bulk arrays into protobuf ``bytes`` fields and back.

Keys and versions are little-endian int64, values and state little-endian
float32 in row-major ``[n, width]`` order (see ``proto/heraldps/v1/types.proto``).
Decoding is zero-copy (``np.frombuffer``); every size is checked so a
malformed request is rejected with a message naming the field.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from heraldps.errors import InvalidArgument

KEY_DTYPE = np.dtype("<i8")
FLOAT_DTYPE = np.dtype("<f4")


def encode_keys(keys: npt.ArrayLike) -> bytes:
    """Pack int64 keys (or versions) as little-endian bytes."""
    return np.ascontiguousarray(keys, dtype=KEY_DTYPE).tobytes()


def encode_floats(values: npt.ArrayLike) -> bytes:
    """Pack a float32 array (any shape, row-major) as little-endian bytes."""
    return np.ascontiguousarray(values, dtype=FLOAT_DTYPE).tobytes()


def decode_keys(data: bytes, field: str = "keys") -> npt.NDArray[np.int64]:
    """Unpack little-endian int64 entries; the byte count must be a multiple of 8."""
    if len(data) % 8:
        raise InvalidArgument(
            f"{field}: {len(data)} bytes is not a multiple of 8; send packed little-endian int64"
        )
    return np.frombuffer(data, dtype=KEY_DTYPE).astype(np.int64, copy=False)


def decode_rows(
    data: bytes, rows: int, width: int, field: str, *, check_finite: bool = True
) -> npt.NDArray[np.float32]:
    """Unpack a float32 ``[rows, width]`` matrix and check its size (and finiteness)."""
    expected = rows * width * 4
    if len(data) != expected:
        got = len(data) / 4 / rows if rows else len(data) / 4
        raise InvalidArgument(
            f"{field}: expected {rows} rows of {width} float32 ({expected} bytes), got "
            f"{len(data)} bytes ({got:g} floats per row); rows must match the table's width"
        )
    matrix = np.frombuffer(data, dtype=FLOAT_DTYPE).astype(np.float32, copy=False)
    matrix = matrix.reshape(rows, width)
    if check_finite and matrix.size and not np.isfinite(matrix).all():
        bad = int(np.flatnonzero(~np.isfinite(matrix).all(axis=1))[0])
        raise InvalidArgument(f"{field}: row {bad} contains NaN or Inf; every value must be finite")
    return matrix
