"""Feature keys from Arrow arrays (heraldps/data/keys.py) equal the documented formula.

The formula is defined by ``hashlib.blake2b(f"{column}\\x1f{value}", digest_size=8)``;
every test compares the compiled kernel with that definition.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heraldps.data import keys as keys_module
from heraldps.data.keys import column_keys, feature_key, feature_key_reference

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def expected(column: int, values: Sequence[str | None]) -> tuple[list[int], list[bool]]:
    """The keys and present mask the formula gives (null and "" absent, key 0)."""
    keys = [feature_key_reference(column, v) if v else 0 for v in values]
    return keys, [bool(v) for v in values]


def as_lists(result: tuple[np.ndarray, np.ndarray]) -> tuple[list[int], list[bool]]:
    keys, present = result
    assert keys.dtype == np.int64 and present.dtype == np.bool_
    assert keys.shape == present.shape
    return keys.tolist(), present.tolist()


def test_the_documented_test_vectors() -> None:
    assert feature_key(0, "68fd1e64") == 4185973209796718312
    assert feature_key(25, "9727dd16") == 3181448029515369485
    assert feature_key_reference(0, "68fd1e64") == 4185973209796718312
    digest = hashlib.blake2b(b"0\x1f68fd1e64", digest_size=8).hexdigest()
    assert digest == "e82e3cc17490173a"
    keys, present = column_keys(25, pa.array(["9727dd16", "68fd1e64"]))
    assert keys[0] == 3181448029515369485 and present.all()


def test_the_formula_spelled_out() -> None:
    """Little-endian, signed, BLAKE2b with the 8-byte digest-length parameter."""
    for column, value in ((7, "abc"), (3, "a8cd5504"), (0, "é")):
        digest = hashlib.blake2b(f"{column}\x1f{value}".encode(), digest_size=8).digest()
        assert feature_key(column, value) == int.from_bytes(digest, "little", signed=True)
    negative = [v for v in (f"v{i}" for i in range(64)) if feature_key(1, v) < 0]
    assert negative  # the signed reading matters: about half the keys are negative
    assert column_keys(1, pa.array(negative))[0].tolist() == [
        feature_key_reference(1, v) for v in negative
    ]


def test_keys_ignore_the_hash_seed() -> None:
    code = (
        "import pyarrow as pa; from heraldps.data.keys import column_keys, feature_key; "
        "print(feature_key(3, 'a8cd5504'), column_keys(3, pa.array(['a8cd5504']))[0][0])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    key = feature_key(3, "a8cd5504")
    assert outputs == {f"{key} {key}"}


@pytest.mark.parametrize(
    "length", [0, 1, 7, 8, 9, 124, 125, 126, 127, 128, 129, 255, 256, 257, 1000]
)
def test_every_block_boundary_matches_hashlib(length: int) -> None:
    # "0\x1f" is 2 bytes, so values of 126 and 127 bytes straddle the first block's end.
    value = "x" * length
    assert feature_key(0, value) == feature_key_reference(0, value)
    assert feature_key(123, value) == feature_key_reference(123, value)


def test_the_kernel_hashes_an_empty_message() -> None:
    empty = np.empty(0, dtype=np.uint8)
    digest = hashlib.blake2b(b"", digest_size=8).digest()
    assert int(keys_module._hash_bytes(empty, empty)) == int.from_bytes(
        digest, "little", signed=True
    )


@settings(max_examples=300, deadline=None)
@given(
    column=st.integers(0, 1000),
    values=st.lists(
        st.text(max_size=130) | st.text("\U0001f600é\x1f\t", max_size=100), max_size=40
    ),
)
def test_any_unicode_strings_match_hashlib(column: int, values: list[str]) -> None:
    # st.text reaches 0..~500 UTF-8 bytes per value (up to 4 bytes per code point): multi-block.
    for v in values[:3]:
        assert feature_key(column, v) == feature_key_reference(column, v)
    for kind in (pa.string(), pa.large_string()):
        assert as_lists(column_keys(column, pa.array(values, type=kind))) == expected(
            column, values
        )


@settings(max_examples=100, deadline=None)
@given(column=st.integers(0, 1000), values=st.lists(st.integers(INT64_MIN, INT64_MAX) | st.none()))
def test_integer_cells_key_their_decimal_text(column: int, values: list[int | None]) -> None:
    got = as_lists(column_keys(column, pa.array(values, type=pa.int64())))
    assert got == expected(column, [None if v is None else str(v) for v in values])


def test_integer_types_and_extremes() -> None:
    edge = [0, -1, 1, 9, 10, -10, INT64_MAX, INT64_MIN, INT64_MIN + 1, None]
    want = expected(3, [None if v is None else str(v) for v in edge])
    assert as_lists(column_keys(3, pa.array(edge, type=pa.int64()))) == want
    assert as_lists(column_keys(3, pa.array([2**64 - 1, 0], type=pa.uint64()))) == expected(
        3, [str(2**64 - 1), "0"]
    )
    for kind, vals in [
        (pa.int8(), [-128, 127, 0]),
        (pa.int16(), [-32768, 5]),
        (pa.int32(), [-(2**31), 2**31 - 1]),
        (pa.uint8(), [255, 0]),
        (pa.uint32(), [2**32 - 1]),
    ]:
        assert as_lists(column_keys(1, pa.array(vals, type=kind))) == expected(
            1, [str(v) for v in vals]
        )


def test_a_parquet_id_column_keys_like_the_same_csv_text() -> None:
    ids = pa.array([7, 123456789, None, -5], type=pa.int64())
    text = pa.array(["7", "123456789", "", "-5"])
    assert as_lists(column_keys(4, ids)) == as_lists(column_keys(4, text))


def test_nulls_and_empty_strings_are_absent() -> None:
    values = ["a", "", None, "b", None, "", "a"]
    got = as_lists(column_keys(2, pa.array(values)))
    assert got == expected(2, values)
    assert got[1] == [True, False, False, True, False, False, True]
    all_null = column_keys(2, pa.array([None, None], type=pa.string()))
    assert as_lists(all_null) == ([0, 0], [False, False])
    assert as_lists(column_keys(2, pa.array([], type=pa.string()))) == ([], [])
    assert as_lists(column_keys(2, pa.nulls(3))) == ([0, 0, 0], [False, False, False])
    assert as_lists(column_keys(2, pa.array(["", ""]))) == ([0, 0], [False, False])


@pytest.mark.parametrize("rows", [5, 300])  # below and above the dictionary-encoding threshold
def test_sliced_arrays_read_from_their_offset(rows: int) -> None:
    values = [None if i % 7 == 3 else ("" if i % 11 == 5 else f"v{i % 13}") for i in range(rows)]
    for kind in (pa.string(), pa.large_string()):
        whole = pa.array(values, type=kind)
        for start, stop in [(1, rows), (3, rows - 1), (rows // 2, rows // 2 + 2)]:
            sliced = whole.slice(start, stop - start)
            assert sliced.offset == start
            assert as_lists(column_keys(9, sliced)) == expected(9, values[start:stop])
    ints = pa.array([None if i % 5 == 0 else i - 50 for i in range(rows)], type=pa.int64())
    want = [None if v is None else str(v) for v in ints.to_pylist()[2:]]
    assert as_lists(column_keys(9, ints.slice(2))) == expected(9, want)


def test_chunked_arrays_concatenate_in_order() -> None:
    chunks: list[list[str | None]] = [["a", None, "b"], [], ["", "c"], ["a"] * 200]
    chunked = pa.chunked_array([pa.array(c, type=pa.string()) for c in chunks], type=pa.string())
    flat = [v for c in chunks for v in c]
    assert as_lists(column_keys(11, chunked)) == expected(11, flat)
    assert as_lists(column_keys(11, pa.chunked_array([], type=pa.string()))) == ([], [])
    mixed = pa.chunked_array([pa.array([1, None]), pa.array([3])])
    assert as_lists(column_keys(0, mixed)) == expected(0, ["1", None, "3"])


def test_dictionary_arrays_take_their_dictionary_keys() -> None:
    values = ["x", None, "y", "", "x", "y", None]
    encoded = pc.dictionary_encode(pa.array(values))
    assert pa.types.is_dictionary(encoded.type)
    assert as_lists(column_keys(6, encoded)) == expected(6, values)
    # A dictionary holding "" and null entries, int8 and uint16 indices, and a slice.
    dictionary = pa.array(["p", "", None, "q"])
    for index_type in (pa.int8(), pa.uint16(), pa.int32(), pa.int64()):
        indices = pa.array([0, 1, 2, 3, None, 3, 0], type=index_type)
        arr = pa.DictionaryArray.from_arrays(indices, dictionary)
        want = expected(6, ["p", "", None, "q", None, "q", "p"])
        assert as_lists(column_keys(6, arr)) == want
        assert as_lists(column_keys(6, arr.slice(2, 4))) == (want[0][2:6], want[1][2:6])
    large = pa.DictionaryArray.from_arrays(
        pa.array([1, 0]), pa.array(["a", "b"], pa.large_string())
    )
    assert as_lists(column_keys(0, large)) == expected(0, ["b", "a"])


def test_string_views_and_binary_key_their_bytes() -> None:
    values = ["a", None, "", "é"]
    assert as_lists(column_keys(5, pa.array(values, type=pa.string_view()))) == expected(5, values)
    raw = pa.array([v.encode() if v is not None else None for v in values], type=pa.binary())
    assert as_lists(column_keys(5, raw)) == expected(5, values)


def test_equal_values_in_different_columns_get_different_keys() -> None:
    a, _ = column_keys(0, pa.array(["same"]))
    b, _ = column_keys(1, pa.array(["same"]))
    assert a[0] != b[0]


def test_bad_input_says_what_to_do() -> None:
    with pytest.raises(TypeError, match="column 3: sparse values must be strings or integers"):
        column_keys(3, pa.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="column_index must be >= 0"):
        column_keys(-1, pa.array(["a"]))


def test_a_large_array_matches_the_formula_cell_by_cell() -> None:
    rng = np.random.default_rng(5)
    ranks = rng.zipf(1.3, 20_000) % 5000
    values: list[str | None] = [f"{r:08x}" if r % 50 else "" for r in ranks.tolist()]
    values[17] = None
    got = column_keys(12, pa.array(values))
    assert as_lists(got) == expected(12, values)
    direct = keys_module._string_keys(keys_module._prefix(12), pa.array(values))
    assert np.array_equal(direct[0], got[0]) and np.array_equal(direct[1], got[1])


def test_distinct_values_hash_as_they_are() -> None:
    # A dictionary's values (what a reader that encodes itself passes): same keys, no re-encoding.
    values = [f"d{i}" for i in range(500)] + ["", None]
    got = as_lists(column_keys(8, pa.array(values), distinct=True))
    assert got == expected(8, values)
    ids = pa.array(list(range(-100, 400)), type=pa.int64())
    assert as_lists(column_keys(8, ids, distinct=True)) == as_lists(column_keys(8, ids))


# --- KeyCache: the reader's value -> key cache for plain string columns ---------------------


def cache_fill(cache: keys_module.KeyCache, values: pa.Array) -> tuple[int, list[int], list[bool]]:
    keys = np.full(len(values), -7, dtype=np.int64)
    present = np.zeros(len(values), dtype=np.bool_)
    nul = cache.fill(values, keys, present)
    return nul, keys.tolist(), present.tolist()


def test_key_cache_gives_the_formula_through_growth_and_clearing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keys_module, "_MAX_SLOTS", 1 << 13)  # 4096 -> 8192, then cleared
    rng = np.random.default_rng(3)
    vocab = [f"{i:x}" for i in range(20_000)]
    cache = keys_module.KeyCache(7)
    for _ in range(4):  # repeats hit, new values miss; the table grows once, then clears
        values = [vocab[i] for i in rng.integers(0, len(vocab), 6_000)]
        nul, keys, present = cache_fill(cache, pa.array(values))
        assert nul == -1 and (keys, present) == expected(7, values)
    assert cache.table.shape[0] == 1 << 13
    assert 0 < cache.count[0] < (1 << 13) // 2


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary()])
def test_key_cache_edge_values(kind: pa.DataType) -> None:
    # empty and null absent; 8/9/16/17-byte values (the inline words and the uncached path);
    # values equal up to zero padding stay distinct; a slice reads its own offsets
    values = [
        "a", "", None, "abcdefgh", "abcdefghi", "0123456789abcdef", "0123456789abcdefg",
        "a", "é", "abcdefgh", "x" * 100, "x" * 100, "ab", "ab\x01",
    ]  # fmt: skip
    data = [v.encode() if v is not None and kind == pa.binary() else v for v in values]
    cache = keys_module.KeyCache(2)
    array = pa.array(data, type=kind)
    for part, want in ((array, values), (array.slice(3, 8), values[3:11])):
        nul, keys, present = cache_fill(cache, part)
        assert nul == -1 and (keys, present) == expected(2, want)


def test_key_cache_reports_the_first_nul_cell() -> None:
    cache = keys_module.KeyCache(0)
    nul, _, _ = cache_fill(cache, pa.array(["a", "b\x00c", "x" * 20 + "\x00"]))
    assert nul == 1
    nul, _, _ = cache_fill(cache, pa.array(["a", "x" * 20 + "\x00"]))
    assert nul == 1


def test_key_cache_falls_back_for_other_types() -> None:
    cache = keys_module.KeyCache(4)
    nul, keys, present = cache_fill(cache, pa.array([7, None, -1]))
    assert nul == -1 and (keys, present) == expected(4, ["7", None, "-1"])
