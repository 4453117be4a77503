"""Every family of the built-in mapping, on a tiny random model, against the unswapped model:
eagerly (fp32 and bf16, training: loss, logits and every gradient) and under ``backend="twinkle"``
with ``aot_eager``; what each kernel applies to; what ``models=`` binds; the coverage table of docs/models.md."""

import contextlib
import importlib
import logging
import re
from pathlib import Path

import pytest
import torch
import twinkle_triton
from family_models import tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

import twinkle_fx
from twinkle_fx import kernelize_model, undo_kernelize
from twinkle_fx.builtin import BUILTIN_MODELS, coverage_table, use_builtin_kernels
from twinkle_fx.core.swaps import swapped_forward
from twinkle_fx.testing import record_graphs

FAMILIES = list(BUILTIN_MODELS)
# fp32: kernels round once where PyTorch rounds per op; bf16: a few bf16 roundings over 2 layers
TOLERANCE = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}


def _one_family_per_kernel_set() -> list[str]:
    """The first family of each distinct (norm, MLP, experts, rotary) kernel combination: bf16 runs
    on these only, to keep CI time small (fp32 covers every family)."""
    seen, picked = set(), []
    for name, f in BUILTIN_MODELS.items():
        key = (f.norms and f.norms[1], f.mlps and f.mlps[1], f.experts and f.experts[1], f.rotary)
        if key not in seen:
            seen.add(key)
            picked.append(name)
    return picked


EAGER_CASES = [(f, torch.float32) for f in FAMILIES] + [(f, torch.bfloat16) for f in _one_family_per_kernel_set()]


def _expected_swaps(family: str) -> set[str]:
    f = BUILTIN_MODELS[family]
    want = {f"{c.rpartition('.')[2]}->{spec[1]}" for spec in (f.norms, f.mlps, f.experts) if spec for c in spec[0]}
    return want | ({f"{f.head}->{f.head_kernel}"} if f.head else set())


def _functions(family: str) -> dict[str, str]:
    """modeling-module function -> the twinkle_triton function bound to it."""
    f = BUILTIN_MODELS[family]
    return {**({"apply_rotary_pos_emb": f.rotary} if f.rotary else {}), **dict(f.functions)}


def _step(model, ids, *, compiled=None):
    out = (model if compiled is None else compiled)(ids, labels=ids)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.loss, params, allow_unused=True)
    return out.loss.detach(), dict(zip([n for n, p in model.named_parameters() if p.requires_grad], grads))


def _assert_grads_close(got, want, dtype):
    assert got.keys() == want.keys()
    for name, g in got.items():
        if want[name] is None:
            assert g is None, name
            continue
        torch.testing.assert_close(g, want[name], **TOLERANCE[dtype], msg=lambda m: f"{name}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize(("family", "dtype"), EAGER_CASES, ids=[f"{f}-{str(d)[6:]}" for f, d in EAGER_CASES])
def test_eager_swaps_match_the_model_in_training(family, dtype, device):
    use_builtin_kernels(devices=(device,), models=(family,))
    model = tiny_model(family, dtype=dtype).train()
    ids = torch.randint(3, 128, (2, 9), device=device)
    want_loss, want_grads = _step(model, ids)
    with torch.no_grad():
        want_logits = model.eval()(ids).logits
    model.train()

    modeling = importlib.import_module(BUILTIN_MODELS[family].module)
    originals = {name: getattr(modeling, name) for name in _functions(family)}
    kernelize_model(model, mode="train", use_fallback=False)
    swapped = {f"{type(m).__name__}->{swapped_forward(m).kernel_name}" for m in model.modules() if swapped_forward(m)}
    assert swapped == _expected_swaps(family)
    for name, kernel in _functions(family).items():
        assert getattr(getattr(modeling, name), "__name__", "") == kernel, name
    loss, grads = _step(model, ids)
    torch.testing.assert_close(loss, want_loss, **TOLERANCE[dtype])
    _assert_grads_close(grads, want_grads, dtype)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, want_logits, **TOLERANCE[dtype])
    undo_kernelize(model)
    assert {name: getattr(modeling, name) for name in originals} == originals


