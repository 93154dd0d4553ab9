"""Names and paths in requests are bounded, and no error echoes a caller's input whole
(issue 23, section 3): sent with plain gRPC stubs, as any client could, past PSClient's own
checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from heraldps import wire
from heraldps.optim import SGD
from heraldps.v1 import ps_pb2, ps_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests.conftest import ClusterFactory

LONG = "x" * 10_000
KEYS = wire.encode_keys(np.arange(2))


@pytest.fixture
def stub(cluster: ClusterFactory, tmp_path: Path) -> Iterator[ps_pb2_grpc.ParameterServerStub]:
    servers, client = cluster(1, snapshot_root=str(tmp_path / "snapshots"))
    client.create_table("emb", 4, SGD())
    with grpc.insecure_channel(f"127.0.0.1:{servers[0].port}") as channel:
        yield ps_pb2_grpc.ParameterServerStub(channel)


def _status(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    error = err.value
    assert isinstance(error, grpc.Call)
    return error.code(), error.details() or ""


def _short(details: str) -> None:
    assert len(details) < 600, details[:300]


TABLE_CALLS: dict[str, Callable[[ps_pb2_grpc.ParameterServerStub, str], Any]] = {
    "Pull": lambda s, t: s.Pull(ps_pb2.PullRequest(table=t, keys=KEYS)),
    "GetVersions": lambda s, t: s.GetVersions(ps_pb2.GetVersionsRequest(table=t, keys=KEYS)),
    "Prefetch": lambda s, t: s.Prefetch(ps_pb2.PrefetchRequest(table=t, keys=KEYS)),
    "DescribeTable": lambda s, t: s.DescribeTable(ps_pb2.DescribeTableRequest(table=t)),
    "PushGradients": lambda s, t: s.PushGradients(
        ps_pb2.PushGradientsRequest(table=t, keys=KEYS, grads=wire.encode_floats(np.ones((2, 4))))
    ),
    "WriteBack": lambda s, t: s.WriteBack(ps_pb2.WriteBackRequest(table=t, keys=KEYS)),
    "ExportIncremental": lambda s, t: list(
        s.ExportIncremental(ps_pb2.ExportIncrementalRequest(table=t, since_iteration=-1))
    ),
    "CreateTable": lambda s, t: s.CreateTable(
        ps_pb2.CreateTableRequest(
            spec=types_pb2.TableSpec(name=t, dim=4, optimizer=SGD().to_proto())
        )
    ),
}


@pytest.mark.parametrize("method", list(TABLE_CALLS))
def test_a_huge_table_name_is_invalid_argument_with_a_short_message(
    stub: ps_pb2_grpc.ParameterServerStub, method: str
) -> None:
    code, details = _status(lambda: TABLE_CALLS[method](stub, LONG))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])
    assert "10000" in details  # the length is said; the name is not echoed whole
    _short(details)


def test_an_unknown_name_within_the_bound_is_not_found_and_shortened(
    stub: ps_pb2_grpc.ParameterServerStub,
) -> None:
    code, details = _status(lambda: TABLE_CALLS["Pull"](stub, "y" * 250))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "250 characters" in details and "'emb'" in details
    _short(details)


@pytest.mark.parametrize("method", ["Save", "Load"])
def test_a_nul_byte_in_a_path_is_invalid_argument(
    stub: ps_pb2_grpc.ParameterServerStub, method: str
) -> None:
    request = (ps_pb2.SaveRequest if method == "Save" else ps_pb2.LoadRequest)(path="run\0one")
    code, details = _status(lambda: getattr(stub, method)(request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "NUL" in details


@pytest.mark.parametrize("method", ["Save", "Load"])
def test_a_path_over_4096_bytes_is_invalid_argument(
    stub: ps_pb2_grpc.ParameterServerStub, method: str
) -> None:
    request = (ps_pb2.SaveRequest if method == "Save" else ps_pb2.LoadRequest)(path=LONG)
    code, details = _status(lambda: getattr(stub, method)(request))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])
    assert "4096" in details
    _short(details)


def test_a_refused_path_is_echoed_shortened(stub: ps_pb2_grpc.ParameterServerStub) -> None:
    path = "/" + "z" * 4000  # within the bound, outside the snapshot root
    code, details = _status(lambda: stub.Save(ps_pb2.SaveRequest(path=path)))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    _short(details)


def test_the_scheduler_shortens_a_huge_table_name() -> None:
    server = SchedulerServer(SchedulerConfig(workers=1, cache_rows=4, port=0))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            code, details = _status(
                lambda: stub.SubmitBatch(scheduler_pb2.SubmitBatchRequest(table=LONG))
            )
    finally:
        server.stop(grace=0)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])
    _short(details)
