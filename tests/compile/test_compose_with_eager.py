"""kernelize_model first, then backend="twinkle": the fused-loss head comes from the eager swap
(the compiled root module is not a graph region), the layers it already swapped are left alone."""

import torch

from twinkle_fx import explain, kernelize_model
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.core.reasons import ReasonKind

from tiny_models import DEVICE, tiny


def test_kernelized_model_compiles_with_twinkle_and_matches():
    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))
    model = tiny("qwen2")
    input_ids = torch.randint(0, 128, (2, 12), device=DEVICE)
    reference = model(input_ids, labels=input_ids)
    reference.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    kernelize_model(model, mode="train+compile", use_fallback=False)
    report = explain(model, input_ids, labels=input_ids)
    eager = {r.target.split(" -> ")[1] for r in report.not_swapped if r.reason.kind is ReasonKind.EAGER_SWAP}
    assert {"RMSNorm", "SwiGLUMLP"} <= eager
    # the patched-in rotary kernel is itself a function named apply_rotary_pos_emb: no unmatched copy
    assert [r for r in report.not_swapped if r.kind == "function"] == [], report.summary()

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="twinkle", options={"compiler": "aot_eager"})
    out = compiled(input_ids, labels=input_ids)
    out.loss.backward()
    assert out.logits is None  # the fused linear cross-entropy never built them
    torch.testing.assert_close(out.loss, reference.loss, atol=1e-5, rtol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name], atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_a_kernel_bound_to_the_compiled_module_is_reported_not_silently_dropped():
    use_builtin_kernels(devices=(DEVICE,), models=("qwen2",))  # binds Qwen2ForCausalLM to the fused-loss head
    model = tiny("qwen2", layers=1)
    input_ids = torch.randint(0, 128, (2, 12), device=DEVICE)
    report = explain(model, input_ids, labels=input_ids)
    kept = [r for g in report.graphs for r in g.regions if not r.swapped]
    assert len(kept) == 1 and kept[0].target == "Qwen2ForCausalLM -> CausalLMFusedLoss"
    assert kept[0].reason.kind is ReasonKind.COMPILED_ROOT and kept[0].location == "<compiled module>"
