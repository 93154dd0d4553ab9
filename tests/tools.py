"""Finding the external tools that deployment tests run (promtool, kubectl, node, ...).

Locally a missing tool skips its test with a hint; CI sets
``HERALDPS_REQUIRE_TOOLS=1`` after installing them, so there a missing tool
fails the run instead of silently skipping the check.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def require_tool(name: str, hint: str) -> str:
    """Path of executable ``name``; skip (or fail under CI) with ``hint`` when absent."""
    path = shutil.which(name)
    if path:
        return path
    missing(f"{name} not found: {hint}")


def missing(message: str) -> NoReturn:
    """Skip the test for something this machine lacks; fail it where CI provides that
    (HERALDPS_REQUIRE_TOOLS=1)."""
    if os.environ.get("HERALDPS_REQUIRE_TOOLS") == "1":
        pytest.fail(message + " (HERALDPS_REQUIRE_TOOLS=1: CI must provide it)")
    pytest.skip(message)
