"""Where the NumPy DeepFM's step time goes, beside PyTorch's forward + backward of the same shape.

Run from the repository root (needs the ``torch`` extra for the comparison)::

    nice -n 10 python benchmarks/profile_model.py               # BARS shape, batch 1024 and 4096
    nice -n 10 python benchmarks/profile_model.py --batches 4096 --repeats 5

Times ``DeepFM.forward_backward`` (heraldps/model.py: what a worker runs per step) on
Frappe-like batches in BARS's shape (10 fields, dim 10, 400-400-400 ReLU, dropout 0.2; no
batch norm, which heraldps/model.py does not have yet) against PyTorch's forward + backward
of the same model (benchmarks/torch_deepfm.py without batch norm: gather, loss, backward; no
optimizer step on either side), alternating, medians of the process's CPU time (all
threads: the machine is shared, so wall time measures the neighbours). NumPy and torch each use
the threads their BLAS is given (``--threads``, default 2: the machine's cores). Then splits
the NumPy step into its operations, each timed alone on the step's own arrays: the gather
of the field embeddings, the forward matmuls, activation and dropout, the backward matmuls,
the elementwise rest and the embedding gradient's scatter-add (``np.add.at``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from heraldps.dropout import dropout_mask
from heraldps.model import DeepFM, ModelConfig, scatter_add

FIELDS, DIM, HIDDEN, DROPOUT = 10, 10, (400, 400, 400), 0.2


def batch_arrays(batch: int, seed: int = 0) -> dict[str, Any]:
    """A Frappe-like batch: per field a skewed draw over its rows; the unique rows as ``emb``."""
    rng = np.random.default_rng(seed)
    sizes = [957, 4082, 7, 7, 2, 3, 2, 9, 80, 233]  # Frappe's distinct values per field
    offsets = np.cumsum([0, *sizes[:-1]])
    global_rows = np.stack(
        [o + rng.zipf(1.5, size=batch) % s for o, s in zip(offsets, sizes, strict=True)], axis=1
    )
    unique, inverse = np.unique(global_rows, return_inverse=True)
    emb = rng.normal(0, 0.01, size=(unique.size, DIM)).astype(np.float32)
    return {
        "emb": emb,
        "field_rows": inverse.reshape(batch, FIELDS).astype(np.int64),
        "dense_x": np.zeros((batch, 0), np.float32),
        "labels": (rng.random(batch) < 0.33).astype(np.float32),
        "sample_ids": np.arange(batch, dtype=np.int64),
    }


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU time of the process (every thread's: BLAS and torch use several) per call:
    on a shared machine, the time other processes take the cores does not count."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def profile_step(fn: Callable[[], object], repeats: int, top: int = 12) -> None:
    """cProfile of the NumPy step: the model's Python functions by own time (a matmul or
    ufunc written inline counts to the function that runs it)."""
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(repeats):
        fn()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    print("\n".join("    " + line for line in lines[start : start + top + 1]))


def numpy_step(model: DeepFM, params: np.ndarray, a: dict[str, Any]) -> Callable[[], object]:
    return lambda: model.forward_backward(
        params, a["emb"], a["field_rows"], a["dense_x"], a["labels"], a["labels"].size,
        a["sample_ids"],
    )  # fmt: skip


def torch_step(a: dict[str, Any]) -> Callable[[], object]:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch_deepfm

    cfg = torch_deepfm.TorchConfig(batch_norm=False, dropout=DROPOUT, hidden=HIDDEN)
    model = torch_deepfm.TorchDeepFM(a["emb"].shape[0], FIELDS, 0, cfg).train()
    model.embedding.data = torch.from_numpy(a["emb"].copy())
    rows = torch.from_numpy(a["field_rows"])
    dense = torch.from_numpy(a["dense_x"])
    labels = torch.from_numpy(a["labels"])

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(rows, dense)
        torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).backward()

    return step


def operations(
    model: DeepFM, params: np.ndarray, a: dict[str, Any]
) -> dict[str, Callable[[], object]]:
    """Each operation of one NumPy step, on arrays of the step's shapes."""
    p = model.unpack(params)
    B = a["labels"].size
    emb, rows = a["emb"], a["field_rows"]
    x = emb[rows]
    h0 = x.reshape(B, FIELDS * DIM)
    hs, zs = [h0], []
    for W, b in p.layers[:-1]:
        zs.append(hs[-1] @ W + b)
        hs.append(np.maximum(zs[-1], 0))
    dh = np.ones((B, 400), np.float32)
    dx = np.ones((B * FIELDS, DIM), np.float32)
    layers = p.layers

    def forward_matmuls() -> None:
        for (W, b), h in zip(layers, hs, strict=True):
            _ = h @ W + b

    def backward_matmuls() -> None:
        for (W, _b), h in zip(layers[1:-1], hs[1:-1], strict=True):
            _ = h.T @ dh
            _ = dh @ W.T
        _ = h0.T @ dh
        _ = dh @ layers[0][0].T

    def activation() -> None:
        for z in zs:
            h = np.maximum(z, np.float32(0))
            _ = np.where(z > 0, np.float32(1), np.float32(0)) * h

    def dropout() -> None:
        for layer in range(len(zs)):
            mask = dropout_mask(np, DROPOUT, 0, layer, a["sample_ids"], 400)
            _ = hs[layer + 1] * mask * dh

    def fm_and_rest() -> None:
        s = x.sum(axis=1)
        _ = np.float32(0.5) * (s * s - (x * x).sum(axis=1)).sum(axis=1)
        _ = (s[:, None, :] - x) * np.float32(0.5)

    def embedding_grad() -> None:
        out = np.zeros(emb.shape, np.float32)
        scatter_add(np, out, rows.reshape(-1), dx)

    return {
        "gather emb[rows]": lambda: emb[rows] * np.ones((B, FIELDS, 1), np.float32),
        "forward matmuls": forward_matmuls,
        "activation fwd+grad": activation,
        "dropout masks": dropout,
        "FM and elementwise": fm_and_rest,
        "backward matmuls": backward_matmuls,
        "scatter-add (emb grad)": embedding_grad,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-torch", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; BARS shape: {FIELDS} fields, dim {DIM}, "
          f"hidden {'-'.join(map(str, HIDDEN))} relu, dropout {DROPOUT}")  # fmt: skip
    if not args.skip_torch:
        import torch

        torch.set_num_threads(args.threads)
    config = ModelConfig(FIELDS, 0, DIM, HIDDEN, seed=0, activation="relu", dropout=DROPOUT)
    model = DeepFM(config)
    params = model.init_dense()
    for batch in args.batches:
        a = batch_arrays(batch)
        np_step = numpy_step(model, params, a)
        np_step()  # warm: the dropout kernel compiles on first use
        steps = {"numpy": np_step}
        if not args.skip_torch:
            steps["torch"] = torch_step(a)
            steps["torch"]()
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(args.repeats):  # alternate, so load changes hit both
            for name, fn in steps.items():
                times[name].append(median_seconds(fn, 1))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"\nbatch {batch} ({a['emb'].shape[0]} unique rows): forward+backward")
        for name, sec in med.items():
            print(f"  {name:6s} {sec * 1e3:8.1f} CPU ms  {batch / sec:10,.0f} samples per CPU s")
        if "torch" in med:
            print(f"  numpy / torch time: {med['numpy'] / med['torch']:.2f}x")
        total = 0.0
        for name, fn in operations(model, params, a).items():
            sec = median_seconds(fn, args.repeats)
            total += sec
            print(f"    {name:24s} {sec * 1e3:8.2f} CPU ms  {100 * sec / med['numpy']:5.1f}%")
        print(f"    {'sum of the parts':24s} {total * 1e3:8.2f} CPU ms")
        print(f"  cProfile of {args.repeats} NumPy steps (CPU seconds):")
        profile_step(np_step, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
