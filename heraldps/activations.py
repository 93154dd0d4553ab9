"""Hidden-layer activations of the DeepFM MLP, by name (the job's ``activation``).

Each is written over an array module ``xp`` with float32 scalars only, so NumPy and
CuPy compute the same thing and nothing upcasts to float64. ``grad`` is the
derivative from the pre-activation ``z`` and the output ``a`` the forward pass kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from heraldps.errors import InvalidArgument

f32 = np.float32
LEAKY_SLOPE = f32(0.01)


def _sigmoid(xp: Any, z: Any) -> Any:
    """Stable logistic: never exponentiates a positive number."""
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, f32(1) / (f32(1) + e), e / (f32(1) + e))


@dataclass(frozen=True)
class Activation:
    name: str
    forward: Callable[[Any, Any], Any]  # (xp, z) -> a
    grad: Callable[[Any, Any, Any], Any]  # (xp, z, a) -> da/dz
    he_init: bool  # He-uniform (ReLU family) rather than Glorot-uniform initial weights


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in (
        Activation(
            "relu",
            lambda xp, z: xp.maximum(z, f32(0)),
            lambda xp, z, a: (z > 0).astype(np.float32),
            he_init=True,
        ),
        Activation(
            "leaky_relu",
            lambda xp, z: xp.where(z > 0, z, z * LEAKY_SLOPE),
            lambda xp, z, a: xp.where(z > 0, f32(1), LEAKY_SLOPE).astype(np.float32),
            he_init=True,
        ),
        Activation(
            "tanh",
            lambda xp, z: xp.tanh(z),
            lambda xp, z, a: f32(1) - a * a,
            he_init=False,
        ),
        Activation(
            "sigmoid",
            _sigmoid,
            lambda xp, z, a: a * (f32(1) - a),
            he_init=False,
        ),
    )
}


def activation_named(name: str) -> Activation:
    """The registered activation ``name``, or an error listing them."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise InvalidArgument(
            f"unknown activation {name!r}; use one of {', '.join(ACTIVATIONS)}"
        ) from None
