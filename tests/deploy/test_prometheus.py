"""A live cluster scraped by a real Prometheus: every dashboard and rule query returns data.

Two PS shards, the Herald scheduler and two workers train the bundled Criteo sample
as real ``heraldps`` processes with ``--metrics-port``. Debian's ``prometheus`` binary
scrapes them with deploy/prometheus/prometheus.yml, where only the targets are
rewritten to the processes' real ports (same job names; ``instance`` keeps the
compose names) and rule_files points at the real rules.yml. While the workers wait
for their next plan, every PromQL expression of the Grafana dashboard and of the
rules is evaluated through Prometheus' HTTP API, and every process's /metrics
passes ``promtool check metrics``. At the end a shard is stopped and Prometheus
itself must raise HeraldPSShardDown for it, and nothing else.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from heraldps.bundled import bundled_data
from heraldps.client import PSClient
from heraldps.job import TrainingJob
from heraldps.samples import encode_samples
from heraldps.serving import channel_options
from heraldps.v1 import scheduler_pb2, scheduler_pb2_grpc
from launcher.cluster import (
    ManagedProcess,
    ps_process,
    scheduler_process,
    start_servers,
    worker_process,
)
from scheduler_service.simulate import cache_rows_for
from tests.deploy.observability import (
    RULES,
    comparisons_as_bool,
    dashboard_expressions,
    load_yaml,
    prometheus_api,
    rule_expressions,
    scraping_every,
)
from tests.tools import require_tool
from worker_client.minibatch import global_batches

HINT = "apt-get install prometheus (Debian's package ships prometheus and promtool)"
FIRST_BATCHES = 10  # fed before the checks: iterations 0..8 get committed
ITERATIONS = 14
SCRAPE = "1s"
DEADLINE_SECONDS = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """A real Prometheus on 127.0.0.1 scraping the given targets with our config and rules."""

    def __init__(self, binary: str, workdir: Path, targets: dict[str, int]) -> None:
        workdir.mkdir()
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(local_config(targets)))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={self.config_path}",
                 f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.wait_for("Prometheus ready", self._ready, 30)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        return prometheus_api(self.url, path, **params)

    def query(self, promql: str) -> list[dict[str, Any]]:
        data = self.api("query", query=promql)
        result: list[dict[str, Any]] = (
            data["result"] if data["resultType"] == "vector" else [{"value": data["result"]}]
        )
        return result

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, what: str, ready: Callable[[], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for: {what}")
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def local_config(targets: dict[str, int]) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with each compose target replaced by its real
    127.0.0.1 port (``instance`` keeps the compose name), a 1 s scrape and evaluation
    interval, and the real rules.yml. This test feeds batches itself, so the feeder's
    target is left out (tests/deploy/test_compose_docker.py scrapes a real feed)."""
    config = scraping_every(SCRAPE, str(RULES))
    for job in config["scrape_configs"]:
        static = []
        for group in job["static_configs"]:
            for target in group["targets"]:
                if target == "feed:9100":
                    continue
                labels = {**group.get("labels", {}), "instance": target}
                static.append({"targets": [f"127.0.0.1:{targets.pop(target)}"], "labels": labels})
        job["static_configs"] = static
    assert not targets, f"not in deploy/prometheus/prometheus.yml: {sorted(targets)}"
    return config


def submit(stub: scheduler_pb2_grpc.SchedulerStub, iteration: int, batch: Any) -> None:
    """SubmitBatch (whole samples), retrying while the scheduler's backlog is full."""
    request = scheduler_pb2.SubmitBatchRequest(iteration=iteration, batch=encode_samples(batch))
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        try:
            stub.SubmitBatch(request, timeout=30)
            return
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def cleanup() -> Iterator[list[ManagedProcess | Prometheus]]:
    started: list[ManagedProcess | Prometheus] = []
    yield started
    for process in reversed(started):
        process.stop()


