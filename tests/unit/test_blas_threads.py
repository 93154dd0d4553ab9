"""Workers share the machine's cores: each gets its share of BLAS threads, unless the user
chose a number."""

from __future__ import annotations

import pytest

from heraldps.cores import CORES
from launcher.cluster import blas_threads


def test_each_worker_gets_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert blas_threads(1) == {"OPENBLAS_NUM_THREADS": str(CORES)}
    assert blas_threads(CORES) == {"OPENBLAS_NUM_THREADS": "1"}
    assert blas_threads(4 * CORES) == {"OPENBLAS_NUM_THREADS": "1"}  # never 0


def test_a_number_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    assert blas_threads(4) == {}  # the child inherits the user's 3
