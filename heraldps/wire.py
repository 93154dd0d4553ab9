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


def wire_keys(keys: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Keys (or versions) as a contiguous little-endian int64 array (no copy if already so)."""
    return np.ascontiguousarray(keys, dtype=KEY_DTYPE)


def wire_floats(values: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Values or state as a contiguous little-endian float32 array (no copy if already so)."""
    return np.ascontiguousarray(values, dtype=FLOAT_DTYPE)


def encode_keys(keys: npt.ArrayLike) -> bytes:
    """Pack int64 keys (or versions) as little-endian bytes."""
    return wire_keys(keys).tobytes()


def encode_floats(values: npt.ArrayLike) -> bytes:
    """Pack a float32 array (any shape, row-major) as little-endian bytes."""
    return wire_floats(values).tobytes()


def decode_keys(data: bytes | memoryview, field: str = "keys") -> npt.NDArray[np.int64]:
    """Unpack little-endian int64 entries; the byte count must be a multiple of 8."""
    data = memoryview(data).cast("B")
    if len(data) % 8:
        raise InvalidArgument(
            f"{field}: {len(data)} bytes is not a multiple of 8; send packed little-endian int64"
        )
    return np.frombuffer(data, dtype=KEY_DTYPE).astype(np.int64, copy=False)


def decode_rows(
    data: bytes | memoryview, rows: int, width: int, field: str, *, check_finite: bool = True
) -> npt.NDArray[np.float32]:
    """Unpack a float32 ``[rows, width]`` matrix and check its size (and finiteness)."""
    expected = rows * width * 4
    data = memoryview(data).cast("B")
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


COUNT_DTYPE = np.dtype("<i4")


def encode_counts(counts: npt.ArrayLike) -> bytes:
    """Pack small per-row counts (e.g. optimizer steps) as little-endian int32."""
    return np.ascontiguousarray(counts, dtype=COUNT_DTYPE).tobytes()


def decode_counts(data: bytes | memoryview, rows: int, field: str) -> npt.NDArray[np.int32]:
    """Unpack ``rows`` little-endian int32 counts; the byte count must be 4 per row."""
    data = memoryview(data).cast("B")
    if len(data) != 4 * rows:
        raise InvalidArgument(
            f"{field}: expected {rows} little-endian int32 ({4 * rows} bytes), got "
            f"{len(data)} bytes; send one entry per key"
        )
    return np.frombuffer(data, dtype=COUNT_DTYPE).astype(np.int32, copy=False)


# ----- protobuf wire format for the bulk messages --------------------------
# Pull responses carry tens of MiB. Building them as protobuf objects costs
# three extra copies (tobytes, message construction, serialization) and
# parsing them two more; these helpers write and read the same wire format
# straight from and into NumPy buffers. The bytes are ordinary protobuf: any
# client parses them with the generated classes.

_WIRE_VARINT = 0
_WIRE_LEN = 2
_MASK64 = (1 << 64) - 1


def _varint(value: int) -> bytes:
    value &= _MASK64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_message(fields: list[tuple[int, int | bytes | np.ndarray]]) -> bytes:
    """Serialize (field number, value) pairs: ints as varints, arrays and bytes as LEN.

    Zero ints and empty buffers are omitted, as proto3 does. Arrays must be
    C-contiguous; their raw (little-endian) bytes are copied once, into the result.
    """
    parts: list[bytes | memoryview] = []
    for number, value in fields:
        if isinstance(value, int):
            if value:
                parts += [_varint(number << 3 | _WIRE_VARINT), _varint(value)]
            continue
        if isinstance(value, np.ndarray):
            if not value.nbytes:
                continue
            buffer: bytes | memoryview = value.reshape(-1).view(np.uint8).data
        else:
            buffer = value
        if len(buffer):
            parts += [_varint(number << 3 | _WIRE_LEN), _varint(len(buffer)), buffer]
    return b"".join(parts)


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(view):
            raise ValueError("truncated protobuf varint")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def decode_message(data: bytes) -> dict[int, int | memoryview]:
    """Fields of a serialized message without copying LEN fields (memoryviews into ``data``).

    For messages without repeated fields; unknown fixed-width fields are skipped.
    """
    view = memoryview(data)
    fields: dict[int, int | memoryview] = {}
    pos = 0
    while pos < len(view):
        key, pos = _read_varint(view, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _WIRE_VARINT:
            fields[number], pos = _read_varint(view, pos)
        elif wire_type == _WIRE_LEN:
            size, pos = _read_varint(view, pos)
            if pos + size > len(view):
                raise ValueError("truncated protobuf field")
            fields[number] = view[pos : pos + size]
            pos += size
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
    return fields


def len_field(fields: dict[int, int | memoryview], number: int) -> bytes | memoryview:
    """A bytes field of a ``decode_message`` result (empty when absent)."""
    value = fields.get(number, b"")
    if isinstance(value, int):
        raise ValueError(f"protobuf field {number} is a varint, expected bytes")
    return value
