"""Both paths admit the same modules for the same reasons (one rule: ``twinkle_fx.core.admission``).

The eager side is ``kernelize_model``'s plan, the compile side the layer pass as ``twinkle_fx.explain``
reports it; each over a tiny model of every built-in family, and over a Qwen2 model whose
registrations refuse modules for each reason the rule gives, both in the mode the backend compiled
in. A region the compile path admitted can still be kept later (binding, the kernel's trial run): it
counts as admitted here. The kernels declare ``can_torch_compile``: a kernel that cannot be compiled
is the paths' one intended difference (the backend wraps it opaquely, ``kernelize_model`` in a
compile mode refuses it).
"""

from __future__ import annotations

import pytest
import torch
from family_models import tiny_model
from transformers.models.qwen2 import modeling_qwen2

import twinkle_fx
from twinkle_fx import register_external_layer, register_layer_kernel
from twinkle_fx.builtin import BUILTIN_MODELS, use_builtin_kernels
from twinkle_fx.core.modes import parse_mode
from twinkle_fx.core.reasons import ReasonKind
from twinkle_fx.eager.plan import plan_layers

# what the admission rule answers; any other reason of the layer pass comes after it
ADMISSION = {ReasonKind.NO_KERNEL, ReasonKind.SIGNATURE, ReasonKind.DOES_NOT_APPLY, ReasonKind.EAGER_SWAP,
             ReasonKind.FOREIGN_FORWARD}
ADMITTED = "admitted"


def _compiled(model: torch.nn.Module, device: str) -> tuple[dict[str, object], str]:
    """Module path -> the compile path's answer, and the mode it compiled in."""
    with torch.no_grad():
        report = twinkle_fx.explain(model, torch.randint(3, 128, (1, 6), device=device))
    answers: dict[str, object] = {}
    for graph in report.graphs:
        for region in graph.regions:
            if region.kind != "layer" or region.location == "<compiled module>":  # the root is no region
                continue
            assert region.reason is None or region.reason.kind is not ReasonKind.INSTANCE_NOT_FOUND, region
            kept = region.reason is not None and region.reason.kind in ADMISSION
            answers[region.location] = (region.reason.kind, str(region.reason)) if kept else ADMITTED
    (mode,) = {graph.mode for graph in report.graphs}
    return answers, mode


def _eager(model: torch.nn.Module, device: str, mode: str) -> dict[str, object]:
    """Module path -> ``kernelize_model``'s answer in ``mode``, the compiled root left out."""
    plan = plan_layers(model, device, parse_mode(mode))
    answers: dict[str, object] = {swap.path: ADMITTED for swap in plan.swaps}
    answers.update({path: (reason.kind, str(reason)) for path, reason in plan.kept.items()})
    answers.pop("", None)
    return answers


def _assert_same(model: torch.nn.Module, device: str) -> dict[str, object]:
    compiled, mode = _compiled(model, device)
    eager = _eager(model, device, mode)
    only = {"eager": sorted(eager.keys() - compiled.keys()), "compile": sorted(compiled.keys() - eager.keys())}
    assert not only["eager"] and not only["compile"], f"candidates of one path only: {only}"
    differ = {path: (eager[path], compiled[path]) for path in eager if eager[path] != compiled[path]}
    assert not differ, f"(eager, compile) answers that differ: {differ}"
    return eager


@pytest.mark.parametrize("family", list(BUILTIN_MODELS))
def test_both_paths_admit_the_same_modules_of_every_family(family, device):
    use_builtin_kernels(devices=(device,), models=(family,))
    answers = _assert_same(tiny_model(family).eval(), device)
    assert answers and ADMITTED in answers.values(), answers  # the family's layers are candidates at all


class _AttentionOfOtherArguments(torch.nn.Module):
    can_torch_compile = True

    def forward(self, hidden_states, attention_mask):
        return hidden_states


class _Rotary(torch.nn.Module):
    can_torch_compile = True

    def forward(self, x, position_ids):
        return x


def test_both_paths_keep_the_same_modules_for_the_same_reasons(device):
    use_builtin_kernels(devices=(device,), models=("qwen2",))
    # SIGNATURE: a kernel whose forward takes other arguments than the layer's
    register_layer_kernel(kernel_name="Attention", layer=_AttentionOfOtherArguments, device=device)
    register_external_layer(modeling_qwen2.Qwen2Attention, "Attention")
    # NO_KERNEL: registered for another device only
    register_layer_kernel(kernel_name="Rotary", layer=_Rotary, device="cuda" if device == "cpu" else "cpu")
    register_external_layer(modeling_qwen2.Qwen2RotaryEmbedding, "Rotary")
    # no candidate on either path: a binding limited to parents the module does not have
    register_external_layer(torch.nn.Embedding, "Rotary", within=(modeling_qwen2.Qwen2DecoderLayer,))
    # DOES_NOT_APPLY: SwiGLUMLP applies to SiLU MLPs only
    model = tiny_model("qwen2", hidden_act="gelu_pytorch_tanh").eval()

    answers = _assert_same(model, device)
    kinds = {path: answer[0] for path, answer in answers.items() if answer != ADMITTED}
    assert kinds == {"model.rotary_emb": ReasonKind.NO_KERNEL,
                     **{f"model.layers.{i}.self_attn": ReasonKind.SIGNATURE for i in range(2)},
                     **{f"model.layers.{i}.mlp": ReasonKind.DOES_NOT_APPLY for i in range(2)}}, answers
    assert "model.embed_tokens" not in answers
