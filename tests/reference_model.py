"""The exactness tests' one comparison: a cluster's model against the single-process one."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from worker_client.reference import ReferenceTrainer

TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}  # float32 summation order, never a lost update


def assert_matches_reference(
    model: dict[str, np.ndarray], reference: ReferenceTrainer, what: str, dense_state: bool = True
) -> npt.NDArray[np.int64]:
    """Embedding rows and their optimizer state, dense values (and, with ``dense_state``, the
    dense optimizer state) equal the reference's; returns the reference's row versions."""
    values, state, versions = reference.rows_of(model["keys"])
    np.testing.assert_allclose(model["values"], values, **TOLERANCE, err_msg=what)
    np.testing.assert_allclose(model["state"], state, **TOLERANCE, err_msg=what)
    np.testing.assert_allclose(model["dense_values"], reference.dense_rows, **TOLERANCE,
                               err_msg=what)  # fmt: skip
    if dense_state:
        np.testing.assert_allclose(model["dense_state"], reference.dense_state, **TOLERANCE,
                                   err_msg=what)  # fmt: skip
    return versions