# MoE families: transformers' default grouped_mm needs bf16 on CUDA (below)
_MOE = {"mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "ernie4_5_moe"}
# DeepSeek-V3 with rope_interleave=True (its default, and the tiny config's) calls
# apply_rotary_pos_emb_interleave instead (checked through Family.functions);
# test_deepseek_v3_plain_rotary covers rope_interleave=False.
_ROTARY_NOT_CALLED = {"deepseek_v3"}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_swaps_match_the_model(family, device):
    use_builtin_kernels(devices=(device,), models=(family,), fused_loss=False)
    model = tiny_model(family)
    if family in _MOE and torch.device(device).type == "cuda" and hasattr(model.config, "_experts_implementation"):
        # transformers' default grouped_mm needs bf16 on CUDA: Dynamo's fake run of the fp32 model fails
        # there and the experts leave the graph (H100, transformers 5.17); batched_mm traces in fp32
        model.config._experts_implementation = "batched_mm"
    ids = torch.randint(3, 128, (2, 7), device=device)
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})
    with record_graphs() as graphs:
        loss, grads = _step(model.train(), ids, compiled=compiled)
        want_loss, want_grads = _step(model, ids)
        torch.testing.assert_close(loss, want_loss, **TOLERANCE[torch.float32])
        _assert_grads_close(grads, want_grads, torch.float32)
    assert graphs.after, "nothing was compiled"
    after = "\n".join(graphs.after)
    f = BUILTIN_MODELS[family]
    for spec in (f.norms, f.mlps, f.experts):
        if spec:
            assert f"twinkle_layer_{spec[1]}" in after, f"no {spec[1]} swapped under compile"
    for name, _ in f.functions:  # the tiny DeepSeek-V3 runs apply_rotary_pos_emb_interleave only
        assert f"twinkle_func_{name}" in after, f"{name} not swapped under compile"
    if f.rotary and family not in _ROTARY_NOT_CALLED:
        # phi3, glm4, gpt_oss too: their apply_rotary_pos_emb is traced with q, k at rank 4 and cos, sin
        # at rank 3 (half width for gpt_oss), see twinkle_fx/compiler/regions/pattern_tracing.py
        assert "twinkle_func_apply_rotary_pos_emb" in after, "rotary not swapped under compile"


def test_deepseek_v3_plain_rotary(device):
    """rope_interleave=False: DeepSeek-V3 calls apply_rotary_pos_emb, swapped for the Llama kernel."""
    use_builtin_kernels(devices=(device,), models=("deepseek_v3",))
    model = tiny_model("deepseek_v3", rope_interleave=False).train()
    ids = torch.randint(3, 128, (2, 9), device=device)
    want_loss, want_grads = _step(model, ids)
    kernelize_model(model, mode="train", use_fallback=False)
    with _ops_run() as ran:
        loss, grads = _step(model, ids)
    assert "twinkle::apply_rotary_pos_emb" in ran and "twinkle::apply_rotary_pos_emb_deinterleave" not in ran
    torch.testing.assert_close(loss, want_loss, **TOLERANCE[torch.float32])
    _assert_grads_close(grads, want_grads, torch.float32)
    undo_kernelize(model)


# ----------------------------------------------------------------------------- MoE experts


@contextlib.contextmanager
def _ops_run():
    """The names of the ops dispatched inside the block (``"twinkle::silu_and_mul"``, ...)."""
    ran: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ran.add(func._schema.name)
            return func(*args, **(kwargs or {}))

    with Record():
        yield ran


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm", "eager"])
def test_experts_gate_runs_the_kernel_in_every_experts_implementation(implementation, device):
    """transformers routes the experts through config._experts_implementation; each keeps its
    routing and matmuls and gets silu_and_mul for the gate (forward and backward)."""
    use_builtin_kernels(devices=(device,), models=("qwen3_moe",), fused_loss=False, fused_experts=False)
    model = tiny_model("qwen3_moe").train()
    model.config._experts_implementation = implementation
    ids = torch.randint(3, 128, (2, 9), device=device)
    _assert_experts_kernel_trains_like_the_model(model, ids, model.model.layers[1].mlp.experts, "SwiGLUExperts",
                                                 "silu_and_mul")


