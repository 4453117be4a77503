"""The ``twinkle`` torch.compile backend: find registered layers and functions in Dynamo's FX
graphs and replace each region by one call of its kernel.

>>> compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})  # doctest: +SKIP

Importing this package is cheap: it only makes the backend name known to ``torch.compile`` (when
the installed entry point does not already). Registered functions' patterns are traced when a
graph first needs them (a nested Dynamo run inside the backend), never at registration. The
passes themselves are imported when the backend first runs.
"""

from __future__ import annotations

from typing import Any

from .hooks import install

__all__ = ["twinkle_backend", "collect_reports", "CompileReport"]

install()


def __getattr__(name: str) -> Any:
    if name == "twinkle_backend":
        from .backend import twinkle_backend

        return twinkle_backend
    if name in ("collect_reports", "CompileReport"):
        from . import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
