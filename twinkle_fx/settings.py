"""Process-level switches read from the environment (read at call time, so tests can set them)."""

from __future__ import annotations

import os

__all__ = ["kernels_disabled", "DISABLE_ENV"]

DISABLE_ENV = "TWINKLE_FX_DISABLE_KERNELS"


def kernels_disabled() -> bool:
    """True when ``TWINKLE_FX_DISABLE_KERNELS`` is 1/true/yes/on: every swap is skipped (logged)."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")