@pytest.mark.parametrize(("fused_experts", "fused"), [
    (None, {"Qwen3MoeExperts", "DeepseekV3Experts", "Ernie4_5_MoeExperts"}),  # measured faster, eager and compiled
    (True, {"Qwen3MoeExperts", "DeepseekV3Experts", "Ernie4_5_MoeExperts", "MixtralExperts"}),
    (False, set()),
])
def test_the_fused_experts_go_where_they_were_measured_faster_unless_told(fused_experts, fused):
    families = ("qwen3_moe", "deepseek_v3", "ernie4_5_moe", "mixtral", "gpt_oss")
    bound = use_builtin_kernels(models=families, fused_loss=False, fused_experts=fused_experts)
    experts = {line.split(" -> ")[0]: line.split(" -> ")[1] for line in bound if "Experts ->" in line}
    assert experts.pop("GptOssExperts") == "ClampedSwiGLUExperts"
    assert {c for c, kernel in experts.items() if kernel == "FusedSwiGLUExperts"} == fused
    assert {kernel for c, kernel in experts.items() if c not in fused} <= {"SwiGLUExperts"}


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "deepseek_v3", "ernie4_5_moe"])
def test_fused_experts_train_like_the_model_where_asked_for(family, device):
    """use_builtin_kernels(fused_experts=True) binds the SiLU-gated experts to FusedSwiGLUExperts, which computes
    the experts module whole (moe_swiglu_experts forward and backward) and trains like transformers' grouped_mm;
    GPT-OSS's clamped experts keep their own kernel."""
    bound = use_builtin_kernels(devices=(device,), models=(family, "gpt_oss"), fused_loss=False, fused_experts=True)
    assert "GptOssExperts -> ClampedSwiGLUExperts" in bound
    model = tiny_model(family).train()
    experts = next(m for m in model.modules() if type(m).__name__.endswith("Experts"))
    assert f"{type(experts).__name__} -> FusedSwiGLUExperts" in bound
    model.config._experts_implementation = "grouped_mm"
    ids = torch.randint(3, 128, (2, 9), device=device)
    _assert_experts_kernel_trains_like_the_model(model, ids, experts, "FusedSwiGLUExperts", "moe_swiglu_experts")


def _assert_experts_kernel_trains_like_the_model(model, ids, experts, layer: str, op: str) -> None:
    """Kernelized, the experts module runs ``layer`` and the op ``op`` forward and backward, and a
    training step on ``ids`` gives the unswapped model's loss and gradients (fp32)."""
    want_loss, want_grads = _step(model, ids)
    kernelize_model(model, mode="train", use_fallback=False)
    assert swapped_forward(experts).kernel_name == layer
    with _ops_run() as ran:
        loss, grads = _step(model, ids)
    assert {f"twinkle::{op}", f"twinkle::{op}_backward"} <= ran
    torch.testing.assert_close(loss, want_loss, **TOLERANCE[torch.float32])
    _assert_grads_close(grads, want_grads, torch.float32)


def test_experts_kernel_states_what_it_applies_to(device):
    use_builtin_kernels(devices=(device,), models=("mixtral",), fused_loss=False)
    gelu = tiny_model("mixtral", hidden_act="gelu")
    with pytest.raises(twinkle_fx.KernelSelectionError, match="act_fn is GELUActivation.*silu\\(gate\\) \\* up"):
        kernelize_model(gelu, mode="train", use_fallback=False)
    other = tiny_model("mixtral")
    other.config._experts_implementation = "deepgemm"  # fuses the gate into its own kernel
    with pytest.raises(twinkle_fx.KernelSelectionError, match="experts implementation is 'deepgemm'"):
        kernelize_model(other, mode="inference", use_fallback=False)


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm", "eager"])
def test_gpt_oss_experts_run_the_clamped_kernel_in_every_experts_implementation(implementation, device):
    """GPT-OSS's experts keep their routing, transposed matmuls and biases and get clamped_swiglu for
    the gate (forward and backward); swiglu_limit 0.5 makes both clamps bite in the tiny model."""
    use_builtin_kernels(devices=(device,), models=("gpt_oss",), fused_loss=False)
    model = tiny_model("gpt_oss", swiglu_limit=0.5).train()
    model.config._experts_implementation = implementation
    ids = torch.randint(3, 128, (2, 9), device=device)
    experts = model.model.layers[1].mlp.experts
    with torch.no_grad():  # the clamps bite on this model's projections: gate above, up on both sides
        h = torch.randn(16, 64, device=device) @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
        assert (h[:, ::2] > 0.5).any() and (h[:, 1::2].abs() > 0.5).any()
    _assert_experts_kernel_trains_like_the_model(model, ids, experts, "ClampedSwiGLUExperts", "clamped_swiglu")


