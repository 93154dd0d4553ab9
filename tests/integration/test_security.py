"""TLS, mutual TLS, role tokens, worker sessions and the snapshot root, on real servers.

Certificates come from ``openssl`` in each test's temporary directory
(``tests.certs``); every server listens on 127.0.0.1 with an ephemeral port.
"""

from __future__ import annotations

import contextlib
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from heraldps.auth import SESSION_METADATA_KEY
from heraldps.client import PSClient
from heraldps.errors import PermissionDenied, Unauthenticated, Unavailable
from heraldps.healthcheck import check
from heraldps.optim import SGD
from heraldps.security import ClientSecurity, ServerSecurity, open_channel
from heraldps.tls import TlsFiles
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from ps_server.server import PSConfig, PSServer
from scheduler_service.server import SchedulerConfig, SchedulerServer
from tests.certs import Pki, make_pki

ADMIN_TOKEN = "admin-" + "a" * 32
WORKER_TOKEN = "worker-" + "w" * 32


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def token_files(tmp_path: Path) -> tuple[str, str]:
    admin, worker = tmp_path / "admin.token", tmp_path / "worker.token"
    admin.write_text(ADMIN_TOKEN + "\n")
    worker.write_text(WORKER_TOKEN)
    return str(admin), str(worker)


@contextlib.contextmanager
def shard(**config: object) -> Iterator[PSServer]:
    server = PSServer(PSConfig(port=0, metrics_port=0, grace_seconds=0, **config))  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=0)


def client(server: PSServer, **security: object) -> PSClient:
    """A client with a short deadline and few retries: refusals come back quickly."""
    return PSClient(
        [f"127.0.0.1:{server.port}"],
        timeout=5,
        retries=1,
        security=ClientSecurity(**security),  # type: ignore[arg-type]
    )


def tls(cert: str | None = None, key: str | None = None, ca: str | None = None) -> TlsFiles:
    return TlsFiles(cert, key, ca)


# ----- TLS and mutual TLS ----------------------------------------------------------------


def test_tls_shard_serves_tls_clients_and_refuses_plaintext(pki: Pki) -> None:
    security = ServerSecurity(tls(pki.server_cert, pki.server_key))
    with shard(security=security) as server:
        with client(server, tls=tls(ca=pki.ca)) as ps:
            ps.create_table("emb", dim=4, optimizer=SGD(lr=0.5))
            values, versions = ps.pull("emb", [1, 2])
            assert values.shape == (2, 4) and list(versions) == [0, 0]
        with client(server) as plain, pytest.raises(Unavailable):
            plain.list_tables()
        # A client that trusts another CA does not trust this server.
        with client(server, tls=tls(ca=pki.other_ca)) as doubting, pytest.raises(Unavailable):
            doubting.list_tables()
        # Health over TLS answers; over plaintext the server is not reachable.
        address = f"127.0.0.1:{server.port}"
        assert check(address, security=ClientSecurity(tls(ca=pki.ca))).serving
        assert not check(address, timeout=2).serving


def test_mutual_tls_refuses_clients_without_a_certificate_of_its_ca(pki: Pki) -> None:
    security = ServerSecurity(tls(pki.server_cert, pki.server_key, pki.ca))
    with shard(security=security) as server:
        with client(server, tls=tls(pki.client_cert, pki.client_key, pki.ca)) as ps:
            ps.create_table("emb", dim=4, optimizer=SGD(lr=0.5))
            assert list(ps.list_tables()) == ["emb"]
        with client(server, tls=tls(ca=pki.ca)) as anonymous, pytest.raises(Unavailable):
            anonymous.list_tables()
        stranger = tls(pki.stranger_cert, pki.stranger_key, pki.ca)
        with client(server, tls=stranger) as foreign, pytest.raises(Unavailable):
            foreign.list_tables()


def test_a_missing_tls_file_fails_the_start_naming_the_flag(pki: Pki, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ValueError, match=r"--tls-key .*nope\.pem.* cannot be read"):
        PSServer(PSConfig(port=0, security=ServerSecurity(tls(pki.server_cert, missing))))
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        TlsFiles(cert=pki.server_cert)


# ----- roles -----------------------------------------------------------------------------


