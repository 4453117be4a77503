"""``twinkle_fx.explain``: what the ``twinkle`` backend swaps in a model, and why not elsewhere.

The command line, ``python -m twinkle_fx explain --config qwen2`` on a tiny transformers model, is in
:mod:`twinkle_fx.cli.explain`.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Mapping
from typing import Any

import torch

from .compile.regions.region import known_modules
from .compile.report import CompileReport, collect_reports
from .eager.plan import coverage_notes

logger = logging.getLogger(__name__)

__all__ = ["explain"]


def explain(model: torch.nn.Module, *args: Any, options: Mapping[str, Any] | None = None, **kwargs: Any) -> CompileReport:
    """Compile ``model`` with ``backend="twinkle"``, call it once on ``args``/``kwargs``, return the report.

    Dynamo is not reset: ``model.forward`` is compiled through a copy of its code object, so every
    graph is compiled (and reported) afresh while the models the caller compiled keep their compiled
    code. Only a model whose ``forward`` is no plain method (an instance attribute, e.g. a kernelized
    root) is compiled as it is after a ``torch.compiler.reset()``, with a WARNING saying so. The mode
    follows the usual rule: training when grad is enabled and the parameters require grad; run it
    under ``torch.no_grad()`` to see the inference swaps.

    Args:
        model (`nn.Module`): the model (or any callable module).
        options (`dict`, *optional*): backend options; the inner compiler defaults to "eager" here
            (the rewrite does not depend on it, and explaining should be quick).

    Returns:
        :class:`~twinkle_fx.compile.report.CompileReport`; ``print(report)`` shows every candidate
        region, the kernel chosen or the reason, graph breaks, pass times and the graph diffs.

    Examples:
        >>> # not run by the doctest test: it compiles a whole model (tests/compile/test_compile_explain.py does)
        >>> report = twinkle_fx.explain(model, input_ids)      # doctest: +SKIP
        >>> print(report)                                     # doctest: +SKIP
    """
    merged = {"compiler": "eager", **dict(options or {})}
    target = _fresh_forward(model)
    if target is None:
        logger.warning("twinkle_fx.explain: %s.forward is not a plain method, so its own compiled code cannot be "
                       "left alone: resetting Dynamo (torch.compiler.reset()) before explaining it",
                       type(model).__qualname__)
        torch.compiler.reset()
        target = model
    compiled = torch.compile(target, backend="twinkle", options=merged)
    with known_modules(model), collect_reports() as report:
        compiled(*args, **kwargs)
    report.notes = coverage_notes(model)
    return report


def _fresh_forward(model: Any) -> Any:
    """``model.forward`` bound to ``model`` through a new code object (Dynamo keeps compiled code per
    code object, so this compile neither reuses nor disturbs the caller's), or None when forward is
    not a plain method."""
    forward = getattr(model, "forward", None)
    if not isinstance(forward, types.MethodType) or not isinstance(forward.__func__, types.FunctionType):
        return None
    fn = forward.__func__
    fresh = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    fresh.__kwdefaults__ = fn.__kwdefaults__
    fresh.__dict__.update(fn.__dict__)
    return types.MethodType(fresh, forward.__self__)