def test_gpt_oss_experts_kernel_states_what_it_applies_to(device):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    class SiluGate(GptOssExperts):  # another gate over the same interleaved layout
        def _apply_gate(self, gate_up):
            return torch.nn.functional.silu(gate_up[..., ::2]) * gate_up[..., 1::2]

    use_builtin_kernels(devices=(device,), models=("gpt_oss",), fused_loss=False)
    model = tiny_model("gpt_oss")
    model.model.layers[0].mlp.experts.__class__ = SiluGate
    with pytest.raises(twinkle_fx.KernelSelectionError, match="its _apply_gate does not compute .*limit=7.0"):
        kernelize_model(model, mode="train", use_fallback=False)
    other = tiny_model("gpt_oss")
    other.config._experts_implementation = "deepgemm"
    with pytest.raises(twinkle_fx.KernelSelectionError, match="experts implementation is 'deepgemm'"):
        kernelize_model(other, mode="inference", use_fallback=False)


def test_function_swaps_are_labelled_with_the_function_found_in_the_model(device):
    use_builtin_kernels(devices=(device,), models=("gemma", "qwen2"), fused_loss=False)
    model = tiny_model("gemma").eval()
    with torch.no_grad():
        report = twinkle_fx.explain(model, torch.randint(3, 128, (1, 6), device=device))
    text = str(report)
    assert "transformers.models.gemma.modeling_gemma.apply_rotary_pos_emb" in text
    assert "modeling_qwen2.apply_rotary_pos_emb" not in text


# ----------------------------------------------------------------------------- what a kernel applies to


@pytest.mark.slow
def test_swiglu_refuses_a_gelu_config_eagerly_and_under_compile(caplog, device):
    """A Qwen2 config with hidden_act="gelu_pytorch_tanh" keeps its MLP, with the reason."""
    use_builtin_kernels(devices=(device,), models=("qwen2",), fused_loss=False)
    model = tiny_model("qwen2", hidden_act="gelu_pytorch_tanh").eval()
    ids = torch.randint(3, 128, (1, 6), device=device)
    with torch.no_grad():
        want = model(ids).logits
    with caplog.at_level(logging.INFO, logger="twinkle_fx"):
        kernelize_model(model, mode="inference")
    assert not any(swapped_forward(m) for m in model.modules() if type(m).__name__ == "Qwen2MLP")
    assert "SwiGLUMLP does not apply to this Qwen2MLP: its act_fn is GELUTanh" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, **TOLERANCE[torch.float32])
    with pytest.raises(twinkle_fx.KernelSelectionError, match="act_fn is GELUTanh"):
        kernelize_model(model, mode="inference", use_fallback=False)
    undo_kernelize(model)

    with torch.no_grad():
        report = twinkle_fx.explain(model, ids)
    assert "SwiGLUMLP does not apply to this Qwen2MLP: its act_fn is GELUTanh" in str(report)
    with torch.no_grad():
        got = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})(ids).logits
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])


def test_geglu_follows_the_gelu_of_the_config(device):
    use_builtin_kernels(devices=(device,), models=("gemma",), fused_loss=False)
    exact = tiny_model("gemma", hidden_act="gelu")  # erf GELU: swapped with approximate="none"
    ids = torch.randint(3, 128, (1, 6), device=device)
    with torch.no_grad():
        want = exact(ids).logits
        kernelize_model(exact, mode="inference")
        assert swapped_forward(exact.model.layers[0].mlp) is not None
        torch.testing.assert_close(exact(ids).logits, want, **TOLERANCE[torch.float32])
    fast = tiny_model("gemma", hidden_act="gelu_fast")  # no kernel computes FastGELU exactly: kept
    kernelize_model(fast, mode="inference")
    assert swapped_forward(fast.model.layers[0].mlp) is None


# ----------------------------------------------------------------------------- what models= binds


def test_models_limits_every_binding_tags_included(device):
    from transformers.models.phi3.modeling_phi3 import Phi3RMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    assert Phi3RMSNorm.__dict__.get("kernel_layer_name", "RMSNorm") == "RMSNorm"  # tagged, or untagged (no kernels)
    Phi3RMSNorm.kernel_layer_name = Qwen2RMSNorm.kernel_layer_name = "RMSNorm"  # as with `kernels` installed
    bound = use_builtin_kernels(devices=(device,), models=("llama",))
    assert bound == ["LlamaRMSNorm -> RMSNorm", "LlamaMLP -> SwiGLUMLP", "LlamaForCausalLM -> CausalLMFusedLoss",
                     "transformers.models.llama.modeling_llama.apply_rotary_pos_emb -> "
                     "twinkle_triton.apply_rotary_pos_emb"]
    for family in ("qwen2", "phi3"):
        model = tiny_model(family)
        kernelize_model(model, mode="train", use_fallback=False)
        assert not any(swapped_forward(m) for m in model.modules()), family


