"""Bulk array packing and the hand-written protobuf wire path for Pull."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from heraldps import wire
from heraldps.errors import InvalidArgument
from heraldps.v1 import ps_pb2


@settings(max_examples=50, deadline=None)
@given(
    values=hnp.arrays(np.float32, st.tuples(st.integers(0, 20), st.integers(1, 5))),
    versions=hnp.arrays(np.int64, st.integers(0, 20)),
    dim=st.integers(0, 2**31 - 1),
)
def test_encoded_pull_response_parses_with_generated_code(
    values: np.ndarray, versions: np.ndarray, dim: int
) -> None:
    data = wire.encode_message([(1, values), (2, versions), (3, b""), (4, dim), (5, 0)])
    parsed = ps_pb2.PullResponse.FromString(data)
    assert parsed.values == values.tobytes()
    assert parsed.versions == versions.tobytes()
    assert parsed.state == b"" and parsed.dim == dim and parsed.state_width == 0
    # And back: the zero-copy decoder reads what protobuf wrote.
    fields = wire.decode_message(parsed.SerializeToString())
    assert bytes(wire.len_field(fields, 1)) == values.tobytes()
    assert bytes(wire.len_field(fields, 3)) == b""
    assert fields.get(4, 0) == dim


def test_negative_varints_and_unknown_fields() -> None:
    data = ps_pb2.CommitResponse(committed_iteration=-1, rows_updated=5).SerializeToString()
    assert wire.encode_message([(1, -1), (2, 5)]) == data
    fields = wire.decode_message(data + b"\x1d\x00\x00\x80\x3f")  # field 3, fixed32: skipped
    assert fields[1] == 2**64 - 1 and fields[2] == 5
    with pytest.raises(ValueError, match="truncated"):
        wire.decode_message(b"\x0a\x05ab")
    with pytest.raises(ValueError, match="varint"):
        wire.len_field({4: 3}, 4)


def test_decoders_reject_bad_sizes_and_non_finite() -> None:
    with pytest.raises(InvalidArgument, match="multiple of 8"):
        wire.decode_keys(b"\0" * 12)
    with pytest.raises(InvalidArgument, match="expected 2 rows of 3 float32"):
        wire.decode_rows(b"\0" * 20, 2, 3, "grads")
    bad = np.array([[1, 2, 3], [4, np.inf, 6]], np.float32).tobytes()
    with pytest.raises(InvalidArgument, match="row 1 contains NaN or Inf"):
        wire.decode_rows(bad, 2, 3, "grads")
    ok = wire.decode_rows(bad, 2, 3, "values", check_finite=False)
    assert ok.shape == (2, 3)
    keys = np.array([1, -2, 1 << 62])
    assert wire.decode_keys(wire.encode_keys(keys)).tolist() == keys.tolist()
