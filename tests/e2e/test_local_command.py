"""``heraldps local`` as a user runs it: report files, and a clean stop on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def heraldps_local(*args: str) -> list[str]:
    return [sys.executable, "-m", "heraldps.cli", "local", *args]


def test_local_writes_the_report_and_the_plot(tmp_path: Path) -> None:
    report, plot = tmp_path / "report.json", tmp_path / "curves.png"
    done = subprocess.run(
        heraldps_local("--modes", "naive,herald,het", "--iterations", "4", "--workers", "2",
                       "--json", str(report), "--plot", str(plot)),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    modes = json.loads(report.read_text())["modes"]
    assert list(modes) == ["naive", "herald", "het"]
    for counts in modes.values():
        assert {"pulls", "pushes", "final_flush", "auc", "logloss"} <= set(counts)
        assert counts["pulls"] > 0 and 0.0 < counts["auc"] < 1.0
    assert modes["herald"]["pushes"] < modes["naive"]["pushes"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "PS agrees" in done.stdout and " NO " not in done.stdout


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        heraldps_local("--modes", "herald", "--epochs", "200", "--workdir", str(tmp_path)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    pid_file = tmp_path / "herald" / "worker-0.pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "interrupted" in output
    for pid_path in (tmp_path / "herald").glob("*.pid"):
        pid = int(pid_path.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
