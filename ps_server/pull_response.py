"""A serialized PullResponse whose row payloads are written in place.

A pull's answer is tens of MiB of rows; gRPC Python sends a ``bytes`` object
(and copies it once into its own buffers, as it does for any answer). Built
the obvious way, the rows are gathered into NumPy arrays and then copied into
that ``bytes`` (``b"".join``, or ``tobytes`` and message serialization): one
or more extra passes over the payload, plus fresh buffers to fault in. Here
the ``bytes`` object is allocated first, uninitialized, at its final size;
the protobuf field headers are written into it, and the table's gather
kernel writes values, versions and state straight into their places. The
result is ordinary, canonical protobuf: any client parses it with the
generated ``PullResponse`` class.

Writing into a ``bytes`` object is what CPython's own C code does between
``PyBytes_FromStringAndSize(NULL, n)`` and handing the object out; we do the
same through ``ctypes``. No one else holds a reference until ``message`` is
returned, and its hash is not computed before then (CPython computes it
lazily), so no one ever sees it change.
"""

from __future__ import annotations

import ctypes

import numpy as np
import numpy.typing as npt

from heraldps.v1 import ps_pb2

_FIELDS = ps_pb2.PullResponse.DESCRIPTOR.fields_by_name
VALUES, VERSIONS, STATE, DIM, STATE_WIDTH = (
    _FIELDS[name].number for name in ("values", "versions", "state", "dim", "state_width")
)
_WIRE_VARINT = 0
_WIRE_LEN = 2

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a canonical protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def uninitialized_bytes(size: int) -> tuple[bytes, npt.NDArray[np.uint8]]:
    """A new ``bytes`` of ``size`` bytes and a writable uint8 view of its contents.

    The contents are garbage until written; the caller writes every byte before
    the object leaves its hands, and keeps the object alive while the view is used.
    """
    data: bytes = _new_bytes(None, size)
    if size == 0:
        return data, np.empty(0, dtype=np.uint8)
    address = np.frombuffer(data, dtype=np.uint8).__array_interface__["data"][0]
    view = np.ctypeslib.as_array((ctypes.c_ubyte * size).from_address(address))
    return data, view


class PullResponseBuffer:
    """A PullResponse for ``rows`` rows, serialized, with writable views of its payloads.

    Layout (field order is free in protobuf; this one is what ``wire.encode_message``
    wrote before): values, versions, state, dim, state_width; empty payloads and zero
    ints are left out, as proto3 does. Fill ``values`` ``[rows, dim]``, ``versions``
    ``[rows]`` and ``state`` ``[rows, state_width]`` (unaligned views: the kernels
    that write them do not care), then send ``message``.
    """

    def __init__(self, rows: int, dim: int, state_width: int) -> None:
        sizes = ((VALUES, rows * dim * 4), (VERSIONS, rows * 8), (STATE, rows * state_width * 4))
        parts: list[tuple[bytes, int]] = []  # (header, payload bytes that follow it)
        for number, size in sizes:
            if size:
                parts.append((varint(number << 3 | _WIRE_LEN) + varint(size), size))
        tail = b"".join(
            varint(number << 3 | _WIRE_VARINT) + varint(value)
            for number, value in ((DIM, dim), (STATE_WIDTH, state_width))
            if value
        )
        total = sum(len(header) + size for header, size in parts) + len(tail)
        self.message, buffer = uninitialized_bytes(total)
        payloads: dict[int, npt.NDArray[np.uint8]] = {}
        at = 0
        for (number, size), (header, _) in zip(((n, s) for n, s in sizes if s), parts, strict=True):
            buffer[at : at + len(header)] = np.frombuffer(header, dtype=np.uint8)
            at += len(header)
            payloads[number] = buffer[at : at + size]
            at += size
        buffer[at:] = np.frombuffer(tail, dtype=np.uint8)
        empty = np.empty(0, dtype=np.uint8)
        self.values = payloads.get(VALUES, empty).view(np.float32).reshape(rows, dim)
        self.versions = payloads.get(VERSIONS, empty).view(np.int64)
        self.state = payloads.get(STATE, empty).view(np.float32).reshape(rows, state_width)