def test_every_dashboard_and_rule_query_returns_series(
    tmp_path: Path, cleanup: list[ManagedProcess | Prometheus]
) -> None:
    prometheus_bin = require_tool("prometheus", HINT)
    promtool = require_tool("promtool", HINT)
    train, _ = bundled_data()
    base = TrainingJob(data=str(train), workers=2, batch_size_per_worker=64,
                       iterations=ITERATIONS, embedding_dim=4, hidden=(16,))  # fmt: skip
    dataset = base.read()
    job = replace(base, cache_rows=cache_rows_for(dataset, 0.1))
    batches = global_batches(dataset, job.global_batch, job.iterations, job.epochs)
    job_path = tmp_path / "job.json"
    job_path.write_text(job.to_json())

    shards = [ps_process(i, 2, tmp_path) for i in range(2)]
    cleanup.extend(shards)
    start_servers(shards)
    addresses = [s.address for s in shards]
    with PSClient(addresses) as ps:
        ps.wait_ready()
        job.create_tables(ps)
    scheduler = scheduler_process(job.workers, job.cache_rows, "herald", addresses, tmp_path)
    cleanup.append(scheduler)
    start_servers([scheduler])
    workers = [
        worker_process(w, job_path, scheduler.address, addresses, tmp_path, free_port())
        for w in range(job.workers)
    ]
    cleanup.extend(workers)
    processes = {"ps-0:9100": shards[0], "ps-1:9100": shards[1], "scheduler:9100": scheduler,
                 "worker-0:9100": workers[0], "worker-1:9100": workers[1]}  # fmt: skip
    prometheus = Prometheus(
        prometheus_bin, tmp_path / "prometheus", {k: p.metrics_port for k, p in processes.items()}
    )
    cleanup.append(prometheus)

    # Training starts once Prometheus scrapes every process and both workers registered,
    # and is spread over several scrapes, so rates see it happen.
    # The scheduler's report counters start at 0 when a worker registers; the first scrape
    # must see them at 0, or rate() misses the first reports (the ratios below would be off
    # by an iteration on a busy machine, where registration and iteration 0 fall between
    # two scrapes).
    prometheus.wait_for(
        "every target up and both workers registered",
        lambda: (
            prometheus.value('sum(up{job=~"heraldps-.*"})') == len(processes)
            and len(prometheus.query("heraldps_worker_cache_capacity_rows")) == 2
            and len(prometheus.query('heraldps_scheduler_reported_rows_total{kind="pull"}')) == 2
        ),
        DEADLINE_SECONDS,
    )
    channel = grpc.insecure_channel(scheduler.address, options=channel_options(64 * 2**20))
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    for t in range(FIRST_BATCHES):
        submit(stub, t, batches[t])
        time.sleep(0.4)
    # Batch 9 released the plans of iteration 8; the workers then wait for iteration 9.
    last = FIRST_BATCHES - 2

    def caught_up() -> bool:
        for process in processes.values():
            assert process.proc.poll() is None, f"{process.name} exited:\n{process.log_tail()}"
        reported = prometheus.query(f"heraldps_worker_last_iteration == {last}")
        commits = prometheus.value("heraldps_scheduler_commits_total")
        return len(reported) == 2 and commits == last + 1

    prometheus.wait_for(f"iteration {last} committed and scraped", caught_up, DEADLINE_SECONDS)

    # Live == predicted == what the shards served, as Prometheus sees it.
    def counts_agree() -> bool:
        for kind, ps_kind in (
            ("pull", "pull"),
            ("grad_push", "push"),
            ("write_back", "write_back"),
        ):
            match = f'{{kind="{kind}"}}'
            worker = prometheus.value(f"sum(heraldps_worker_rows_total{match})")
            planned = prometheus.value(f"sum(heraldps_scheduler_planned_rows_total{match})")
            shard = prometheus.value(f'sum(heraldps_ps_{ps_kind}_keys_total{{table="emb"}})')
            if not worker == planned == shard:
                return False
        return True

    prometheus.wait_for("worker, scheduler and shard row counts to agree", counts_agree, 15)
    assert prometheus.value('sum(heraldps_worker_rows_total{kind="pull"})')
    assert prometheus.value("sum(heraldps_scheduler_naive_rows_total)")
    assert prometheus.value("sum(heraldps_scheduler_held_samples_total)")

    # Prometheus evaluated every recording rule after the scrape in which the counts agree:
    # a recorded series keeps its last evaluation, which may have seen the scrape before,
    # with an iteration's plans counted and its reports not yet (a ratio of 8/9, not 1).
    agreed_at = prometheus.value("time()")
    assert agreed_at is not None

    def evaluated_since_agreement() -> bool:
        return all(
            datetime.fromisoformat(group["lastEvaluation"]).timestamp() > agreed_at
            for group in prometheus.api("rules")["groups"]
        )

    prometheus.wait_for("every rule group evaluated after the counts agreed",
                        evaluated_since_agreement, 15)  # fmt: skip
    records = [r["record"] for g in load_yaml(RULES)["groups"] for r in g["rules"] if "record" in r]
    prometheus.wait_for(
        "every recording rule to produce a series",
        lambda: all(prometheus.query(name) for name in records),
        15,
    )
    health = [
        (rule["name"], rule["health"], rule.get("lastError", ""))
        for group in prometheus.api("rules")["groups"]
        for rule in group["rules"]
    ]
    assert len(health) == len(rule_expressions())
    assert all(h == "ok" for _, h, _ in health), health

    empty = []
    expressions = dashboard_expressions() + rule_expressions()
    for expression in expressions:
        result = prometheus.query(expression.promql)  # parses, or raises with the error
        if expression.alert:
            assert not result, f"{expression.where} fires on a healthy cluster: {result}"
            result = prometheus.query(comparisons_as_bool(expression.promql))
        if not result:
            empty.append(f"{expression.where}: {expression.promql}")
    assert not empty, "queries that returned no series:\n" + "\n".join(empty)
    assert len(expressions) > 50

    # The rates saw training, and the ratios the dashboard is about are real numbers.
    def recorded(name: str) -> list[float]:
        return [float(r["value"][1]) for r in prometheus.query(name)]

    assert recorded("job:heraldps_iterations:rate5m")[0] > 0
    assert recorded("mode:heraldps_worker_samples:rate5m")[0] > 0
    (traffic,) = recorded("mode:heraldps_traffic_vs_naive:ratio_rate5m")
    assert 0 < traffic < 2
    (predicted,) = recorded("mode:heraldps_reported_vs_planned:ratio_rate5m")
    assert predicted == pytest.approx(1.0)  # Herald: the workers move exactly the planned rows
    (locality,) = recorded("mode:heraldps_assignment_locality:ratio_rate5m")
    assert 0 <= locality <= 1
    hits = recorded("worker_mode:heraldps_worker_cache_hit:ratio_rate5m")
    assert len(hits) == 2 and all(0 <= h <= 1 for h in hits)
    assert all(v > 0 for v in recorded("shard:heraldps_ps_commit_seconds:p99_rate5m"))

    for name, process in processes.items():
        lint = subprocess.run(
            [promtool, "check", "metrics"], input=process.metrics(), capture_output=True,
            text=True, timeout=30,
        )  # fmt: skip
        problems = lint.stdout + lint.stderr
        assert lint.returncode == 0 and not problems.strip(), f"{name}: {problems}"

    for t in range(FIRST_BATCHES, len(batches)):
        submit(stub, t, batches[t])
    stub.Finish(scheduler_pb2.FinishRequest(), timeout=30)
    channel.close()
    for worker in workers:
        assert worker.proc.wait(DEADLINE_SECONDS) == 0, worker.log_tail()

    # A shard goes away: Prometheus raises HeraldPSShardDown for it (pending, `for: 1m`),
    # and no other alert (finished workers are down too, by design no alert).
    shards[1].stop()

    prometheus.wait_for(
        "an alert after stopping ps-1", lambda: bool(prometheus.query("ALERTS")), 20
    )
    time.sleep(2)  # a few more evaluations: nothing else may fire
    alerts = prometheus.query("ALERTS")
    fired = {(a["metric"]["alertname"], a["metric"].get("instance")) for a in alerts}
    assert fired == {("HeraldPSShardDown", "ps-1:9100")}, alerts
