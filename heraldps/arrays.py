"""Host copies of device arrays: the one explicit device-to-host transfer every process uses."""

from __future__ import annotations

from typing import Any

import numpy as np


def to_host(array: Any) -> np.ndarray:
    """A host NumPy copy of a device array (an explicit transfer), or the NumPy array itself.

    Device arrays (CuPy's and look-alikes) refuse implicit conversion, so every
    device-to-host copy in the worker goes through here: one place to count them.
    """
    if isinstance(array, np.ndarray | np.generic):
        return np.asarray(array)
    return np.asarray(array.get())
