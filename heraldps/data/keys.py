"""Feature keys: BLAKE2b-64 of ``column_index \\x1f value``, computed in compiled code.

The key formula is the one documented since the first reader (and reproduced by
the Node.js client)::

    key = int.from_bytes(
        hashlib.blake2b(f"{column_index}\\x1f{value}".encode("utf-8"), digest_size=8).digest(),
        "little",
        signed=True,
    )

unkeyed BLAKE2b (RFC 7693) with the digest length *parameter* ``nn = 8`` (not
a truncated BLAKE2b-512), the 8 digest bytes read as a little-endian int64.
Test vectors: ``feature_key(0, "68fd1e64") == 4185973209796718312`` and
``feature_key(25, "9727dd16") == 3181448029515369485``.

Why a kernel of our own: ``hashlib`` costs a Python call per value (about
1 us), which alone would cap a reader near 40k Criteo rows/s. Here BLAKE2b's
compression function is a numba kernel (GIL released) that reads the values
straight out of the Arrow string buffers (offsets + bytes), so a column of
any length is one call. A column is first dictionary-encoded by Arrow, so each
distinct value of the array is hashed once and the keys of the cells are a
take by the dictionary indices (see docs/data.md "Keys" for the measurements
behind that choice).

Cells: a string (or large string, or dictionary of strings, or binary: the
bytes as they are) gets the key of its exact text; a null or empty cell is not
present (key 0, mask False). An integer cell (ids already encoded, as Parquet
files from NVTabular or Spark carry them) gets the key of its decimal text, so
``7`` in a Parquet int64 column and ``"7"`` in a CSV column have the same key.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from heraldps.jit import njit

__all__ = ["column_keys", "feature_key", "feature_key_reference"]

Keys = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

# BLAKE2b initialisation vector (RFC 7693, 2.6).
_IV = np.array(
    [
        0x6A09E667F3BCC908,
        0xBB67AE8584CAA73B,
        0x3C6EF372FE94F82B,
        0xA54FF53A5F1D36F1,
        0x510E527FADE682D1,
        0x9B05688C2B3E6C1F,
        0x1F83D9ABFB41BD6B,
        0x5BE0CD19137E2179,
    ],
    dtype=np.uint64,
)
# Parameter block word 0 for an unkeyed hash with an 8-byte digest: depth 1,
# fanout 1, key length 0, digest length 8 (RFC 7693, 2.5).
_H0_PARAM = np.uint64(0x01010008)
_BLOCK = 128
if sys.byteorder != "little":  # the kernels read message words through a byte view
    raise ImportError("heraldps.data.keys needs a little-endian machine")
_MAX_INT_DIGITS = 20  # len(str(2**64 - 1)); int64 needs 19 digits plus a sign


@njit(nogil=True, inline="always")
def _rotr(x: np.uint64, n: int) -> np.uint64:  # pragma: no cover - compiled
    return (x >> np.uint64(n)) | (x << np.uint64(64 - n))


Words = tuple[np.uint64, ...]


# fmt: off
@njit(nogil=True)
def _round(
    v: Words,
    x0: np.uint64, x1: np.uint64, x2: np.uint64, x3: np.uint64,
    x4: np.uint64, x5: np.uint64, x6: np.uint64, x7: np.uint64,
    x8: np.uint64, x9: np.uint64, x10: np.uint64, x11: np.uint64,
    x12: np.uint64, x13: np.uint64, x14: np.uint64, x15: np.uint64,
) -> Words:  # pragma: no cover - compiled
    """One round of F (RFC 7693, 3.2): the eight mixes G, written out.

    ``v``: the 16-word working vector; ``x0..x15``: the message words in this
    round's SIGMA order.
    """
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = v
    # G(v0, v4, v8, v12, x0, x1)
    v0 = v0 + v4 + x0
    v12 = _rotr(v12 ^ v0, 32)
    v8 = v8 + v12
    v4 = _rotr(v4 ^ v8, 24)
    v0 = v0 + v4 + x1
    v12 = _rotr(v12 ^ v0, 16)
    v8 = v8 + v12
    v4 = _rotr(v4 ^ v8, 63)
    # G(v1, v5, v9, v13, x2, x3)
    v1 = v1 + v5 + x2
    v13 = _rotr(v13 ^ v1, 32)
    v9 = v9 + v13
    v5 = _rotr(v5 ^ v9, 24)
    v1 = v1 + v5 + x3
    v13 = _rotr(v13 ^ v1, 16)
    v9 = v9 + v13
    v5 = _rotr(v5 ^ v9, 63)
    # G(v2, v6, v10, v14, x4, x5)
    v2 = v2 + v6 + x4
    v14 = _rotr(v14 ^ v2, 32)
    v10 = v10 + v14
    v6 = _rotr(v6 ^ v10, 24)
    v2 = v2 + v6 + x5
    v14 = _rotr(v14 ^ v2, 16)
    v10 = v10 + v14
    v6 = _rotr(v6 ^ v10, 63)
    # G(v3, v7, v11, v15, x6, x7)
    v3 = v3 + v7 + x6
    v15 = _rotr(v15 ^ v3, 32)
    v11 = v11 + v15
    v7 = _rotr(v7 ^ v11, 24)
    v3 = v3 + v7 + x7
    v15 = _rotr(v15 ^ v3, 16)
    v11 = v11 + v15
    v7 = _rotr(v7 ^ v11, 63)
    # G(v0, v5, v10, v15, x8, x9)
    v0 = v0 + v5 + x8
    v15 = _rotr(v15 ^ v0, 32)
    v10 = v10 + v15
    v5 = _rotr(v5 ^ v10, 24)
    v0 = v0 + v5 + x9
    v15 = _rotr(v15 ^ v0, 16)
    v10 = v10 + v15
    v5 = _rotr(v5 ^ v10, 63)
    # G(v1, v6, v11, v12, x10, x11)
    v1 = v1 + v6 + x10
    v12 = _rotr(v12 ^ v1, 32)
    v11 = v11 + v12
    v6 = _rotr(v6 ^ v11, 24)
    v1 = v1 + v6 + x11
    v12 = _rotr(v12 ^ v1, 16)
    v11 = v11 + v12
    v6 = _rotr(v6 ^ v11, 63)
    # G(v2, v7, v8, v13, x12, x13)
    v2 = v2 + v7 + x12
    v13 = _rotr(v13 ^ v2, 32)
    v8 = v8 + v13
    v7 = _rotr(v7 ^ v8, 24)
    v2 = v2 + v7 + x13
    v13 = _rotr(v13 ^ v2, 16)
    v8 = v8 + v13
    v7 = _rotr(v7 ^ v8, 63)
    # G(v3, v4, v9, v14, x14, x15)
    v3 = v3 + v4 + x14
    v14 = _rotr(v14 ^ v3, 32)
    v9 = v9 + v14
    v4 = _rotr(v4 ^ v9, 24)
    v3 = v3 + v4 + x15
    v14 = _rotr(v14 ^ v3, 16)
    v9 = v9 + v14
    v4 = _rotr(v4 ^ v9, 63)
    return v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15
# fmt: on


@njit(nogil=True, inline="always")
def _compress(
    h: npt.NDArray[np.uint64], m: npt.NDArray[np.uint64], t: np.uint64, last: bool
) -> None:  # pragma: no cover - compiled
    """The compression function F (RFC 7693, 3.2), updating ``h`` in place.

    The 12 rounds are written out, each with its row of the message schedule
    SIGMA (2.7; rounds 10 and 11 reuse rows 0 and 1) as literal word orders,
    so the working vector and the message words are scalars LLVM can keep in
    registers: 20% faster per hash than a loop over a SIGMA table, and it still
    compiles in seconds because ``_round`` is compiled once, not inlined by numba.
    """
    m0, m1, m2, m3, m4, m5, m6, m7 = m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]
    m8, m9, m10, m11, m12, m13, m14, m15 = m[8], m[9], m[10], m[11], m[12], m[13], m[14], m[15]
    last_flag = ~_IV[6] if last else _IV[6]
    v: Words = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7],
         _IV[0], _IV[1], _IV[2], _IV[3], _IV[4] ^ t, _IV[5], last_flag, _IV[7])  # fmt: skip
    # (t's high word is 0: messages are < 2**64 bytes.)
    v = _round(v, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)
    v = _round(v, m14, m10, m4, m8, m9, m15, m13, m6, m1, m12, m0, m2, m11, m7, m5, m3)
    v = _round(v, m11, m8, m12, m0, m5, m2, m15, m13, m10, m14, m3, m6, m7, m1, m9, m4)
    v = _round(v, m7, m9, m3, m1, m13, m12, m11, m14, m2, m6, m5, m10, m4, m0, m15, m8)
    v = _round(v, m9, m0, m5, m7, m2, m4, m10, m15, m14, m1, m11, m12, m6, m8, m3, m13)
    v = _round(v, m2, m12, m6, m10, m0, m11, m8, m3, m4, m13, m7, m5, m15, m14, m1, m9)
    v = _round(v, m12, m5, m1, m15, m14, m13, m4, m10, m0, m7, m6, m3, m9, m2, m8, m11)
    v = _round(v, m13, m11, m7, m14, m12, m1, m3, m9, m5, m0, m15, m4, m8, m6, m2, m10)
    v = _round(v, m6, m15, m14, m9, m11, m3, m0, m8, m12, m2, m13, m7, m1, m4, m10, m5)
    v = _round(v, m10, m2, m8, m4, m7, m6, m1, m5, m15, m11, m9, m14, m3, m12, m13, m0)
    v = _round(v, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)
    v = _round(v, m14, m10, m4, m8, m9, m15, m13, m6, m1, m12, m0, m2, m11, m7, m5, m3)
    for i in range(8):
        h[i] ^= v[i] ^ v[i + 8]


@njit(nogil=True, inline="always")
def _blake2b64(
    prefix: npt.NDArray[np.uint8],
    data: npt.NDArray[np.uint8],
    start: int,
    stop: int,
    h: npt.NDArray[np.uint64],
    m: npt.NDArray[np.uint64],
) -> np.int64:  # pragma: no cover - compiled
    """BLAKE2b-64 of ``prefix + data[start:stop]`` as a little-endian int64.

    ``h`` (8 words) and ``m`` (16 words) are scratch space owned by the caller,
    so hashing a value allocates nothing. The message bytes are copied into ``m``'s
    bytes (a little-endian view: the words BLAKE2b reads), one byte store each.
    """
    block = m.view(np.uint8)
    p = prefix.shape[0]
    total = p + (stop - start)
    for i in range(8):
        h[i] = _IV[i]
    h[0] ^= _H0_PARAM
    done = 0  # message bytes compressed so far
    while True:
        end = min(done + _BLOCK, total)
        for i in range(16):
            m[i] = np.uint64(0)
        for j in range(done, min(end, p)):  # prefix bytes in this block
            block[j - done] = prefix[j]
        base = start - p + done  # data index of block byte 0
        for k in range(max(done, p) - done, end - done):  # value bytes in this block
            block[k] = data[base + k]
        last = end == total
        _compress(h, m, np.uint64(end), last)
        if last:
            break
        done = end
    return np.int64(h[0])


@njit(nogil=True, inline="always")
def _bit(bitmap: npt.NDArray[np.uint8], i: int) -> bool:  # pragma: no cover - compiled
    return bool((bitmap[i >> 3] >> (i & 7)) & 1)


@njit(nogil=True)
def _hash_bytes(
    prefix: npt.NDArray[np.uint8], data: npt.NDArray[np.uint8]
) -> np.int64:  # pragma: no cover - compiled
    """BLAKE2b-64 of ``prefix + data`` (any length, empty included)."""
    h = np.empty(8, dtype=np.uint64)
    m = np.empty(16, dtype=np.uint64)
    return _blake2b64(prefix, data, 0, data.shape[0], h, m)


@njit(nogil=True)
def _hash_strings(
    prefix: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.int64] | npt.NDArray[np.int32],
    data: npt.NDArray[np.uint8],
    validity: npt.NDArray[np.uint8],
    bit_offset: int,
    keys: Keys,
    present: Mask,
) -> None:  # pragma: no cover - compiled
    """Key of every cell of an Arrow string array (``validity`` empty: no nulls)."""
    h = np.empty(8, dtype=np.uint64)
    m = np.empty(16, dtype=np.uint64)
    check = validity.shape[0] > 0
    for i in range(keys.shape[0]):
        start = offsets[i]
        stop = offsets[i + 1]
        if stop <= start or (check and not _bit(validity, bit_offset + i)):
            keys[i] = 0
            present[i] = False
        else:
            keys[i] = _blake2b64(prefix, data, start, stop, h, m)
            present[i] = True


@njit(nogil=True)
def _hash_ints(
    prefix: npt.NDArray[np.uint8],
    values: npt.NDArray[np.int64] | npt.NDArray[np.uint64],
    signed: bool,
    validity: npt.NDArray[np.uint8],
    bit_offset: int,
    keys: Keys,
    present: Mask,
) -> None:  # pragma: no cover - compiled
    """Key of the decimal text of every integer cell (``validity`` empty: no nulls)."""
    h = np.empty(8, dtype=np.uint64)
    m = np.empty(16, dtype=np.uint64)
    text = np.empty(_MAX_INT_DIGITS + 1, dtype=np.uint8)
    check = validity.shape[0] > 0
    ten = np.uint64(10)
    for i in range(keys.shape[0]):
        if check and not _bit(validity, bit_offset + i):
            keys[i] = 0
            present[i] = False
            continue
        x = values[i]
        negative = signed and np.int64(x) < 0
        # |x| in uint64 arithmetic, exact for int64's minimum too (two's complement).
        u = (~np.uint64(x) + np.uint64(1)) if negative else np.uint64(x)
        pos = text.shape[0]
        while True:
            pos -= 1
            text[pos] = np.uint8(48 + u % ten)
            u //= ten
            if u == 0:
                break
        if negative:
            pos -= 1
            text[pos] = np.uint8(45)  # "-"
        keys[i] = _blake2b64(prefix, text, pos, text.shape[0], h, m)
        present[i] = True


@njit(nogil=True)
def _take(
    dict_keys: Keys,
    dict_present: Mask,
    indices: npt.NDArray[np.int64] | npt.NDArray[np.int32] | npt.NDArray[np.int16],
    validity: npt.NDArray[np.uint8],
    bit_offset: int,
    keys: Keys,
    present: Mask,
) -> None:  # pragma: no cover - compiled
    """Keys of a dictionary array's cells from its dictionary's keys (null index: absent)."""
    check = validity.shape[0] > 0
    for i in range(keys.shape[0]):
        if check and not _bit(validity, bit_offset + i):
            keys[i] = 0
            present[i] = False
        else:
            j = indices[i]
            keys[i] = dict_keys[j]
            present[i] = dict_present[j]


def _prefix(column_index: int) -> npt.NDArray[np.uint8]:
    if column_index < 0:
        raise ValueError(f"column_index must be >= 0, got {column_index}")
    return np.frombuffer(f"{column_index}\x1f".encode(), dtype=np.uint8)


_NO_BYTES = np.empty(0, dtype=np.uint8)


def _validity(array: pa.Array) -> tuple[npt.NDArray[np.uint8], int]:
    """The validity bitmap and the array's bit offset into it (empty: no nulls)."""
    bitmap = array.buffers()[0]
    if array.null_count == 0 or bitmap is None:
        return _NO_BYTES, 0
    return np.frombuffer(bitmap, dtype=np.uint8), array.offset


