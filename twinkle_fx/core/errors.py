"""Exceptions raised by twinkle_fx. Each message names the culprit and says what to do."""

from __future__ import annotations

from typing import Any

__all__ = ["TwinkleError", "KernelLoadError", "KernelSelectionError", "KernelVerificationError"]


class TwinkleError(RuntimeError):
    """Base class of twinkle_fx's runtime errors (bad arguments raise ValueError / TypeError)."""


class KernelLoadError(TwinkleError):
    """A registered kernel could not be loaded (missing path, import error, offline Hub, ...)."""


class KernelSelectionError(TwinkleError):
    """No usable kernel for a target and ``use_fallback=False``."""


class KernelVerificationError(TwinkleError):
    """A kernel's output differed from the reference and ``use_fallback=False``."""


def check_flag(name: str, value: Any) -> bool:
    """``value`` if it is a bool; a TypeError naming ``name`` otherwise (``"no"`` is not False)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return value
