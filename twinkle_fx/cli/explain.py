"""``twinkle-fx explain``: what the twinkle backend swaps in a tiny model of a transformers family.

Examples::

    twinkle-fx explain                        # qwen2, inference: the summary of every candidate region
    twinkle-fx explain --config llama --train # a training step (the fused-loss head is then in play)
    twinkle-fx explain --diff                 # also the FX code diff of each graph
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

from . import names
from .common import CommandError, choose_device, device_name, note, positive_int

__all__ = ["add_parser"]

# Small enough that compiling and running one step through the Triton interpreter takes seconds.
_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=128, max_position_embeddings=256)
# multi-head latent attention needs as many key/value heads as query heads
_TINY_OVERRIDES = {"deepseek_v3": dict(num_key_value_heads=4)}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``explain`` subcommand to the ``twinkle-fx`` parser."""
    parser = subparsers.add_parser(
        "explain", help="show what the twinkle backend swaps in a tiny transformers model",
        description="Compile a tiny random-weight model of a transformers family with backend='twinkle', run it "
                    "once and print the report: every candidate region, swapped with which kernel or kept and why. "
                    f"The built-in kernels cover {', '.join(names.BUILTIN_FAMILIES)}.",
        epilog=__doc__.split("Examples::", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default="qwen2", metavar="MODEL_TYPE",
                        help=f"transformers causal-LM model type (default qwen2; built-in kernels: "
                             f"{', '.join(names.BUILTIN_FAMILIES)})")
    parser.add_argument("--train", action="store_true", help="explain a training step (default: inference)")
    parser.add_argument("--seq", type=positive_int, default=8, help="sequence length (default 8)")
    parser.add_argument("--device", type=device_name, help="default: cuda if available, else cpu")
    parser.add_argument("--no-builtin", action="store_true", help="do not register the built-in twinkle_triton kernels")
    parser.add_argument("--diff", action="store_true", help="also print the FX code diff of every graph")
    # the summary used to need --summary; it is the default now, and old command lines keep working
    parser.add_argument("--summary", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(run=run)
    return parser


def causal_lm_model_types() -> list[str] | None:
    """transformers' causal-LM model types (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), read from its source
    file: importing the module imports torch (seconds), and a bad ``--config`` is answered before
    that. None when the file no longer holds the table as a literal (the caller then imports it)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" and isinstance(node.value, ast.Call)
                and len(node.value.args) == 1):
            try:
                return [name for name, _ in ast.literal_eval(node.value.args[0])]
            except (ValueError, TypeError):
                return None
    return None


def _check_model_type(name: str) -> None:
    if name in names.BUILTIN_FAMILIES:
        return
    known = causal_lm_model_types()
    if known is None:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        known = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise CommandError(f"--config {name!r} is not a transformers causal-LM model type; {hint}"
                       f"the built-in kernels cover {', '.join(names.BUILTIN_FAMILIES)} "
                       f"({len(known)} model types work, see "
                       "transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)")


def run(args: argparse.Namespace) -> int:
    """Run ``twinkle-fx explain`` with parsed ``args``; returns the exit status."""
    _check_model_type(args.config)
    # TRITON_INTERPRET=1 asks for the interpreter, which runs on host memory only: the CPU then
    device = choose_device(args.device, default_cpu=os.environ.get("TRITON_INTERPRET") == "1",
                           command="twinkle-fx explain")
    import torch

    from ..builtin import BUILTIN_MODELS

    if not args.no_builtin and args.config in BUILTIN_MODELS:
        from ..builtin import use_builtin_kernels

        # the fused-loss head only changes a training forward with labels: leave it out of inference
        use_builtin_kernels(devices=(device.type,), models=[args.config], fused_loss=args.train)
    import transformers

    from ..compiler.entry import explain

    step = "a training step" if args.train else "an inference forward"
    note(f"twinkle-fx explain: tiny random {args.config} (2 layers, hidden 64) on {device}, {step} of 2 x {args.seq} "
         "tokens")
    torch.manual_seed(0)
    try:
        model_type = BUILTIN_MODELS[args.config].model_type if args.config in BUILTIN_MODELS else args.config
        sizes = {**_TINY, **_TINY_OVERRIDES.get(args.config, {})}
        # special ids inside the tiny vocabulary: several families default to pad ids beyond it
        # (phi3 32000, glm4 151329, smollm3 128004), which nn.Embedding refuses
        config = transformers.AutoConfig.for_model(model_type, **sizes, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        model = transformers.AutoModelForCausalLM.from_config(config).to(device).train(args.train)
    except Exception as e:  # a family whose config needs more than the tiny sizes: say which and why
        raise CommandError(f"cannot build a tiny {args.config} model from {_TINY}: {type(e).__name__}: {e}") from e
    input_ids = torch.randint(0, _TINY["vocab_size"], (2, args.seq), device=device)
    note("  compiling with backend='twinkle' (Dynamo, then the rewrite; ~10-30 s on a CPU) ...")
    start = time.perf_counter()
    with torch.set_grad_enabled(args.train):
        report = explain(model, input_ids, labels=input_ids if args.train else None)
    note(f"  done in {time.perf_counter() - start:.1f} s")
    print(report if args.diff else report.summary())
    return 0
