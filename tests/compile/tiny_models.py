"""Tiny transformers models and the twinkle_triton kernels registered for them (CPU, interpreted)."""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import transformers

import twinkle_fx
import twinkle_triton
from twinkle_fx import register_external_layer, register_layer_kernel
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.compiler.inner.inductor_options import collect_cudagraph_status
from twinkle_fx.function import register_function_kernel
from twinkle_fx.testing import record_graphs, root_as_self

from device_under_test import DEVICE  # the GPU when there is one, else the CPU through the interpreter
from dtype_tolerance import assert_close

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=128, max_position_embeddings=64)


def tiny(family: str, *, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(family, **{**TINY, "num_hidden_layers": layers})
    return transformers.AutoModelForCausalLM.from_config(config).to(DEVICE)


def register_qwen2_kernels(device: str = DEVICE) -> None:
    """RMSNorm, Qwen2MLP and Qwen2's rotary function."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm

    register_layer_kernel(kernel_name="RMSNorm", layer=twinkle_triton.layers.RMSNorm, device=device)
    register_layer_kernel(kernel_name="SwiGLUMLP", layer=twinkle_triton.layers.SwiGLUMLP, device=device)
    register_external_layer(Qwen2MLP, "SwiGLUMLP")
    # transformers tags Qwen2RMSNorm with kernel_layer_name="RMSNorm" only when the `kernels` package
    # is installed (the GPU machine has none): bind explicitly so the graphs are the same everywhere
    register_external_layer(Qwen2RMSNorm, "RMSNorm")
    register_function_kernel(func_name="apply_rotary_pos_emb", target_module="transformers.models.qwen2.modeling_qwen2",
                             func_impl=twinkle_triton.apply_rotary_pos_emb, device=device)


def twinkle_lines(graph_code: str) -> str:
    """The lines of a graph that call twinkle kernels, without the variable bookkeeping.

    Values computed by the model's own code are renamed v0, v1, ... in order of appearance: their
    names (``hidden_states_3``) come from the modeling source and change between transformers
    versions. Kernel calls, their results and lifted parameters keep their names.
    """
    lines = [line.strip().split(";")[0] for line in root_as_self(graph_code).splitlines() if "twinkle" in line]
    names: dict[str, str] = {}

    def rename(match: re.Match) -> str:
        name = match.group(0)
        if name.startswith(("l_self_", "primals_", "twinkle", "torch")) or name in _KEEP:
            return name
        return names.setdefault(name, f"v{len(names)}")

    renamed = []
    for line in lines:
        target, _, call = line.partition(" = ")
        head, _, args = call.partition("(")
        renamed.append(f"{target} = {head}({_NAME.sub(rename, args)}")
    return "\n".join(renamed) + "\n"


_KEEP = {"None", "True", "False", "default"}
_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")  # an identifier, not the exponent of 1e-06


def eager_grads(model: torch.nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every parameter's gradient of one eager step of a causal LM on ``ids`` (labels too)."""
    model.zero_grad()
    model(ids, labels=ids).loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def input_ids(batch: int = 2, seq: int = 8) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (batch, seq), device=DEVICE)