def test_roles_on_the_ps(
    token_files: tuple[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker token: training RPCs only; admin token: everything; no or a wrong token:
    nothing but health; a refused write leaves the rows as they were; the shard logs a
    refusal once per caller host, method and reason, not once per call."""
    admin_file, worker_file = token_files
    security = ServerSecurity(admin_token_file=admin_file, worker_token_file=worker_file)
    with shard(security=security, snapshot_root=str(tmp_path / "snaps")) as server:
        admin = client(server, token=ADMIN_TOKEN)
        worker = client(server, token=WORKER_TOKEN)
        nobody = client(server)
        forger = client(server, token="x" * 40)
        admin.create_table("emb", dim=2, optimizer=SGD(lr=1.0))
        keys = np.array([1, 2], np.int64)
        before, versions = worker.pull("emb", keys)
        worker.push_gradients("emb", keys, np.ones((2, 2), np.float32), iteration=0)
        with pytest.raises(PermissionDenied, match="needs the admin role"):
            worker.commit(0)
        for admin_call in (
            lambda: worker.save("s1"),
            lambda: worker.load("s1"),
            lambda: worker.create_table("other", dim=2, optimizer=SGD(lr=1.0)),
            lambda: worker.export_incremental(-1),
        ):
            with pytest.raises(PermissionDenied):
                admin_call()
        for outsider, match in ((nobody, "needs a token"), (forger, "not one this server")):
            with pytest.raises(Unauthenticated, match=match):
                outsider.pull("emb", keys)
            with pytest.raises(Unauthenticated):
                outsider.write_back(
                    "emb", keys, np.full((2, 2), 9.0, np.float32), None, versions, versions + 5
                )
        assert np.array_equal(worker.pull("emb", keys)[0], before)  # nothing written
        for _ in range(3):
            with pytest.raises(Unauthenticated):
                nobody.pull("emb", keys)
        logged = [r.getMessage() for r in caplog.records if r.name == "heraldps.auth"]
        assert any("needs a token" in m for m in logged), logged
        assert any("not one this server accepts" in m for m in logged), logged
        assert len(logged) == len(set(logged)), logged  # each refusal once, not per call
        assert admin.commit(0) == 2
        assert admin.save("s1") == 2
        assert check(f"127.0.0.1:{server.port}").serving  # probes need no token
        for c in (admin, worker, nobody, forger):
            c.close()


def test_token_files_are_checked_at_start(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("secret")
    with pytest.raises(ValueError, match="at least 16 characters"):
        PSServer(PSConfig(port=0, security=ServerSecurity(admin_token_file=str(short))))
    good = tmp_path / "good"
    good.write_text("g" * 20)
    with pytest.raises(ValueError, match="needs --admin-token-file"):
        PSServer(PSConfig(port=0, security=ServerSecurity(worker_token_file=str(good))))


@contextlib.contextmanager
def scheduler(
    security: ServerSecurity, workers: int = 2, worker_timeout: float = 60.0
) -> Iterator[SchedulerServer]:
    config = SchedulerConfig(
        workers=workers, cache_rows=10, mode="naive", port=0, grace_seconds=0, security=security,
        worker_timeout=worker_timeout,
    )  # fmt: skip
    server = SchedulerServer(config)
    server.start()
    try:
        yield server
    finally:
        server.stop(grace=0)


def stub(server: SchedulerServer, **security: object) -> scheduler_pb2_grpc.SchedulerStub:
    channel = open_channel(f"127.0.0.1:{server.port}", (), ClientSecurity(**security))  # type: ignore[arg-type]
    return scheduler_pb2_grpc.SchedulerStub(channel)


def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        result = call()  # type: ignore[operator]
        if hasattr(result, "__next__"):
            next(result)
    return err.value.code(), err.value.details() or ""


def test_scheduler_refuses_foreign_finish_and_forged_reports(
    token_files: tuple[str, str], pki: Pki
) -> None:
    """Over mutual TLS with tokens: Finish needs admin; ReportDone and WatchPlans need
    the session of the latest registration of that worker id."""
    admin_file, worker_file = token_files
    server_tls = tls(pki.server_cert, pki.server_key, pki.ca)
    client_tls = tls(pki.client_cert, pki.client_key, pki.ca)
    with scheduler(ServerSecurity(server_tls, admin_file, worker_file)) as server:
        worker = stub(server, tls=client_tls, token=WORKER_TOKEN)
        admin = stub(server, tls=client_tls, token=ADMIN_TOKEN)
        nobody = stub(server, tls=client_tls)
        status = scheduler_pb2.GetStatusRequest()
        assert code_of(lambda: nobody.GetStatus(status))[0] == grpc.StatusCode.UNAUTHENTICATED
        code, text = code_of(lambda: worker.Finish(scheduler_pb2.FinishRequest()))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in text
        assert not worker.GetStatus(status).finished

        _, call = worker.RegisterWorker.with_call(scheduler_pb2.RegisterWorkerRequest(worker_id=0))
        session = dict(call.trailing_metadata())[SESSION_METADATA_KEY]
        report = scheduler_pb2.ReportDoneRequest(worker_id=0, iteration=0)
        # Worker 1 never registered; worker 0's report without, or with a made-up, session.
        for forged, metadata in (
            (scheduler_pb2.ReportDoneRequest(worker_id=1, iteration=0), ()),
            (report, ()),
            (report, ((SESSION_METADATA_KEY, "0" * 32),)),
            (scheduler_pb2.ReportDoneRequest(worker_id=1, iteration=0),
             ((SESSION_METADATA_KEY, session),)),
        ):  # fmt: skip
            code, text = code_of(lambda r=forged, m=metadata: worker.ReportDone(r, metadata=m))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "session" in text
        watch = scheduler_pb2.WatchPlansRequest(worker_id=0)
        assert code_of(lambda: worker.WatchPlans(watch))[0] == grpc.StatusCode.PERMISSION_DENIED
        assert worker.GetStatus(status).reported.pulled_rows == 0  # no report counted

        # Worker 0's session is live: only an admin's take_over registers it again, and that
        # shuts the old session out (tests/integration/test_worker_sessions.py: the rest).
        code, _ = code_of(
            lambda: worker.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(worker_id=0))
        )
        assert code == grpc.StatusCode.ALREADY_EXISTS
        take_over = scheduler_pb2.RegisterWorkerRequest(worker_id=0, take_over=True)
        _, again = admin.RegisterWorker.with_call(take_over)
        fresh = dict(again.trailing_metadata())[SESSION_METADATA_KEY]
        assert fresh != session
        stale = ((SESSION_METADATA_KEY, session),)
        assert code_of(lambda: worker.ReportDone(report, metadata=stale))[0] == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        # With the right session the call reaches the barrier (no batch yet: its own error).
        mine = ((SESSION_METADATA_KEY, fresh),)
        code, _ = code_of(lambda: worker.ReportDone(report, metadata=mine))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert admin.Finish(scheduler_pb2.FinishRequest()).final_flush == 0
        assert admin.GetStatus(status).finished


# ----- snapshot root ---------------------------------------------------------------------


def test_save_and_load_stay_under_the_snapshot_root(tmp_path: Path) -> None:
    root = tmp_path / "snaps"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    with shard(snapshot_root=str(root)) as server, client(server) as ps:
        ps.create_table("emb", dim=2, optimizer=SGD(lr=1.0))
        ps.pull("emb", [1, 2, 3])
        assert ps.save("run1/it-0") == 3
        assert (root / "run1" / "it-0").is_dir()
        assert ps.load(str(root / "run1" / "it-0")) == 3  # absolute, under the root: fine
        messages = set()
        for path in (
            "/etc/heraldps",  # absolute, outside (the Save into /etc)
            "/etc",  # exists
            str(tmp_path / "no-such-dir"),  # does not exist
            "../outside",  # .. out of the root
            "escape/snap",  # a symlink out of the root
            ".",  # the root itself
        ):
            for call in (ps.save, ps.load):
                with pytest.raises(PermissionDenied) as err:
                    call(path)
                messages.add(err.value.message.replace(repr(path), "PATH").split(":", 1)[1])
        # One message whatever the path: it tells nothing about what exists.
        assert len(messages) == 1, messages
        assert not any(outside.iterdir()) and not Path("/etc/heraldps").exists()


def test_snapshot_root_and_data_dir_must_not_overlap(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overlap"):
        PSConfig(
            store="cached", data_dir=str(tmp_path / "d"), snapshot_root=str(tmp_path), cache_gb=0.01
        )


# ----- defaults: loopback, metrics on the gRPC host, reflection switch ---------------------


def _reachable(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


def test_servers_bind_loopback_by_default_and_metrics_follow_the_host() -> None:
    """127.0.0.2 is loopback too, but a socket bound to 127.0.0.1 does not answer there;
    one bound to every interface does."""
    assert PSConfig().host == "127.0.0.1"
    assert SchedulerConfig(workers=1, cache_rows=1).host == "127.0.0.1"
    with shard() as server:
        assert server.metrics_port
        for port in (server.port, server.metrics_port):
            assert _reachable("127.0.0.1", port)
            assert not _reachable("127.0.0.2", port)
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read()
        assert b"heraldps_ps" in text
    with shard(host="0.0.0.0") as everywhere:
        assert everywhere.metrics_port
        assert _reachable("127.0.0.2", everywhere.port)
        assert _reachable("127.0.0.2", everywhere.metrics_port)


def test_reflection_can_be_switched_off() -> None:
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    for reflect, expected in ((True, None), (False, grpc.StatusCode.UNIMPLEMENTED)):
        with (
            shard(security=ServerSecurity(reflection=reflect)) as server,
            grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        ):
            info = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo
            try:
                answer = next(iter(info(iter([request]), timeout=5)))
                got = None
                names = [s.name for s in answer.list_services_response.service]
                assert "heraldps.v1.ParameterServer" in names
            except grpc.RpcError as err:
                got = err.code()
            assert got == expected
