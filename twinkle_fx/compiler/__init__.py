"""The ``twinkle`` torch.compile backend: find registered layers and functions in Dynamo's FX
graphs and replace each region by one call of its kernel.

>>> compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})  # doctest: +SKIP

The package by stage: the public ways in (:mod:`.entry`: ``twinkle_fx.compile``, :func:`compile_layers`,
``twinkle_fx.explain``), the backend and its options (:mod:`.backend`, :mod:`.options`), the passes over
one graph (:mod:`.pipeline`, :mod:`.passes`) and the region machinery they share (:mod:`.regions`), what
is read from Dynamo's graphs (:mod:`.graph`), what is changed about the inner compiler (:mod:`.inner`),
and the reports (:mod:`.report`).

Importing this package is cheap: it only makes the backend name known to ``torch.compile`` (when
the installed entry point does not already). The passes are imported when the backend first
runs, and each registered function's pattern is traced then, once.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

__all__ = ["twinkle_backend", "collect_reports", "CompileReport", "compile_layers", "repeated_layers"]

BACKEND_NAME = "twinkle"
# what the package's entry point names (pyproject.toml); an install made from an older tree may name another
_ENTRY_POINT = f"{__name__}.backend:twinkle_backend"


def _register_backend_name() -> None:
    # With the package installed, torch.compile finds the backend through the entry point and
    # registers it itself; registering here too would make its lookup fail on a duplicate name.
    installed = [ep.value for ep in entry_points(group="torch_dynamo_backends").select(name=BACKEND_NAME)]
    if _ENTRY_POINT in installed:
        return
    from ..core.torch_internals import dynamo_backend_names, register_dynamo_backend

    # an entry point naming another module (an install older than this tree) would fail to load: the
    # function registered here is what torch's lookup takes first
    if installed or BACKEND_NAME not in dynamo_backend_names():
        from .backend import twinkle_backend

        register_dynamo_backend(BACKEND_NAME, twinkle_backend)


_register_backend_name()


def __getattr__(name: str) -> Any:
    if name == "twinkle_backend":
        from .backend import twinkle_backend

        return twinkle_backend
    if name in ("collect_reports", "CompileReport"):
        from . import report

        return getattr(report, name)
    if name in ("compile_layers", "repeated_layers"):
        from . import entry

        return getattr(entry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
