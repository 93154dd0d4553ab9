"""The in-place PullResponse: the same bytes protobuf writes, rows gathered straight in."""

from __future__ import annotations

import numpy as np
import pytest

from heraldps.client.assemble import place
from heraldps.init import Normal
from heraldps.optim import SGD, AdaGrad
from heraldps.spec import TableSpec
from heraldps.v1 import ps_pb2
from ps_server.pull_response import PullResponseBuffer, uninitialized_bytes
from ps_server.store import StagedStore


@pytest.mark.parametrize(
    ("rows", "dim", "state_width"), [(0, 4, 0), (0, 4, 4), (1, 1, 0), (3, 5, 5), (700, 64, 128)]
)
def test_buffer_is_the_canonical_serialization(rows: int, dim: int, state_width: int) -> None:
    rng = np.random.default_rng(rows + dim)
    values = rng.standard_normal((rows, dim)).astype(np.float32)
    versions = rng.integers(-5, 2**40, rows)
    state = rng.standard_normal((rows, state_width)).astype(np.float32)
    buffer = PullResponseBuffer(rows, dim, state_width)
    buffer.values[...] = values
    buffer.versions[...] = versions
    buffer.state[...] = state
    expected = ps_pb2.PullResponse(
        values=values.tobytes(), versions=versions.astype("<i8").tobytes(),
        state=state.tobytes(), dim=dim, state_width=state_width,
    ).SerializeToString()  # fmt: skip
    assert buffer.message == expected
    assert hash(buffer.message) == hash(expected)


def test_uninitialized_bytes_is_a_fresh_writable_object() -> None:
    data, view = uninitialized_bytes(10)
    view[:] = np.arange(10, dtype=np.uint8)
    assert isinstance(data, bytes) and data == bytes(range(10))
    empty, nothing = uninitialized_bytes(0)
    assert empty == b"" and nothing.shape == (0,)


@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), AdaGrad(lr=0.1)])
def test_pull_into_matches_pull_and_creates_rows(optimizer: SGD | AdaGrad) -> None:
    store = StagedStore()
    table, _ = store.create_table(TableSpec("emb", 6, Normal(std=1, seed=3), optimizer))
    table.pull(np.arange(3000, dtype=np.int64), with_state=False)  # grown past 1024 rows
    store.push("emb", 0, np.arange(0, 3000, 7), np.ones((429, 6), np.float32))
    store.commit(0)
    keys = np.array([5, 2999, 7, 7, 123456, -1, 5], dtype=np.int64)  # duplicates, unseen
    for with_state in (False, True):
        width = table.state_width if with_state else 0
        buffer = PullResponseBuffer(keys.shape[0], 6, width)
        table.pull_into(keys, buffer.values, buffer.versions, buffer.state)
        block = table.pull(keys, with_state)
        assert np.array_equal(buffer.values, block.values)
        assert np.array_equal(buffer.versions, block.versions)
        assert np.array_equal(buffer.state, block.state)
        assert block.versions.tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert table.rows == 3002
    first = table.pull(np.array([123456, -1]), with_state=True)
    assert np.array_equal(first.values, Normal(std=1, seed=3).generate(np.array([123456, -1]), 6))


def test_place_copies_unaligned_rows_into_order() -> None:
    rows = np.arange(24, dtype=np.float32).reshape(4, 6)
    raw = np.zeros(1 + rows.nbytes, dtype=np.uint8)
    raw[1:] = rows.view(np.uint8).reshape(-1)
    unaligned = raw[1:].view(np.float32).reshape(4, 6)
    assert not unaligned.flags.aligned
    out = np.full((6, 6), -1, dtype=np.float32)
    place(out, np.array([5, 0, 3, 1]), unaligned)
    assert np.array_equal(out[[5, 0, 3, 1]], rows) and (out[[2, 4]] == -1).all()
    place(out, slice(2, 6), unaligned)
    assert np.array_equal(out[2:6], rows)
    clocks = np.zeros(3, dtype=np.int64)
    place(clocks, np.array([2, 0]), np.array([7, 9], dtype=np.int64))
    assert clocks.tolist() == [9, 0, 7]
    place(np.empty((3, 0), np.float32), np.array([1]), np.empty((1, 0), np.float32))
