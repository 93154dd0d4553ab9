"""The fast scheduler's plans, pinned: digests recorded from the scheduler before its
rewrite for 64 workers (issue 22), so every later change plans exactly as it did.

The plain reference (``scheduler_service/reference.py``) is too slow for 64 x 512
batches, so these workloads are pinned by digest instead: every plan's lists (samples,
evict, pull, update_local, push_grads, write_back, pull_early), its flags and the counts.
Regenerate only for a deliberate change of the plans, with
``python -m tests.unit.test_scheduler_golden --write`` (and say why in the commit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from heraldps.plan import KEY_LISTS
from scheduler_service.batch import Batch
from scheduler_service.scheduler import Scheduler

GOLDEN = Path(__file__).with_name("scheduler_golden.json")
# The plan's lists when the digests were recorded; those added since (``push_later``) are
# empty in these workloads, which look no batch ahead, and stay out of the digest.
RECORDED_LISTS = ("samples", "evict", "pull", "update_local", "push_grads", "write_back",
                  "pull_early")  # fmt: skip

# name: (workers, samples per worker, fields, vocabulary, cache rows, batches, mode,
#        checkpoint every). Caches are small so that evictions (of dirty rows too) happen.
WORKLOADS: dict[str, tuple[int, int, int, int, int, int, str, int]] = {
    "8x32-herald": (8, 32, 26, 20_000, 900, 12, "herald", 0),
    "8x32-naive": (8, 32, 26, 20_000, 900, 12, "naive", 0),
    "8x32-pipelined-ckpt": (8, 32, 26, 20_000, 900, 12, "herald_pipelined", 4),
    "20x16-herald": (20, 16, 13, 5_000, 220, 15, "herald", 0),
    "20x16-on_demand": (20, 16, 13, 5_000, 220, 15, "on_demand", 3),
    "64x512-herald": (64, 512, 26, 2_000_000, 9_000, 6, "herald", 0),
    "64x64-location_aware": (64, 64, 26, 300_000, 1_500, 8, "location_aware", 0),
}


def batches(
    workers: int, per_worker: int, fields: int, vocab: int, count: int, seed: int
) -> list[Batch]:
    """Zipf-like keys (log-uniform rank) in ``fields`` disjoint vocabularies, and a few
    duplicate keys inside samples (the last field repeats the first in every 7th sample)."""
    rng = np.random.default_rng(seed)
    cards = np.geomspace(3, vocab, fields).astype(np.int64)
    base = np.concatenate([[0], np.cumsum(cards)[:-1]])
    samples = workers * per_worker
    out = []
    for t in range(count):
        u = rng.random((samples, fields))
        rank = np.minimum(np.floor(np.exp(u * np.log(cards + 1.0))) - 1, cards - 1)
        keys = (base + rank.astype(np.int64)) * 7919 - 10**12  # spread, some negative
        keys[::7, -1] = keys[::7, 0]
        offsets = np.arange(samples + 1, dtype=np.int64) * fields
        out.append(Batch.from_arrays(t, offsets, keys.reshape(-1), workers))
    return out


def digest(name: str) -> dict[str, object]:
    """Digest of every released plan of a workload and the scheduler's counts."""
    workers, per_worker, fields, vocab, capacity, count, mode, every = WORKLOADS[name]
    # Recorded before early write-backs existed: they stay off here (tests of their own
    # in test_scheduler.py compare them with the reference scheduler).
    scheduler = Scheduler(workers, capacity, mode, checkpoint_every=every, early_write_back=0)
    h = hashlib.sha256()
    plans = []
    for batch in batches(workers, per_worker, fields, vocab, count, seed=len(name)):
        plans += scheduler.submit(batch)
    plans += scheduler.finish()
    for plan in plans:
        h.update(np.array([plan.iteration, plan.worker, plan.checkpoint], np.int64).tobytes())
        for list_name in KEY_LISTS:
            keys = np.ascontiguousarray(getattr(plan, list_name), dtype=np.int64)
            if list_name not in RECORDED_LISTS:
                assert not keys.shape[0], (name, list_name)
                continue
            h.update(np.int64(keys.shape[0]).tobytes())
            h.update(keys.tobytes())
    counts = scheduler.counts
    return {
        "plans": h.hexdigest(),
        "pulls": counts.pulls,
        "pushes": counts.pushes,
        "evictions": counts.evictions,
        "final_flush": counts.final_flush,
        "hits": counts.hits,
        "early_pulls": counts.early_pulls,
        "local_samples": counts.local_samples,
    }


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_plans_equal_the_recorded_ones(name: str) -> None:
    recorded = json.loads(GOLDEN.read_text())[name]
    now = digest(name)
    assert now == recorded
    assert now["evictions"] > 0  # the workload exercises evictions


def main() -> None:
    parser = argparse.ArgumentParser(description="print or rewrite the recorded plan digests")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    result = {name: digest(name) for name in WORKLOADS}
    text = json.dumps(result, indent=2) + "\n"
    if args.write:
        GOLDEN.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
