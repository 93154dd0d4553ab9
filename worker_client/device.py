"""The array module a worker trains with (CuPy on a GPU, NumPy otherwise), and transfers."""

from __future__ import annotations

from typing import Any

import numpy as np

from heraldps.errors import InvalidArgument

DEVICES = ("cpu", "gpu", "auto")


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no driver, no device: CuPy raises its own runtime errors
        return False


def array_module(device: str) -> Any:
    """``numpy`` for cpu, ``cupy`` for gpu, whichever is usable for auto."""
    if device not in DEVICES:
        raise InvalidArgument(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu" or (device == "auto" and not gpu_available()):
        return np
    if not gpu_available():
        raise InvalidArgument(
            "--device gpu needs CuPy and a CUDA GPU (pip install 'heraldps[gpu]'); "
            "use --device cpu or auto"
        )
    import cupy

    return cupy
