"""The topk rewrite of the graphs AOTAutograd traces: a router's top-k over its last dimension runs as
twinkle_triton.topk (one kernel) instead of torch's, with eager's results and gradients; what it does not take
stays torch's."""

import logging

import pytest
import torch
import transformers
from tiny_models import TINY, assert_the_cache_key_follows_the_sources, compiled_afresh

import twinkle_fx
from twinkle_fx.testing import record_graphs

from device_under_test import DEVICE
from dtype_tolerance import assert_close

LOGGER = "twinkle_fx.compiler.inner.topk"


def _router(x: torch.Tensor, weight: torch.Tensor, k: int = 4, **topk_arguments):
    """Qwen3-MoE's router: softmax in fp32, the top-k, renormalized, in the input's dtype."""
    probs = torch.softmax(x @ weight.t(), dim=-1, dtype=torch.float)
    values, indices = torch.topk(probs, k, **topk_arguments)
    values = values / values.sum(dim=-1, keepdim=True)
    return values.to(x.dtype), indices


def _compiled_router(compiler: str, options: dict | None = None, **topk_arguments):
    """The router compiled by the twinkle backend (the topk option on, unless ``options`` says otherwise) and run
    forward and backward beside eager: (the forward graph, (values, indices, the input's and weight's gradients)
    compiled and eager)."""
    torch.manual_seed(0)
    x = torch.randn(37, 24, device=DEVICE, requires_grad=True)
    weight = torch.randn(40, 24, device=DEVICE, requires_grad=True)
    results = []
    with record_graphs() as graphs:
        compiled = torch.compile(lambda x, w: _router(x, w, **topk_arguments), backend="twinkle",
                                 options={"compiler": compiler, "topk": True, **(options or {})})
        for run in (compiled, lambda x, w: _router(x, w, **topk_arguments)):
            values, indices = run(x, weight)
            grad = torch.arange(values.numel(), device=DEVICE).reshape(values.shape).float().sin()
            results.append((values, indices, *torch.autograd.grad(values, (x, weight), grad)))
    return (graphs.forward[0] if graphs.forward else None), results


def test_the_routers_topk_is_the_kernel_with_eagers_results_and_gradients(caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        code, (got, want) = _compiled_router("aot_eager")
    assert "torch.ops.twinkle.topk.default(" in code and "aten.topk" not in code
    assert any("1 top-k selection(s) run as twinkle_triton.topk" in r.getMessage() for r in caplog.records)
    assert torch.equal(got[1], want[1])  # random scores: no ties
    for g, w, what in zip(got, want, ("values", "indices", "grad x", "grad weight")):
        assert_close(g, w, torch.float32, what)


@pytest.mark.parametrize("topk_arguments", [{"largest": False}, {"dim": 0}])
def test_what_the_kernel_does_not_take_stays_torchs(topk_arguments):
    """The smallest values, or along another dimension (here 37 rows, k = 4 of them): aten.topk as it was."""
    code, (got, want) = _compiled_router("aot_eager", **topk_arguments)
    assert "aten.topk" in code and "twinkle.topk" not in code
    for g, w, what in zip(got, want, ("values", "indices", "grad x", "grad weight")):
        assert_close(g, w, torch.float32, what)


def test_off_by_default_and_the_registry_turns_it_off():
    """Off unless asked (among equal scores torch's kernels and this one choose different experts); asked for, not
    where the registry's rewrite is removed."""
    code, _ = _compiled_router("aot_eager", {"topk": False})
    assert "aten.topk" in code and "twinkle.topk" not in code
    torch._dynamo.reset()
    with record_graphs() as graphs:
        x = torch.randn(5, 24, device=DEVICE)
        compiled = torch.compile(_router, backend="twinkle", options={"compiler": "aot_eager"})
        compiled(x, torch.randn(40, 24, device=DEVICE))
    assert "aten.topk" in graphs.forward[0] and "twinkle.topk" not in graphs.forward[0]
    torch._dynamo.reset()
    with twinkle_fx.scoped_registry() as registry:
        registry.remove_graph_rewrite("topk")
        code, _ = _compiled_router("aot_eager")
    assert "aten.topk" in code and "twinkle.topk" not in code


def test_the_compile_caches_key_hashes_the_rewrite_and_its_kernel(tmp_path, monkeypatch):
    from twinkle_fx.compiler.inner import topk

    assert_the_cache_key_follows_the_sources(topk, "topk", tmp_path, monkeypatch)


@pytest.mark.slow
def test_a_qwen3_moe_model_under_inductor_routes_with_the_kernel(caplog):
    """A tiny Qwen3-MoE (top-2 of 8 experts a layer, two layers) compiled by Inductor: each router's top-k is the
    kernel, and the loss and every gradient are eager's."""
    from twinkle_fx.builtin import use_builtin_kernels

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("qwen3_moe", **TINY, num_experts=8, num_experts_per_tok=2,
                                               moe_intermediate_size=32)
    model = transformers.AutoModelForCausalLM.from_config(config).to(DEVICE)
    use_builtin_kernels(devices=(DEVICE,))
    ids = torch.randint(0, config.vocab_size, (2, 16), device=DEVICE)
    loss = model(ids, labels=ids).loss
    want = torch.autograd.grad(loss, list(model.parameters()))
    with caplog.at_level(logging.INFO, logger=LOGGER), compiled_afresh():
        compiled_loss = twinkle_fx.compile(model, options={"topk": True})(ids, labels=ids).loss
        got = torch.autograd.grad(compiled_loss, list(model.parameters()))
    assert any("2 top-k selection(s) run as twinkle_triton.topk" in r.getMessage() for r in caplog.records)
    assert_close(compiled_loss, loss, torch.float32, "loss")
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32, "gradient")