def _buffer(buf: pa.Buffer | None, dtype: type[np.generic]) -> npt.NDArray[Any]:
    return _NO_BYTES.view(dtype) if buf is None else np.frombuffer(buf, dtype=dtype)


_STRING_OFFSETS: dict[pa.DataType, type[np.integer]] = {
    pa.string(): np.int32,
    pa.binary(): np.int32,
    pa.large_string(): np.int64,
    pa.large_binary(): np.int64,
}


def _string_keys(prefix: npt.NDArray[np.uint8], array: pa.Array) -> tuple[Keys, Mask]:
    """Hash every cell of a (large) string or binary array, reading its buffers directly."""
    n = len(array)
    keys = np.empty(n, dtype=np.int64)
    present = np.empty(n, dtype=np.bool_)
    if n == 0:
        return keys, present
    bufs = array.buffers()
    offsets = _buffer(bufs[1], _STRING_OFFSETS[array.type])[array.offset : array.offset + n + 1]
    validity, bit_offset = _validity(array)
    _hash_strings(prefix, offsets, _buffer(bufs[2], np.uint8), validity, bit_offset, keys, present)
    return keys, present


def _int_keys(prefix: npt.NDArray[np.uint8], array: pa.Array) -> tuple[Keys, Mask]:
    """Hash the decimal text of every cell of an integer array."""
    n = len(array)
    keys = np.empty(n, dtype=np.int64)
    present = np.empty(n, dtype=np.bool_)
    if n == 0:
        return keys, present
    signed = pa.types.is_signed_integer(array.type)
    if array.type not in (pa.int64(), pa.uint64()):  # narrower ints: widen once (exact)
        array = array.cast(pa.int64() if signed else pa.uint64())
    dtype = np.int64 if signed else np.uint64
    values = _buffer(array.buffers()[1], dtype)[array.offset : array.offset + n]
    validity, bit_offset = _validity(array)
    _hash_ints(prefix, values, signed, validity, bit_offset, keys, present)
    return keys, present


