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


def to_host(array: Any) -> np.ndarray:
    """A host NumPy copy of a device array (an explicit transfer), or the NumPy array itself.

    Device arrays (CuPy's and look-alikes) refuse implicit conversion, so every
    device-to-host copy in the worker goes through here: one place to count them.
    """
    if isinstance(array, np.ndarray | np.generic):
        return np.asarray(array)
    return np.asarray(array.get())
