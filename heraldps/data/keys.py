"""Feature keys (hashlib fallback; the KEYS helper's compiled version replaces this file).

``feature_key(j, v)`` = BLAKE2b-64 (RFC 7693, digest length 8) of ``f"{j}\\x1f{v}"`` in
UTF-8, read as a little-endian int64 (the formula documented in docs/data.md).
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc


def feature_key(column_index: int, value: str) -> int:
    """The int64 key of one (column, value) pair."""
    digest = hashlib.blake2b(f"{column_index}\x1f{value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def column_keys(
    column_index: int, values: pa.Array | pa.ChunkedArray
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """(key of every cell, present mask): null or "" cells are absent (key 0); each
    distinct value is hashed once; integers are keyed by their decimal text."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not pa.types.is_dictionary(values.type):
        values = pc.dictionary_encode(values)
    dictionary = values.dictionary
    if not (pa.types.is_string(dictionary.type) or pa.types.is_large_string(dictionary.type)):
        dictionary = pc.cast(dictionary, pa.string())
    prefix = f"{column_index}\x1f".encode()
    texts = dictionary.to_pylist()
    digests = b"".join(
        hashlib.blake2b(prefix + (t or "").encode(), digest_size=8).digest() for t in texts
    )
    unique_keys = np.frombuffer(digests, dtype="<i8").astype(np.int64)
    unique_present = np.array([bool(t) for t in texts], dtype=bool)
    unique_keys[~unique_present] = 0
    indices = values.indices
    if indices.null_count:
        valid = indices.is_valid().to_numpy(zero_copy_only=False)
        index = indices.fill_null(0).to_numpy()
        return np.where(valid, unique_keys[index], 0), valid & unique_present[index]
    index = indices.to_numpy()
    return unique_keys[index], unique_present[index]