def _dictionary_keys(column_index: int, array: pa.DictionaryArray) -> tuple[Keys, Mask]:
    """Hash the dictionary once, then give each cell its index's key."""
    dict_keys, dict_present = _array_keys(column_index, array.dictionary, encode=False)
    n = len(array)
    keys = np.empty(n, dtype=np.int64)
    present = np.empty(n, dtype=np.bool_)
    if n == 0:
        return keys, present
    indices = array.indices
    if pa.types.is_unsigned_integer(indices.type) or indices.type == pa.int8():
        indices = indices.cast(pa.int64())
    index_values = np.frombuffer(indices.buffers()[1], dtype=indices.type.to_pandas_dtype())
    index_values = index_values[indices.offset : indices.offset + n]
    validity, bit_offset = _validity(indices)
    _take(dict_keys, dict_present, index_values, validity, bit_offset, keys, present)
    return keys, present


def _array_keys(column_index: int, array: pa.Array, encode: bool) -> tuple[Keys, Mask]:
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _dictionary_keys(column_index, array)
    if kind in _STRING_OFFSETS:
        if encode and len(array) > _ENCODE_MIN_ROWS:
            return _dictionary_keys(column_index, pc.dictionary_encode(array))
        return _string_keys(_prefix(column_index), array)
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        large = pa.large_string() if pa.types.is_string_view(kind) else pa.large_binary()
        return _array_keys(column_index, array.cast(large), encode)
    if pa.types.is_integer(kind):
        if encode and len(array) > _ENCODE_MIN_ROWS:
            return _dictionary_keys(column_index, pc.dictionary_encode(array))
        return _int_keys(_prefix(column_index), array)
    if pa.types.is_null(kind):
        return np.zeros(len(array), dtype=np.int64), np.zeros(len(array), dtype=np.bool_)
    raise TypeError(
        f"column {column_index}: sparse values must be strings or integers, got Arrow type "
        f"{kind}; read the column as string (or cast it) before computing keys"
    )