@contextlib.contextmanager
def compiled_afresh() -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache off inside the block: every graph is compiled here, its
    post-grad rewrites run (and log), not loaded from the caches of an earlier run."""
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield


def assert_the_cache_key_follows_the_sources(rewrite, name: str, tmp_path: Path, monkeypatch) -> None:
    """Inductor's graph cache asks the post-grad pass for its uuid before compiling: the part of post-grad rewrite
    module ``rewrite`` (registry name ``name``) hashes its own source and its kernel module's (a change to either is
    a new key)."""
    from twinkle_fx.compiler.inner import post_grad

    key = rewrite._uuid()
    assert key.startswith(f"twinkle_fx.{name}:") and len(key.split(":")[1]) == 64
    kernel = tmp_path / "kernel.py"
    kernel.write_text("changed")
    monkeypatch.setattr(rewrite, "_kernel_module", lambda: type("M", (), {"__file__": str(kernel)}))
    assert rewrite._uuid() != key
    assert post_grad.with_rewrites(None, (rewrite.REWRITE,)).uuid() is not None


def fused_loss_steps(model: torch.nn.Module, compiler: str, steps: int, *, zero_grad: bool = True,
                     retain_graph: bool = False, options: dict | None = None):
    """``model`` with the built-in kernels (the fused-loss head computes the head's gradient in the forward),
    ``steps`` steps of ``twinkle_fx.compile`` on one batch: the first backward graph (aot_eager; None under
    Inductor), each parameter's gradient after them, and eager's gradients of one step."""
    use_builtin_kernels(devices=(DEVICE,))
    ids = input_ids()
    want = eager_grads(model, ids)
    model.zero_grad(set_to_none=True)
    with record_graphs() as graphs:
        compiled = twinkle_fx.compile(model, options={"compiler": compiler, **(options or {})})
        for _ in range(steps):
            if zero_grad:
                model.zero_grad(set_to_none=True)
            loss = compiled(ids, labels=ids).loss
            loss.backward(retain_graph=retain_graph)
            if retain_graph:
                loss.backward()
    return (graphs.backward[0] if graphs.backward else None), [p.grad for p in model.parameters()], want


def cuda_graph_steps_match_eager(model: torch.nn.Module, weight: Callable[[torch.nn.Module], torch.Tensor],
                                 what: str) -> None:
    """Four SGD steps of ``twinkle_fx.compile(model, mode="reduce-overhead")`` beside eager's on a copy, each on new
    tokens: ``weight(model)``'s gradient is eager's at every step (warm-up, recording, replays), and every compiled
    graph ran under CUDA graphs, none skipped. The forward's replay writes the saved tensors where the previous
    step's gradients lay: what a gradient the backward returns in a saved buffer must survive."""
    use_builtin_kernels(devices=(DEVICE,))
    reference = copy.deepcopy(model)
    compiled = twinkle_fx.compile(model, mode="reduce-overhead")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, reference)]
    with collect_cudagraph_status() as cudagraphs, compiled_afresh():
        for _ in range(4):
            ids = input_ids()
            for m, run in ((model, compiled), (reference, reference)):
                m.zero_grad(set_to_none=True)  # CUDA graphs: the previous step's gradients are graph buffers
                run(ids, labels=ids).loss.backward()
            assert_close(weight(model).grad, weight(reference).grad, torch.float32, what)
            for optimizer in optimizers:
                optimizer.step()
    assert not cudagraphs.skips and cudagraphs.graphs and all(g.used for g in cudagraphs.graphs), cudagraphs.summary()


# On a GPU the twinkle_triton ops are torch.library.triton_op: AOTAutograd traces them into launches
# of their Triton kernels (triton_kernel_wrapper_functional) that Inductor compiles itself. On the CPU
# (interpreter) they are opaque custom ops and the AOT graphs name them.
KERNELS_INLINED = twinkle_triton._library.USE_TRITON_OP


def kernels_inlined(test, aot_code: str) -> bool:
    """On a GPU, check that the AOT graph launches the Triton kernels itself and return True; on the
    CPU return False, and the caller pins the custom-op calls with assertExpectedInline."""
    if KERNELS_INLINED:
        test.assertIn("triton_kernel_wrapper_functional", aot_code)
        # the post-grad rewrites put their ops into backward graphs AOTAutograd already traced: calls there
        called = [line for line in aot_code.splitlines() if "torch.ops.twinkle." in line]
        test.assertEqual([line for line in called if not re.search(
            r"torch\.ops\.twinkle\.(embedding_grad_sums|add_embedding_grad|scale_in_place)\.", line)], [])
    return KERNELS_INLINED


def renumbered(code: str) -> str:
    """``linear_4, linear_5, mul_11`` -> ``linear_#1, linear_#2, mul_#1`` (by first appearance):
    Dynamo numbers values by how often the modeling source repeated a name, which changes between
    transformers versions; distinct values stay distinct."""
    seen: dict[str, str] = {}
    counts: dict[str, int] = {}

    def rename(match: re.Match) -> str:
        name, base = match.group(0), match.group(1)
        if name not in seen:
            counts[base] = counts.get(base, 0) + 1
            seen[name] = f"{base}_#{counts[base]}"
        return seen[name]

    return re.sub(r"\b([A-Za-z]+)_\d+\b", rename, root_as_self(code))