def test_every_family_binds_only_its_own_classes(device):
    for family in FAMILIES:
        with twinkle_fx.scoped_registry(inherit=False):
            bound = use_builtin_kernels(devices=(device,), models=(family,))
        f = BUILTIN_MODELS[family]
        classes = {b.split(" -> ")[0] for b in bound}
        want = {c for spec in (f.norms, f.mlps, f.experts) if spec for c in spec[0]} | ({f.head} if f.head else set())
        want |= {f"{f.module}.apply_rotary_pos_emb"} if f.rotary else set()
        want |= {f"{f.module}.{name}" for name, _ in f.functions}
        assert classes == want, family


def test_starcoder2_layer_norm_binding_reaches_no_other_model(device):
    """torch.nn.LayerNorm is bound within StarCoder2's decoder layer and model only: another model's
    LayerNorm (and one nested deeper in a StarCoder2 model) keeps its forward."""
    bound = use_builtin_kernels(devices=(device,), models=("starcoder2",))
    assert "torch.nn.LayerNorm -> TorchLayerNorm (within Starcoder2DecoderLayer, Starcoder2Model)" in bound
    other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).to(device)
    kernelize_model(other, mode="train")
    assert swapped_forward(other[1]) is None
    model = tiny_model("starcoder2")
    model.model.layers[0].mlp.extra_norm = torch.nn.LayerNorm(64, device=device)  # parent: Starcoder2MLP
    kernelize_model(model, mode="train", use_fallback=False)
    swapped = [name for name, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm) and swapped_forward(m)]
    assert swapped == ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                       "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"]