# Arrays shorter than this are hashed cell by cell: the dictionary's own setup
# costs more than the duplicate hashes it saves.
_ENCODE_MIN_ROWS = 64


def column_keys(
    column_index: int, values: pa.Array | pa.ChunkedArray, *, distinct: bool = False
) -> tuple[Keys, Mask]:
    """The key of every cell of one sparse column, and which cells are present.

    ``column_index`` is the column's position among the sparse columns (it is
    part of the hashed text, so equal values in different fields get different
    keys). Returns ``(keys, present)``: int64 keys (0 where absent) and a bool
    mask, False for a null or empty cell. Each distinct value is hashed once:
    the array is dictionary-encoded first, unless it is a dictionary array
    already or the caller says its values are ``distinct`` (a dictionary's
    values: then every cell is hashed as it is, without encoding it again).
    """
    _prefix(column_index)  # validate before any work
    encode = not distinct
    if isinstance(values, pa.ChunkedArray):
        parts = [_array_keys(column_index, chunk, encode) for chunk in values.chunks]
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.bool_)
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([k for k, _ in parts]), np.concatenate([p for _, p in parts])
    return _array_keys(column_index, values, encode)


def feature_key(column_index: int, value: str) -> int:
    """The int64 key of one (column, value) pair; see the module docstring for the formula."""
    data = np.frombuffer(value.encode(), dtype=np.uint8)
    return int(_hash_bytes(_prefix(column_index), data))


