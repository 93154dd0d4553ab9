"""Bad arguments to every public client call raise a ``heraldps.errors`` class, never a
builtin, and keys outside int64 are refused instead of wrapping (issue 23, sections 1 and 5).
Against real shards: nothing a refused call names may reach a row."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heraldps.client import DenseParameter, PSClient, read_keyset, write_keyset
from heraldps.errors import FailedPrecondition, HeraldError, InvalidArgument, NotFound
from heraldps.optim import SGD
from tests.conftest import ClusterFactory

INT64_MAX = 2**63 - 1


@pytest.fixture
def ps(cluster: ClusterFactory) -> PSClient:
    _, client = cluster(2)
    client.create_table("emb", 4, SGD(1.0))
    return client


def _rows(ps: PSClient) -> int:
    return ps.describe_table("emb").rows


# ----- keys beyond int64 -----------------------------------------------------


@pytest.mark.parametrize(
    "keys",
    [
        [2**63],
        [2**64 - 1],
        [2**64],
        [-(2**63) - 1],
        np.array([2**63], dtype=np.uint64),
        np.array([1, 2**64 - 1], dtype=np.uint64),
        [-1, 2**63],  # NumPy makes this float64
        [1.0, 2.0],
        np.array([1.5], dtype=np.float32),
        ["1"],
        [None],
        [True, False],
        [[1, 2]],
        7,
    ],
    ids=repr,
)
def test_keys_outside_int64_or_not_integers_are_refused(ps: PSClient, keys: Any) -> None:
    n = int(np.size(keys)) or 1
    grads = np.ones((n, 4), np.float32)
    with pytest.raises(InvalidArgument, match="keys"):
        ps.push_gradients("emb", keys, grads, 0)
    with pytest.raises(InvalidArgument, match="keys"):
        ps.pull("emb", keys)
    with pytest.raises(InvalidArgument, match="keys"):
        ps.versions("emb", keys)
    with pytest.raises(InvalidArgument, match="keys"):
        ps.prefetch("emb", keys)
    ps.commit(0)
    assert _rows(ps) == 0  # nothing trained, no key wrapped to a negative one


def test_unsigned_keys_that_fit_are_converted(ps: PSClient) -> None:
    keys = np.array([5, INT64_MAX, 0], dtype=np.uint64)
    ps.push_gradients("emb", keys, np.ones((3, 4), np.float32), 0)
    ps.commit(0)
    values, versions = ps.pull("emb", np.array([5, INT64_MAX, 0], dtype=np.int64))
    assert (versions == 1).all() and (values == -1.0).all()
    assert _rows(ps) == 3
    for small in (np.uint8, np.uint16, np.uint32, np.int8, np.int32):
        got, _ = ps.pull("emb", np.array([5, 0], dtype=small))
        assert (got == -1.0).all()
    # Python ints at the edges of int64 are keys like any other.
    _, clocks = ps.pull("emb", [INT64_MAX, -(2**63)])
    assert clocks.tolist() == [1, 0]


# ----- every public method: only heraldps.errors -----------------------------

Call = Callable[[PSClient], Any]


def _outcome(call: Call, ps: PSClient) -> BaseException | None:
    """What ``call`` raised, or what the future it returned failed with."""
    try:
        result = call(ps)
    except BaseException as exc:
        return exc
    if isinstance(result, Future):
        return result.exception(timeout=30)
    return None


GRADS = np.ones((3, 4), np.float32)
KEYS = np.arange(3)
ZERO = np.zeros(3, np.int64)
BAD_CALLS: dict[str, Call] = {
    # pulls and versions
    "pull float keys": lambda ps: ps.pull("emb", [1.0, 2.0]),
    "pull 2-D keys": lambda ps: ps.pull("emb", np.zeros((2, 2), np.int64)),
    "pull table not a string": lambda ps: ps.pull(7, KEYS),  # type: ignore[arg-type]
    "pull table too long": lambda ps: ps.pull("t" * 10_000, KEYS),
    "pull_with_state keys beyond int64": lambda ps: ps.pull_with_state("emb", [2**63]),
    "pull_async uint64 beyond int64": lambda ps: ps.pull_async(
        "emb", np.array([2**64 - 1], np.uint64)
    ),
    "pull_with_state_async strings": lambda ps: ps.pull_with_state_async("emb", ["a"]),
    "versions objects": lambda ps: ps.versions("emb", [object()]),
    # pushes
    "push grads wrong width": lambda ps: ps.push_gradients("emb", KEYS, np.ones((3, 5)), 0),
    "push grads wrong row count": lambda ps: ps.push_gradients("emb", KEYS, np.ones((2, 4)), 0),
    "push grads 1-D": lambda ps: ps.push_gradients("emb", KEYS, np.ones(12), 0),
    "push grads ragged": lambda ps: ps.push_gradients("emb", [1, 2], [[1, 2, 3, 4], [1]], 0),
    "push grads strings": lambda ps: ps.push_gradients("emb", [1], [["a", "b", "c", "d"]], 0),
    "push grads complex": lambda ps: ps.push_gradients("emb", KEYS, GRADS * 1j, 0),
    "push grads None": lambda ps: ps.push_gradients("emb", KEYS, None, 0),  # type: ignore[arg-type]
    "push grads NaN": lambda ps: ps.push_gradients("emb", KEYS, GRADS * np.nan, 0),
    "push grads past float32": lambda ps: ps.push_gradients("emb", KEYS, np.full((3, 4), 1e300), 0),
    "push float keys": lambda ps: ps.push_gradients("emb", [1.0, 2.0, 3.0], GRADS, 0),
    "push iteration float": lambda ps: ps.push_gradients("emb", KEYS, GRADS, 1.5),  # type: ignore[arg-type]
    "push iteration string": lambda ps: ps.push_gradients("emb", KEYS, GRADS, "3"),  # type: ignore[arg-type]
    "push iteration beyond int64": lambda ps: ps.push_gradients("emb", KEYS, GRADS, 2**70),
    "push steps wrong count": lambda ps: ps.push_gradients("emb", KEYS, GRADS, 0, steps=[1, 1]),
    "push steps float": lambda ps: ps.push_gradients("emb", KEYS, GRADS, 0, steps=[1.0] * 3),
    "push steps zero": lambda ps: ps.push_gradients("emb", KEYS, GRADS, 0, steps=[0, 1, 1]),
    "push steps wrapping int32": lambda ps: ps.push_gradients(
        "emb", KEYS, GRADS, 0, steps=np.array([2**32 + 1] * 3, np.int64)
    ),
    "push worker negative": lambda ps: ps.push_gradients("emb", KEYS, GRADS, 0, worker=-1),
    "push worker beyond int32": lambda ps: ps.push_gradients("emb", KEYS, GRADS, 0, worker=2**40),
    "push worker float": lambda ps: ps.push_gradients("emb", KEYS, GRADS, 0, worker=0.5),  # type: ignore[arg-type]
    "push_async grads wrong shape": lambda ps: ps.push_gradients_async(
        "emb", KEYS, np.ones((3, 2)), 0
    ),
    # commits
    "commit float": lambda ps: ps.commit(1.5),  # type: ignore[arg-type]
    "commit beyond int64": lambda ps: ps.commit(2**64),
    "commit string": lambda ps: ps.commit("4"),  # type: ignore[arg-type]
    # write-backs
    "write_back values wrong shape": lambda ps: ps.write_back(
        "emb", KEYS, np.ones((3, 3)), None, ZERO, ZERO + 1
    ),
    "write_back state wrong shape": lambda ps: ps.write_back(
        "emb", KEYS, GRADS, np.ones((3, 2)), ZERO, ZERO + 1
    ),
    "write_back versions float": lambda ps: ps.write_back(
        "emb", KEYS, GRADS, None, np.zeros(3), ZERO + 1
    ),
    "write_back versions beyond int64": lambda ps: ps.write_back(
        "emb", KEYS, GRADS, None, ZERO, np.full(3, 2**64 - 1, np.uint64)
    ),
    "write_back versions wrong count": lambda ps: ps.write_back(
        "emb", KEYS, GRADS, None, ZERO[:2], ZERO + 1
    ),
    "write_back values NaN": lambda ps: ps.write_back(
        "emb", KEYS, GRADS * np.nan, None, ZERO, ZERO + 1
    ),
    "write_back duplicate keys": lambda ps: ps.write_back(
        "emb", [1, 1, 2], GRADS, None, ZERO, ZERO + 1
    ),
    "write_back_async keys beyond int64": lambda ps: ps.write_back_async(
        "emb", [2**63, 1, 2], GRADS, None, ZERO, ZERO + 1
    ),
    # tables
    "create_table bad name": lambda ps: ps.create_table("a b", 4, SGD()),
    "create_table name not a string": lambda ps: ps.create_table(b"emb", 4, SGD()),  # type: ignore[arg-type]
    "create_table name 10k": lambda ps: ps.create_table("x" * 10_000, 4, SGD()),
    "create_table dim 0": lambda ps: ps.create_table("t2", 0, SGD()),
    "create_table dim float": lambda ps: ps.create_table("t2", 4.0, SGD()),  # type: ignore[arg-type]
    "create_table dim string": lambda ps: ps.create_table("t2", "4", SGD()),  # type: ignore[arg-type]
    "create_table optimizer missing": lambda ps: ps.create_table("t2", 4, None),  # type: ignore[arg-type]
    "create_table initializer wrong": lambda ps: ps.create_table("t2", 4, SGD(), "normal"),  # type: ignore[arg-type]
    "create_table update mode unknown": lambda ps: ps.create_table("t2", 4, SGD(), None, "later"),
    "create_table update mode wrong type": lambda ps: ps.create_table("t2", 4, SGD(), None, 3),  # type: ignore[arg-type]
    "describe_table not a string": lambda ps: ps.describe_table(None),  # type: ignore[arg-type]
    "describe_table too long": lambda ps: ps.describe_table("d" * 10_000),
    # dense
    "create_dense size 0": lambda ps: ps.create_dense("d", 0, SGD()),
    "create_dense size float": lambda ps: ps.create_dense("d", 2.5, SGD()),  # type: ignore[arg-type]
    "create_dense row width 0": lambda ps: ps.create_dense("d", 8, SGD(), row_width=0),
    "create_dense initial wrong size": lambda ps: ps.create_dense("d", 8, SGD(), np.ones(7)),
    "pull_dense not a dense": lambda ps: ps.pull_dense("emb"),  # type: ignore[arg-type]
    "push_dense wrong size": lambda ps: ps.push_dense_gradients(
        DenseParameter("emb", 8, 4), np.ones(5), 0
    ),
    "push_dense NaN": lambda ps: ps.push_dense_gradients(
        DenseParameter("emb", 8, 4), np.full(8, np.nan), 0
    ),
    # prefetch and keysets
    "prefetch keys beyond int64": lambda ps: ps.prefetch("emb", [2**64 - 1]),
    "prefetch_keyset missing file": lambda ps: ps.prefetch_keyset("emb", "/nonexistent/keys"),
    "prefetch_keyset path not a string": lambda ps: ps.prefetch_keyset("emb", 5),  # type: ignore[arg-type]
    # snapshots
    "save empty path": lambda ps: ps.save(""),
    "save NUL in path": lambda ps: ps.save("snap\0shot"),
    "save path too long": lambda ps: ps.save("p" * 5000),
    "save path not a string": lambda ps: ps.save(None),  # type: ignore[arg-type]
    "load empty path": lambda ps: ps.load(""),
    "load NUL in path": lambda ps: ps.load("snap\0shot"),
    "load path too long": lambda ps: ps.load("p" * 5000),
    "load path a number": lambda ps: ps.load(3),  # type: ignore[arg-type]
    "export since float": lambda ps: ps.export_incremental(0.5),  # type: ignore[arg-type]
    "export since beyond int64": lambda ps: ps.export_incremental(2**63),
    "export table not a string": lambda ps: ps.export_incremental(-1, 5),  # type: ignore[arg-type]
    "export table too long": lambda ps: ps.export_incremental(-1, "e" * 10_000),
    # claims (the scheduler's fence)
    "claim run id not a string": lambda ps: ps.claim(7, 1, 30.0),  # type: ignore[arg-type]
    "claim run id empty": lambda ps: ps.claim("", 1, 30.0),
    "claim run id too long": lambda ps: ps.claim("r" * 10_000, 1, 30.0),
    "claim epoch float": lambda ps: ps.claim("run", 1.5, 30.0),  # type: ignore[arg-type]
    "claim epoch 0": lambda ps: ps.claim("run", 0, 30.0),
    "claim lease string": lambda ps: ps.claim("run", 1, "30"),  # type: ignore[arg-type]
    "claim lease NaN": lambda ps: ps.claim("run", 1, float("nan")),
    "claim force not a bool": lambda ps: ps.claim("run", 1, 30.0, force="yes"),  # type: ignore[arg-type]
    "renew_claim lease 0": lambda ps: ps.renew_claim(0.0),
    "release_claim epoch string": lambda ps: ps.release_claim("run", "1"),  # type: ignore[arg-type]
}


# A well-formed path to a file that is not there: the file system's answer, not the caller's.
NOT_INVALID: dict[str, type[HeraldError]] = {
    "prefetch_keyset missing file": NotFound,
    "renew_claim lease 0": FailedPrecondition,  # before any claim: the state, not the argument
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_arguments_raise_only_heraldps_errors(ps: PSClient, name: str) -> None:
    error = _outcome(BAD_CALLS[name], ps)
    assert error is not None, f"{name}: accepted"
    assert isinstance(error, HeraldError), f"{name}: {type(error).__module__}.{error!r}"
    expected = NOT_INVALID.get(name, InvalidArgument)
    assert isinstance(error, expected), f"{name}: {type(error).__name__}: {error}"
    assert len(str(error)) < 1000, f"{name}: echoes its input: {str(error)[:200]}..."
    assert _rows(ps) == 0  # nothing reached a row


def test_constructor_and_module_functions_raise_heraldps_errors(tmp_path: Path) -> None:
    bad_clients: list[Callable[[], Any]] = [
        lambda: PSClient([]),
        lambda: PSClient("127.0.0.1:7001"),  # a string, not a list of addresses
        lambda: PSClient([7001]),  # type: ignore[list-item]
        lambda: PSClient(["127.0.0.1:7001"], max_message_mb=0),
        lambda: PSClient(["127.0.0.1:7001"], timeout=0),
        lambda: PSClient(["127.0.0.1:7001"], retries=-1),
        lambda: PSClient(["127.0.0.1:7001"], backoff_seconds=-1.0),
    ]
    for make in bad_clients:
        with pytest.raises(InvalidArgument):
            make()
    odd = tmp_path / "odd.keys"
    odd.write_bytes(b"\0" * 12)  # not a multiple of 8 bytes
    with pytest.raises(InvalidArgument, match="multiple of 8"):
        read_keyset(str(odd))
    with pytest.raises(HeraldError):
        read_keyset(str(tmp_path / "missing.keys"))
    with pytest.raises(InvalidArgument):
        write_keyset(str(tmp_path / "k.keys"), [2**64 - 1])
    with pytest.raises(InvalidArgument):
        write_keyset(str(tmp_path / "k.keys"), [1.5])
    with pytest.raises(HeraldError):
        write_keyset(str(tmp_path / "no-such-dir" / "k.keys"), [1])
    dense = DenseParameter("d", 8, 4)
    with pytest.raises(InvalidArgument):
        dense.to_rows(np.ones(9))
    with pytest.raises(InvalidArgument):
        dense.to_rows(["a"] * 8)


def test_wait_ready_raises_a_heraldps_error() -> None:
    with PSClient(["127.0.0.1:1"]) as client, pytest.raises(HeraldError, match="not reachable"):
        client.wait_ready(timeout=0.2)
