"""The ``twinkle`` torch.compile backend: find registered layers and functions in Dynamo's FX
graphs and replace each region by one call of its kernel.

>>> compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})  # doctest: +SKIP

Importing this package is cheap: it only makes the backend name known to ``torch.compile`` (when
the installed entry point does not already). The passes are imported when the backend first
runs, and each registered function's pattern is traced then, once.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .backend_registration import install

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


class _CallableModule(types.ModuleType):
    """This package is also the one-call API: ``twinkle_fx.compile(model, ...)`` is
    :func:`twinkle_fx.compile.one_call.compile_model` (the head swap, then ``backend="twinkle"``)."""

    def __call__(self, model, **kwargs):
        from .one_call import compile_model

        return compile_model(model, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
