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

from worker_client.timing import PHASES


def heraldps_local(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher", "local", *args]


def test_local_writes_the_report_and_the_plot(tmp_path: Path) -> None:
    report, plot = tmp_path / "report.json", tmp_path / "curves.png"
    done = subprocess.run(
        heraldps_local("--modes", "naive,herald,het", "--iterations", "4", "--workers", "2",
                       "--json", str(report), "--plot", str(plot)),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads(report.read_text())
    modes = written["modes"]
    assert list(modes) == ["naive", "herald", "het"]
    assert written["config"]["link_mbit"] is None  # loopback (--link-mbit: test_local_network)
    assert written["config"]["ps_link_mbit"] is None
    for counts in modes.values():
        assert {"pulls", "pushes", "final_flush", "auc", "logloss"} <= set(counts)
        assert counts["pulls"] > 0 and 0.0 < counts["auc"] < 1.0
    assert modes["herald"]["pushes"] < modes["naive"]["pushes"]
    for counts in modes.values():
        assert (
            counts["moved_with_flush"] == counts["pulls"] + counts["pushes"] + counts["final_flush"]
        )
        assert counts["sample_bytes"] > 0  # the samples travelled with the plans
        # The time breakdown: every phase, a network share, a median speed.
        assert set(counts["phases_median"]) == set(PHASES)
        assert counts["phases_median"]["compute"] > 0 and counts["phases_median"]["pull"] > 0
        assert 0.0 < counts["network_share"] < 1.0
        assert counts["samples_per_second_median"] > 0
        assert counts["dense_bytes"] > 0
        for row in counts["per_iteration"]:
            assert (
                set(row["phases"]) == set(PHASES)
                and row["period"] >= sum(row["phases"].values()) / 2
            )  # the slowest worker's period vs the workers' mean phases
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = done.stdout
    assert "PS agrees: the shards' counters equal the workers' counts in every mode" in out
    # Not a terminal: plain progress lines, and a summary that fits 100 columns.
    assert "herald: iteration 4/4" in out and "het: done, 4 iterations" in out
    assert max(len(line) for line in out.splitlines()) <= 100, out
    naive_row = next(line for line in out.splitlines() if line.startswith("│ naive"))
    moved = modes["naive"]["moved_with_flush"]
    assert f"{moved:,}" in naive_row and "1.00" in naive_row


def test_local_wide_view_has_every_count(tmp_path: Path) -> None:
    done = subprocess.run(
        heraldps_local("--modes", "naive,herald", "--iterations", "3", "--workers", "2",
                       "--wide", "--progress-every", "1"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "written back" in out and "incl. flush" in out and "PS agrees" in out
    # A line for each committed iteration the launcher sees (every 0.05 s; under load two
    # commits can fall between two looks), always the last one, and the mode's end.
    assert "naive: iteration 3/3" in out and "naive: done, 3 iterations" in out


def tiny_csv(path: Path, rows: int, header: bool = True) -> Path:
    """A small CSV with two categorical columns and a label; every row has new keys."""
    lines = ["user,item,click"] if header else []
    lines += [f"u{i},i{i},{i % 2}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--iterations", "0"], "argument --iterations: must be >= 1, got 0"),
        (["--cache-fraction", "2"], "argument --cache-fraction: must be in (0, 1], got 2"),
        (["--shards", "0"], "argument --shards: must be >= 1, got 0"),
        (["--device", "gpu"], "--device gpu needs CuPy and a CUDA GPU"),
        (["--modes", "herald,fast"], "--modes takes a comma-separated subset"),
        (["--ps-link-mbit", "100"], "--ps-link-mbit sets the PS shards' links: add --link-mbit"),
        (["--link-mbit", "0"], "argument --link-mbit: must be a finite number > 0, got 0"),
        (["--hidden-layers", "64,0"], "--hidden-layers widths must be >= 1, got 64,0"),
        (["--hidden-layers", "64,x"], "argument --hidden-layers: must be comma-separated integers"),
        (["--activation", "gelu"], "argument --activation: invalid choice: 'gelu'"),
        (["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),
        (
            ["--batch-norm", "--dense-sync", "ps"],
            "--batch-norm needs the workers' dense all-reduce, which also sums the batch "
            "statistics: use --dense-sync allreduce (or auto) instead of --dense-sync ps",
        ),
        (
            ["--worker-timeout", "-1"],
            "argument --worker-timeout: must be a finite number >= 0, got -1",
        ),
        (["--embedding-l2", "-0.1"], "argument --embedding-l2: must be a finite number >= 0"),
        (
            ["--look-ahead", "33"],
            "argument --look-ahead: --look-ahead must be 1 (one batch, the "
            "default) to 32 batches, got 33",
        ),
        (
            ["--data", "CSV_NOHEADER", "--format", "csv"],
            "read as the header, is: 'u0,i0,0' (if that is data, add a header line",
        ),
        (["--data", "CSV", "--format", "csv"], "--format csv needs --sparse-columns"),
        (
            [
                "--data",
                "CSV",
                "--format",
                "csv",
                "--sparse-columns",
                "user,item",
                "--label-column",
                "click",
            ],
            "up to 256 distinct rows, but the cache holds 180 (0.1 of 1,800 distinct keys): use "
            "--cache-fraction 0.143 or more, or a smaller --batch-size-per-worker",
        ),
    ],
)
def test_bad_configurations_fail_in_one_line_before_anything_starts(
    args: list[str], message: str, tmp_path: Path
) -> None:
    if args[0] == "--device":
        pytest.importorskip("numpy")  # always there; the check below needs CuPy absent
        from worker_client.device import gpu_available

        if gpu_available():
            pytest.skip("a GPU is usable here")
    paths = {"CSV": str(tiny_csv(tmp_path / "mine.csv", 1000)),
             "CSV_NOHEADER": str(tiny_csv(tmp_path / "raw.csv", 10, header=False))}  # fmt: skip
    workdir = tmp_path / "work"
    done = subprocess.run(
        heraldps_local(*[paths.get(a, a) for a in args], "--workdir", str(workdir)),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2  # a bad command line or configuration, as argparse's
    assert message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not workdir.exists()  # no process was started


# Ctrl-C in a terminal reaches a launcher whose SIGINT is the default. A test run started in
# the background of a script (`bash .ci/run &`) has SIGINT ignored (POSIX), and children inherit
# that: Python then installs no KeyboardInterrupt handler, and the launcher never sees the
# Ctrl-C. So the launcher starts with the default, as from a terminal.
DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, sys.argv[1:])"
)


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", DEFAULT_SIGINT,
         *heraldps_local("--modes", "herald", "--epochs", "200", "--workdir", str(tmp_path))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
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
    finally:  # a failure leaves no 200-epoch cluster behind: its lifeline follows the launcher
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