def _kernel_calls(aot_graphs: list[str], op: str, kernel: str) -> int:
    """Calls of ``twinkle::<op>`` in AOT graphs: the custom op by name on the CPU (interpreter); on a GPU
    the op is a triton_op, traced into launches of its Triton kernel (found by name in the side table)."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    code = "\n".join(aot_graphs)
    if not twinkle_triton._library.USE_TRITON_OP:
        return code.count(f"torch.ops.twinkle.{op}.default(")
    launched = re.findall(r"triton_kernel_wrapper_functional\(kernel_idx = (\d+)", code)
    return sum(getattr(kernel_side_table.get_kernel(int(i)), "fn", None).__name__ == kernel for i in launched)


@pytest.mark.slow
def test_starcoder2_layer_norm_swapped_under_compile_as_eagerly(device):
    """The backend reads each LayerNorm's parent from Dynamo's module stack, as kernelize_model reads it
    from the module tree: the same five norms are swapped, forward and backward within fp32 tolerance;
    a LayerNorm of another model compiled under the same registrations keeps its forward."""
    from twinkle_fx.compiler import collect_reports

    use_builtin_kernels(devices=(device,), models=("starcoder2",), fused_loss=False)
    model = tiny_model("starcoder2").train()
    ids = torch.randint(3, 128, (2, 7), device=device)
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})
    with collect_reports() as report, record_graphs() as graphs:
        loss, grads = _step(model, ids, compiled=compiled)
    want_loss, want_grads = _step(model, ids)
    norms = [r for r in report.regions if r.target == "LayerNorm -> TorchLayerNorm"]
    assert all(r.swapped for r in norms), [str(r) for r in norms]
    assert sorted(r.location for r in norms) == [
        "model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"]
    # the kernel's ops are in the AOT graphs that run: five norms forward, five backward
    assert _kernel_calls(graphs.forward, "layer_norm", "_fp32_norm_fwd_kernel") == 5
    assert _kernel_calls(graphs.backward, "layer_norm_backward", "_fp32_norm_bwd_kernel") == 5
    torch.testing.assert_close(loss, want_loss, **TOLERANCE[torch.float32])
    _assert_grads_close(grads, want_grads, torch.float32)

    other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).to(device)
    x = torch.randn(3, 8, device=device)
    with collect_reports() as report:
        got = torch.compile(other, backend="twinkle", options={"compiler": "aot_eager"})(x)
    assert not any("LayerNorm" in r.target for r in report.regions), str(report)
    torch.testing.assert_close(got, other(x))


def test_limited_bindings_add_up_and_an_unlimited_one_replaces_them():
    from twinkle_fx.core.registry import get_registry
    from twinkle_fx.core.selection import select_layer_kernel

    class A(torch.nn.Module):
        pass

    class B(torch.nn.Module):
        pass

    use_builtin_kernels(devices=("cpu",), models=("starcoder2",))
    registry = get_registry()
    scope = registry.binding_scope(torch.nn.LayerNorm)
    assert [c.__name__ for c in scope] == ["Starcoder2DecoderLayer", "Starcoder2Model"]
    twinkle_fx.register_external_layer(torch.nn.LayerNorm, "TorchLayerNorm", within=(A,))
    assert registry.binding_scope(torch.nn.LayerNorm) == (*scope, A)
    select = lambda parent: select_layer_kernel(registry, torch.nn.LayerNorm, "cpu",  # noqa: E731
                                                twinkle_fx.Mode.TRAINING, parent=parent)
    assert select(A) is not None and select(B) is None and select(None) is None  # no parent: no target
    twinkle_fx.register_external_layer(torch.nn.LayerNorm, "TorchLayerNorm")
    assert registry.binding_scope(torch.nn.LayerNorm) is None and select(B) is not None and select(None) is not None


def test_limited_binding_keyword_is_checked():
    with pytest.raises(TypeError, match="pass a non-empty sequence of parent classes"):
        twinkle_fx.register_external_layer(torch.nn.LayerNorm, "TorchLayerNorm", within=torch.nn.Sequential)


def test_unknown_family_and_string_models():
    with pytest.raises(ValueError, match="Unknown model family 'gpt2'; built-in families: qwen2, llama"):
        use_builtin_kernels(models=("gpt2",))
    with pytest.raises(TypeError, match="pass a sequence"):
        use_builtin_kernels(models="llama")


def test_docs_coverage_table_is_the_mapping():
    page = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    assert coverage_table() in page, "docs/models.md's coverage table differs: paste twinkle_fx.builtin.coverage_table()"


@pytest.mark.parametrize("family", ["phi3", "deepseek_v3"])
def test_explain_cli_builds_every_family(family, capsys, device):
    """phi3, glm4 and smollm3 default to pad ids beyond the CLI's tiny vocabulary; deepseek_v3 needs
    as many key/value heads as query heads."""
    from twinkle_fx.__main__ import main

    assert main(["explain", "--config", family, "--summary", "--device", device]) == 0
    out = capsys.readouterr().out
    assert "swapped" in out and "RMSNorm" in out


_MOE_HEADS = sorted(name for name, f in BUILTIN_MODELS.items() if f.head and f.head_kernel == "MoECausalLMFusedLoss")


@pytest.mark.slow
@pytest.mark.parametrize("family", _MOE_HEADS)
@pytest.mark.parametrize("asked_by", ["config", "argument"])
def test_moe_head_adds_the_router_loss_as_the_original_does(family, asked_by, device):
    use_builtin_kernels(devices=(device,), models=(family,))
    model = tiny_model(family, output_router_logits=asked_by == "config", router_aux_loss_coef=0.5).train()
    # a class defined elsewhere, as FSDP2's and users' subclasses are: the router loss is found along the MRO
    model.__class__ = type(f"Wrapped{type(model).__name__}", (type(model),), {"__module__": __name__})
    ids = torch.randint(3, 128, (2, 9), device=device)
    ask = {} if asked_by == "config" else {"output_router_logits": True}

    def step():
        out = model(ids, labels=ids, **ask)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = dict(zip([n for n, p in model.named_parameters() if p.requires_grad],
                         torch.autograd.grad(out.loss, params, allow_unused=True)))
        return out, grads

    want, want_grads = step()
    kernelize_model(model, mode="train", use_fallback=False)
    assert swapped_forward(model).kernel_name == "MoECausalLMFusedLoss"
    got, grads = step()
    assert got.logits is None and got.aux_loss is not None and len(got.router_logits) == len(want.router_logits)
    torch.testing.assert_close(got.aux_loss, want.aux_loss, **TOLERANCE[torch.float32])
    torch.testing.assert_close(got.loss, want.loss, **TOLERANCE[torch.float32])  # the cross-entropy + 0.5 x aux
    _assert_grads_close(grads, want_grads, torch.float32)
    with torch.no_grad():  # no router loss asked for: none added, none returned
        plain = model(ids, labels=ids, output_router_logits=False)
        # shift_labels instead of labels (the original takes none): the same loss, router term included,
        # whether the fused loss (training) or the logits' loss (eval) computes it
        shift_labels = torch.nn.functional.pad(ids, (0, 1), value=-100)[..., 1:].contiguous()
        shifted = [model.train(training)(ids, shift_labels=shift_labels, **ask).loss for training in (True, False)]
    assert plain.aux_loss is None
    for loss in shifted:
        torch.testing.assert_close(loss, want.loss, **TOLERANCE[torch.float32])
