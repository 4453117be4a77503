"""``twinkle_fx.explain``: what the ``twinkle`` backend swaps in a model, and why not elsewhere.

Also ``python -m twinkle_fx explain --config qwen2`` on a tiny transformers model.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import torch

from .compile.regions import known_modules
from .compile.report import CompileReport, collect_reports
from .eager.kernelize import coverage_notes
from .settings import use_triton_interpreter

__all__ = ["explain", "add_parser"]


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
    report.notes = coverage_notes(model)
    return report


_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=128, max_position_embeddings=256)


def _tiny_model(family: str) -> torch.nn.Module:
    import transformers

    config = transformers.AutoConfig.for_model(family, **_TINY)
    return transformers.AutoModelForCausalLM.from_config(config)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain", help="show what the twinkle backend swaps in a tiny transformers model",
        description="Compile a tiny model of a transformers family with backend='twinkle' and print the report.",
    )
    parser.add_argument("--config", default="qwen2", help="transformers model type (qwen2, llama, mistral, qwen3, ...)")
    parser.add_argument("--train", action="store_true", help="explain a training step (default: inference)")
    parser.add_argument("--seq", type=int, default=8, help="sequence length (default 8)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--no-builtin", action="store_true", help="do not register the built-in twinkle_triton kernels")
    parser.add_argument("--summary", action="store_true", help="omit the graph diffs")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        use_triton_interpreter(command="twinkle-fx explain")
    if not args.no_builtin:
        from .builtin import use_builtin_kernels

        families = [args.config] if args.config in ("qwen2", "llama", "mistral", "qwen3") else []
        use_builtin_kernels(devices=(device.split(":")[0],), models=families)
    torch.manual_seed(0)
    model = _tiny_model(args.config).to(device).train(args.train)
    input_ids = torch.randint(0, _TINY["vocab_size"], (2, args.seq), device=device)
    with torch.set_grad_enabled(args.train):
        report = explain(model, input_ids, labels=input_ids if args.train else None)
    print(report.summary() if args.summary else report)
    return 0
