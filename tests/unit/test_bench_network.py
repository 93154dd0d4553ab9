"""benchmarks/bench_network.py: the crossover figures, from a result without a network."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks import load_benchmark

bn = load_benchmark("bench_network")


def row(
    data: str, rate: float, variant: str, whole_vs_naive: float, share: float
) -> dict[str, Any]:
    """The fields of one bench_network result row that the crossover reads."""
    return {"data": data, "link_mbit": rate, "variant": variant,
            "whole_vs_naive": whole_vs_naive, "embedding_share": share}  # fmt: skip


ROWS = [
    row("dim 64", 100.0, "naive", 1.0, 0.9),
    row("dim 64", 100.0, "herald", 1.4, 0.88),
    row("dim 64", 100.0, "herald dense@ps", 1.1, 0.5),
    row("dim 16", 100.0, "naive", 1.0, 0.3),
    row("dim 16", 100.0, "herald", 0.95, 0.29),
    row("dim 16", 10.0, "herald", 0.9, 0.29),  # no naive at this rate: left out
]


def test_crossover_points_pair_each_variant_with_naive_share() -> None:
    # naive's share of the same (data, rate), sorted by share; naive and dense@ps left out
    assert bn.crossover_points(ROWS) == {"herald @ 100 Mbit/s": [(0.3, 0.95), (0.9, 1.4)]}


def test_embedding_share() -> None:
    assert bn.embedding_share(3.0, 1.0) == 0.75
    assert bn.embedding_share(0.0, 0.0) != bn.embedding_share(0.0, 0.0)  # nan


def test_plot_crossover_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "crossover.png"
    bn.plot_crossover(ROWS, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hidden_widths() -> None:
    assert bn.hidden_widths("64,32/1024,512/") == [(64, 32), (1024, 512), ()]


def test_replot_pairs_each_run_with_its_own_naive(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"results": ROWS[:2]}))
    again = [row("dim 64", 100.0, "naive", 1.0, 0.5), row("dim 64", 100.0, "herald", 2.0, 0.4)]
    second.write_text(json.dumps({"results": again}))
    tagged = [{**r, "run": "a.json"} for r in ROWS[:2]] + [{**r, "run": "b.json"} for r in again]
    assert bn.crossover_points(tagged) == {"herald @ 100 Mbit/s": [(0.5, 2.0), (0.9, 1.4)]}
    pytest.importorskip("matplotlib")
    assert bn.replot([first, second], tmp_path / "out.json") == 0
    assert (tmp_path / "out_crossover.png").read_bytes()[:4] == b"\x89PNG"
