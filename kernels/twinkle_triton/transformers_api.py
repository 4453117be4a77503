"""The names the installed transformers gives what our model-level layers take and return.

transformers 5.24 renamed the KV cache of every decoder forward and model output from
``past_key_values`` to ``cache`` (the old name stays a deprecated keyword of the top-level
forwards). A layer kernel replaces a ``forward`` only when its parameters are named like the
original's, so :class:`~twinkle_triton.causal_lm.CausalLMFusedLoss` and
:class:`~twinkle_triton.layers.DecoderLayer` take the cache under :data:`CACHE_ARGUMENT`.

Read from the installed distribution's version rather than from its classes: importing
transformers costs seconds, and this module is imported with the kernels. A development build
of 5.24 counts as renamed. ``tests/kernels/test_transformers_api.py`` checks the choice against
the installed classes' signatures, so a release that renames again fails there first.
"""

from __future__ import annotations

import re
from importlib import metadata

__all__ = ["CACHE_ARGUMENT", "LEGACY_CACHE_ARGUMENT", "TRANSFORMERS_VERSION", "cache_renamed"]

LEGACY_CACHE_ARGUMENT = "past_key_values"
_RENAMED_IN = (5, 24)


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string (``"5.24.0.dev0"`` -> ``(5, 24, 0)``)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def _installed() -> str | None:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


TRANSFORMERS_VERSION: str | None = _installed()


def cache_renamed(version: str | None) -> bool:
    """Whether transformers ``version`` names the KV cache ``cache`` (5.24 and later).

    Example:
        >>> cache_renamed("5.23.0"), cache_renamed("5.24.0.dev0"), cache_renamed("6.1")
        (False, True, True)
    """
    return version is not None and _release(version) >= _RENAMED_IN


CACHE_ARGUMENT: str = "cache" if cache_renamed(TRANSFORMERS_VERSION) else LEGACY_CACHE_ARGUMENT
