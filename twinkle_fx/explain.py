"""``twinkle_fx.explain``: what the ``twinkle`` backend swaps in a model, and why not elsewhere.

The command line, ``python -m twinkle_fx explain --config qwen2`` on a tiny transformers model, is in
:mod:`twinkle_fx.explain_cli`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .compile.regions import known_modules
from .compile.report import CompileReport, collect_reports

__all__ = ["explain"]


def explain(model: torch.nn.Module, *args: Any, options: Mapping[str, Any] | None = None, **kwargs: Any) -> CompileReport:
    """Compile ``model`` with ``backend="twinkle"``, call it once on ``args``/``kwargs``, return the report.

    Like ``torch._dynamo.explain``, this resets Dynamo first (so every graph is compiled, and
    reported, afresh). The mode follows the usual rule: training when grad is enabled and the
    parameters require grad; run it under ``torch.no_grad()`` to see the inference swaps.

    Args:
        model (`nn.Module`): the model (or any callable module).
        options (`dict`, *optional*): backend options; the inner compiler defaults to "eager" here
            (the rewrite does not depend on it, and explaining should be quick).

    Returns:
        :class:`~twinkle_fx.compile.report.CompileReport`; ``print(report)`` shows every candidate
        region, the kernel chosen or the reason, graph breaks, pass times and the graph diffs.

    Example:
        >>> report = twinkle_fx.explain(model, input_ids)      # doctest: +SKIP
        >>> print(report)                                     # doctest: +SKIP
    """
    merged = {"compiler": "eager", **dict(options or {})}
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="twinkle", options=merged)
    with known_modules(model), collect_reports() as report:
        compiled(*args, **kwargs)
    torch._dynamo.reset()
    return report