def feature_key_reference(column_index: int, value: str) -> int:
    """The same key through :mod:`hashlib`: the formula as written, for tests and other feeders."""
    digest = hashlib.blake2b(f"{column_index}\x1f{value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


# --- filling a chunk's key matrix (the reader's fast path) ------------------------------------


@njit(nogil=True)
def _first_nul(
    offsets: npt.NDArray[np.int64] | npt.NDArray[np.int32], data: npt.NDArray[np.uint8]
) -> int:  # pragma: no cover - compiled
    """Index of the first value containing a NUL byte, or -1."""
    for i in range(offsets.shape[0] - 1):
        for p in range(offsets[i], offsets[i + 1]):
            if data[p] == 0:
                return i
    return -1


def first_nul(values: pa.Array) -> int:
    """Index of the first (large) string or binary value with a NUL byte; -1 when none
    (or when ``values`` is not a string array)."""
    if values.type not in _STRING_OFFSETS or len(values) == 0:
        return -1
    bufs = values.buffers()
    n = len(values)
    offsets = _buffer(bufs[1], _STRING_OFFSETS[values.type])[values.offset : values.offset + n + 1]
    return int(_first_nul(offsets, _buffer(bufs[2], np.uint8)))


def is_text(kind: pa.DataType) -> bool:
    """A (large) string or binary type: what ``KeyCache.fill`` reads."""
    return kind in _STRING_OFFSETS


_INDEX_TYPES = (pa.int16(), pa.int32(), pa.int64())


def take_into(
    dict_keys: Keys, dict_present: Mask, indices: pa.Array, keys: Keys, present: Mask
) -> None:
    """Write the keys of a dictionary array's cells (``indices`` into a dictionary whose
    values have ``dict_keys``/``dict_present``) into ``keys``/``present``; a null index is
    absent. One compiled call, no temporary arrays."""
    n = len(indices)
    if n == 0:
        return
    if indices.type not in _INDEX_TYPES:
        indices = indices.cast(pa.int64())
    index_values = np.frombuffer(indices.buffers()[1], dtype=indices.type.to_pandas_dtype())
    index_values = index_values[indices.offset : indices.offset + n]
    validity, bit_offset = _validity(indices)
    _take(dict_keys, dict_present, index_values, validity, bit_offset, keys, present)


# --- a bounded per-column cache of (value -> key), for plain string columns --------------------

_INLINE = 16  # values up to this many bytes are cached (Criteo's and Avazu's all are)
_FIRST_SLOTS = 1 << 12
_MAX_SLOTS = 1 << 16  # 2 MB a column at 32 bytes a slot; a full table is cleared, not grown
_FULL = -2


@njit(nogil=True, inline="always")
def _word(data: npt.NDArray[np.uint8], start: int, stop: int) -> np.uint64:  # pragma: no cover
    """Bytes ``data[start:stop]`` (at most 8) as a little-endian word, zero-padded."""
    w = np.uint64(0)
    for p in range(start, stop):
        w |= np.uint64(data[p]) << np.uint64((p - start) * 8)
    return w


@njit(nogil=True, inline="always")
def _log2(n: int) -> int:  # pragma: no cover - compiled
    b = 0
    while (1 << b) < n:
        b += 1
    return b


@njit(nogil=True, inline="always")
def _slot(
    w0: np.uint64, w1: np.uint64, tag: np.uint64, shift: np.uint64
) -> np.uint64:  # pragma: no cover
    """Fibonacci hashing of the value's words: the top bits of one multiply."""
    x = (w0 ^ (w1 * np.uint64(0xC2B2AE3D27D4EB4F)) ^ tag) * np.uint64(0x9E3779B97F4A7C15)
    return x >> shift


@njit(nogil=True)
def _cached_strings(
    prefix: npt.NDArray[np.uint8],
    offsets: npt.NDArray[np.int64] | npt.NDArray[np.int32],
    data: npt.NDArray[np.uint8],
    validity: npt.NDArray[np.uint8],
    bit_offset: int,
    table: npt.NDArray[np.uint64],
    count: npt.NDArray[np.int64],
    begin: int,
    keys: Keys,
    present: Mask,
    missed: npt.NDArray[np.int64],
) -> int:  # pragma: no cover - compiled
    """Keys of cells ``begin..`` of a string array through ``table`` (slots of 4 words:
    value bytes 0-7, 8-15, length + 1 (0: empty slot), key), hashing only values not in it.
    ``count[0]``: slots in use. When ``missed`` is not empty, the index of every cell whose
    key was computed here (not found in the table) goes to ``missed[count[1]]`` and
    ``count[1]`` grows: every distinct value of the column is among them the first time it
    is seen.

    Returns -1 when done; the index of the first cell whose value has a NUL byte (nothing
    from there on is written); or ``_FULL - i`` when the table passed half full after
    cell ``i`` (the caller grows or clears it and resumes at ``i + 1``)."""
    h = np.empty(8, dtype=np.uint64)
    m = np.empty(16, dtype=np.uint64)
    check = validity.shape[0] > 0
    record = missed.shape[0] > 0
    mask = np.uint64(table.shape[0] - 1)
    shift = np.uint64(64 - _log2(table.shape[0]))
    limit = table.shape[0] // 2
    one = np.uint64(1)
    for i in range(begin, keys.shape[0]):
        start = offsets[i]
        stop = offsets[i + 1]
        length = stop - start
        if length <= 0 or (check and not _bit(validity, bit_offset + i)):
            keys[i] = 0
            present[i] = False
            continue
        present[i] = True
        if length > _INLINE:
            for p in range(start, stop):
                if data[p] == 0:
                    return i
            keys[i] = _blake2b64(prefix, data, start, stop, h, m)
            if record:
                missed[count[1]] = i
                count[1] += 1
            continue
        w0 = _word(data, start, min(start + 8, stop))
        w1 = _word(data, start + 8, stop) if length > 8 else np.uint64(0)
        tag = np.uint64(length + 1)
        s = _slot(w0, w1, tag, shift)
        while True:
            if table[s, 2] == 0:  # not cached: hash it (after the NUL check) and remember
                for p in range(start, stop):
                    if data[p] == 0:
                        return i
                key = _blake2b64(prefix, data, start, stop, h, m)
                table[s, 0] = w0
                table[s, 1] = w1
                table[s, 2] = tag
                table[s, 3] = np.uint64(key)
                keys[i] = key
                if record:
                    missed[count[1]] = i
                    count[1] += 1
                count[0] += 1
                if count[0] >= limit:
                    return _FULL - i
                break
            if table[s, 2] == tag and table[s, 0] == w0 and table[s, 1] == w1:
                keys[i] = np.int64(table[s, 3])
                break
            s = (s + one) & mask
    return -1


@njit(nogil=True)
def _rehash(old: npt.NDArray[np.uint64], table: npt.NDArray[np.uint64]) -> int:  # pragma: no cover
    """Move every slot of ``old`` into the empty, larger ``table``; returns the count."""
    mask = np.uint64(table.shape[0] - 1)
    shift = np.uint64(64 - _log2(table.shape[0]))
    one = np.uint64(1)
    moved = 0
    for r in range(old.shape[0]):
        tag = old[r, 2]
        if tag == 0:
            continue
        w0 = old[r, 0]
        w1 = old[r, 1]
        s = _slot(w0, w1, tag, shift)
        while table[s, 2] != 0:
            s = (s + one) & mask
        for c in range(4):
            table[s, c] = old[r, c]
        moved += 1
    return moved


class KeyCache:
    """The keys of one sparse column's recent values: a compiled open-addressing table of
    (value up to 16 bytes -> key), so a value seen before costs a probe (tens of ns) instead
    of a BLAKE2b (about 170 ns). It grows from 4k to 64k slots (2 MB) and is cleared when
    full, so its memory is bounded whatever the file's size; keys are exact (a hit needs the
    same bytes), so the cache changes only the speed."""

    def __init__(self, column_index: int) -> None:
        self.prefix = _prefix(column_index)
        self.column_index = column_index
        self.table = np.zeros((_FIRST_SLOTS, 4), dtype=np.uint64)
        self.count = np.zeros(2, dtype=np.int64)  # slots in use, cells hashed (``missed``)

    def fill(
        self,
        values: pa.Array,
        keys: Keys,
        present: Mask,
        missed: npt.NDArray[np.int64] | None = None,
    ) -> int:
        """Write the key and presence of every cell of a (large) string or binary array
        into ``keys``/``present`` (same length). Returns the index of the first cell with
        a NUL byte (then the rest is not written), or -1.

        With ``missed`` (int64, as long as ``values``), the cells whose key was hashed
        here, not found in the cache, are listed in ``missed[:n]`` and ``n`` is
        ``self.missed()``: each distinct value of the column appears there at least the
        first time it is filled, which is what an exact distinct count needs."""
        n = len(values)
        self.count[1] = 0
        if n == 0:
            return -1
        if values.type not in _STRING_OFFSETS:
            k, p = column_keys(self.column_index, values)
            keys[:] = k
            present[:] = p
            if missed is not None:
                listed = np.flatnonzero(p)
                missed[: listed.shape[0]] = listed
                self.count[1] = listed.shape[0]
            return -1
        bufs = values.buffers()
        offsets = _buffer(bufs[1], _STRING_OFFSETS[values.type])
        offsets = offsets[values.offset : values.offset + n + 1]
        data = _buffer(bufs[2], np.uint8)
        validity, bit_offset = _validity(values)
        begin = 0
        while True:
            status = int(
                _cached_strings(
                    self.prefix,
                    offsets,
                    data,
                    validity,
                    bit_offset,
                    self.table,
                    self.count,
                    begin,
                    keys,
                    present,
                    _NO_CELLS if missed is None else missed,
                )
            )
            if status > _FULL:
                return status
            begin = _FULL - status + 1
            self._make_room()

    def missed(self) -> int:
        """How many cells the last ``fill`` listed in its ``missed``."""
        return int(self.count[1])

    def _make_room(self) -> None:
        slots = self.table.shape[0]
        if slots >= _MAX_SLOTS:
            self.table[:, 2] = 0
            self.count[0] = 0
            return
        table = np.zeros((min(slots * 4, _MAX_SLOTS), 4), dtype=np.uint64)
        self.count[0] = _rehash(self.table, table)
        self.table = table


_NO_CELLS = np.empty(0, dtype=np.int64)
